"""The fast lookahead pass (split attention over the untouched cache) against an independent reference:
eager attention with ``output_attentions`` over a copy of the cache, reduced by hand."""

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import attached, prompt
from transformers import DynamicCache

from lkvcli.attention import attend_over, split_attention
from lkvcli.lookahead import left_pad

ARCHS = ["llama", "qwen3", "gemma3"]  # gemma3: sliding window 8 on two of its three layers, prompts longer


def eager_scores(adapter, cache, attention_mask=None, rows="mean", group="mean"):
    """Reference: the lookahead tokens through eager attention over a deep copy of ``cache`` (which grows);
    every layer's returned attention mapped to prompt slots, group-mean (or max), query-mean (or max),
    renormalised."""
    model = adapter.base_model
    past = cache.get_seq_length()
    batch, n = cache.layers[0].keys.shape[0], adapter.config.num_tokens
    steps = torch.arange(n)
    if attention_mask is None:
        positions, mask = (past + steps).expand(batch, n), None
    else:
        positions = attention_mask.sum(-1, keepdim=True) + steps
        mask = torch.cat([attention_mask, attention_mask.new_ones(batch, n)], dim=-1)
    model.set_attn_implementation("eager")
    try:
        with adapter.lora_on():
            out = model.get_decoder()(inputs_embeds=adapter.embeddings.expand(batch, n, -1), attention_mask=mask,
                                      position_ids=positions, cache=copy.deepcopy(cache), use_cache=True,
                                      output_attentions=True)
    finally:
        model.set_attn_implementation("lkv_sdpa")
    kv = model.config.num_key_value_heads
    layers = []
    for attn in out.attentions:  # (batch, heads, n, keys); key index 0 sits at slot past + n - keys
        keys = attn.shape[-1]
        per_head = attn.reshape(batch, kv, -1, n, keys)
        grouped = per_head.mean(2) if group == "mean" else per_head.amax(2)
        mean = grouped.mean(2) if rows == "mean" else grouped.amax(2)
        full = F.pad(mean, (past + n - keys, 0))[..., :past]
        layers.append(full / full.sum(-1, keepdim=True))
    return torch.stack(layers, dim=1)


def state(cache):
    return [(layer.keys, layer.values, dict(vars(layer))) for layer in cache.layers], dict(vars(cache))


def assert_untouched(cache, before):
    layers, attrs = state(cache)
    assert attrs.keys() == before[1].keys()  # no leftover instance attribute (the update override)
    for (k, v, d), (k0, v0, d0) in zip(layers, before[0]):
        assert k is k0 and v is v0 and d.keys() == d0.keys()
        assert all(d[a] is d0[a] or d[a] == d0[a] for a in d if not torch.is_tensor(d[a]))


@pytest.mark.parametrize("arch", ARCHS)
def test_scores_and_gradients_equal_eager_reference(arch):
    """Left-padded batch under grad: scores within 1e-6, gradients of embeddings and LoRA within 1e-5
    (relative to the largest entry),
    and the cache left exactly as found."""
    adapter = attached(arch)
    ids, mask = left_pad([prompt(n, seed=n)[0] for n in (9, 21, 14)])
    cache = adapter.prefill(ids, mask)
    before = state(cache)
    weights = torch.rand(3, adapter.base_model.config.num_hidden_layers,
                         adapter.base_model.config.num_key_value_heads, ids.shape[1],
                         generator=torch.Generator().manual_seed(3))
    grads = []
    for fn in (lambda: adapter.score(cache, attention_mask=mask), lambda: eager_scores(adapter, cache, mask)):
        for _, p in adapter.named_parameters():
            p.grad = None
        scores = fn()
        (scores * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in adapter.named_parameters() if p.grad is not None})
        if len(grads) == 1:
            fast = scores.detach()
            assert_untouched(cache, before)
    ref = scores.detach() * mask[:, None, None, :]  # pad columns: 0 in both (the reference renormalises after)
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=0)
    assert grads[0].keys() == grads[1].keys() and any("lora_A" in n for n in grads[0])
    for name in grads[0]:  # float32 sums of many terms: the tolerance scales with the largest entry
        scale = max(1.0, float(grads[1][name].abs().max()))
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("arch", ARCHS)
def test_inference_scores_equal_eager_reference_and_cache_kept(arch):
    adapter = attached(arch)
    ids = prompt(20, batch=2)
    with torch.inference_mode():
        cache = adapter.prefill(ids)
        before = state(cache)
        fast = adapter.score(cache)
        assert_untouched(cache, before)
        ref = eager_scores(adapter, cache)
        assert cache.get_seq_length() == 20
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("rows, group", [("max", "mean"), ("mean", "max")])
def test_max_reductions_equal_eager_reference(arch, rows, group):
    """The max over the N lookahead queries (``query_reduction``) or over each KV group's query heads
    (``lookahead.reduction: max``, for targets collected with ``--reduction max``) against eager attention
    reduced by hand, and a different score from the mean's."""
    adapter = attached(arch)
    assert adapter.base_model.config.num_attention_heads > adapter.base_model.config.num_key_value_heads
    ids, mask = left_pad([prompt(n, seed=n)[0] for n in (12, 19)])
    with torch.inference_mode():
        cache = adapter.prefill(ids, mask)
        mean = adapter.score(cache, attention_mask=mask)
        adapter.config.reduction = group
        fast = adapter.score(cache, attention_mask=mask, query_reduction=rows)
        ref = eager_scores(adapter, cache, mask, rows=rows, group=group) * mask[:, None, None, :]
    torch.testing.assert_close(fast, ref, atol=1e-6, rtol=0)
    assert (fast - mean).abs().max() > 1e-3


@pytest.mark.parametrize("mask_kind", ["none", "bool", "per-head", "float"])
def test_split_attention_equals_sdpa_over_concatenated_keys(mask_kind):
    """Output of the split path == SDPA over past + new keys, for every mask form the attention sees."""
    gen = torch.Generator().manual_seed(0)
    b, kv, g, n, past, d = 2, 2, 3, 5, 17, 8
    q = torch.randn(b, kv * g, n, d, generator=gen)
    k, v = torch.randn(b, kv, past + n, d, generator=gen), torch.randn(b, kv, past + n, d, generator=gen)
    slots = torch.arange(past + n)
    allowed = (slots[None, :] <= (past + torch.arange(n))[:, None]).expand(b, 1, n, past + n).clone()
    allowed[0, :, :, :4] = False  # a left-padded row
    mask = {"none": None, "bool": allowed, "per-head": allowed.expand(b, kv * g, n, past + n).clone(),
            "float": torch.zeros(b, 1, n, past + n).masked_fill(~allowed, float("-inf"))}[mask_kind]
    module = torch.nn.Module()
    module.layer_idx = 0
    out, _ = split_attention(module, q, k[:, :, :past], v[:, :, :past], k[:, :, past:], v[:, :, past:], mask)
    sdpa_mask = allowed if mask is not None else slots[None, :] <= (past + torch.arange(n))[:, None]
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), attn_mask=sdpa_mask)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=1e-5)


def test_attend_over_refuses_other_caches_and_nesting():
    adapter = attached("llama")
    cache = adapter.prefill(prompt(6))
    with attend_over(cache), pytest.raises(RuntimeError, match="nest"):
        with attend_over(cache):
            pass
    assert "update" not in vars(cache)
    with pytest.raises(TypeError, match="DynamicCache"):
        with attend_over(DynamicCache(config=adapter.base_model.config)):
            pass
