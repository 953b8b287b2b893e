"""The lookahead module: prompt untouched by the adapter, scores, aLoRA equivalence, batching, save/load."""

import pytest
import torch
from helpers import attached, prompt
from tiny_models import ARCHS, tiny_model
from transformers import DynamicCache

from lkvcli.adapter_folder import read_adapter, save_adapter
from lkvcli.adapters import attach
from lkvcli.errors import LkvError
from lkvcli.lookahead import (
    LookaheadAdapter,
    LookaheadConfig,
    alora_twin,
    left_pad,
    resolve_target_modules,
    single_pass_scores,
    unpad_scores,
)

N = 4  # helpers.attached's default number of lookahead tokens


def full_forward(model, ids):
    return model(input_ids=ids, cache=DynamicCache(config=model.config), use_cache=True, output_hidden_states=True)


def same_cache(a, b) -> bool:
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_is_bit_identical_to_base_model(arch):
    """Prompt hidden states, logits and KV cache with the adapter present == the frozen base model's,
    before and after scoring (gemma3: prompt longer than its sliding window of 8)."""
    ids = prompt(20)
    ref = full_forward(tiny_model(arch), ids)
    adapter = attached(arch)
    got = full_forward(adapter.base_model, ids)
    assert torch.equal(ref.logits, got.logits)
    assert all(torch.equal(a, b) for a, b in zip(ref.hidden_states, got.hidden_states))
    assert same_cache(ref.cache, got.cache)

    cache = adapter.prefill(ids)
    assert same_cache(ref.cache, cache)
    lengths = [getattr(layer, "cumulative_length", None) for layer in cache.layers]
    with torch.no_grad():
        first = adapter.score(cache)
        again = adapter.score(cache)
    assert same_cache(ref.cache, cache) and cache.get_seq_length() == 20
    assert lengths == [getattr(layer, "cumulative_length", None) for layer in cache.layers]
    assert torch.equal(first, again)
    # decoding continues from the scored cache exactly as from the base model's
    step = dict(input_ids=ids[:, -1:], position_ids=torch.tensor([[20]]), use_cache=True)
    assert torch.equal(adapter.base_model(cache=cache, **step).logits, tiny_model(arch)(cache=ref.cache, **step).logits)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_scores_are_distributions_and_differentiable(arch):
    adapter = attached(arch)
    model = adapter.base_model
    ids = prompt(15, batch=2)
    scores = adapter.predict(ids)
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    assert scores.shape == (2, layers, kv, 15) and scores.dtype == torch.float32
    assert (scores >= 0).all()
    torch.testing.assert_close(scores.sum(-1), torch.ones(2, layers, kv))
    (scores[..., :3].sum()).backward()
    grads = dict((n, p.grad) for n, p in adapter.named_parameters())
    assert grads["embeddings"].abs().sum() > 0
    assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if "lora_A" in n)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_two_stage_equals_single_pass_alora(arch):
    """Two-stage scores (plain LoRA over the cached prompt) == peft aLoRA over prompt + lookahead in one
    pass with offsets. Without offsets (inputs_embeds) peft silently runs no adapter at all: the trap."""
    adapter = attached(arch)
    twin = alora_twin(tiny_model(arch), adapter)
    ids = prompt(20, batch=2)
    with torch.no_grad():
        ours = adapter.predict(ids)
        single = single_pass_scores(twin, adapter.embeddings, ids)
        with pytest.warns(UserWarning, match="aLoRA offsets"):
            trap = single_pass_scores(twin, adapter.embeddings, ids, offsets=False)
        with adapter.lora_on():  # what "no adapter" would give: embeddings only
            for name, p in adapter.named_parameters():
                if "lora_B" in name:
                    p.zero_()
        no_lora = adapter.predict(ids)
    torch.testing.assert_close(single, ours, atol=1e-6, rtol=1e-5)
    assert (trap - ours).abs().max() > 1e-3
    torch.testing.assert_close(trap, no_lora, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_left_padded_batch_equals_per_example(arch):
    adapter = attached(arch)
    seqs = [prompt(n, seed=n)[0] for n in (7, 19, 12)]
    ids, mask = left_pad(seqs)
    assert mask.tolist()[0] == [0] * 12 + [1] * 7
    with torch.no_grad():
        batched = unpad_scores(adapter.predict(ids, mask), mask)
        for seq, got in zip(seqs, batched):
            torch.testing.assert_close(got, adapter.predict(seq[None])[0], atol=1e-5, rtol=1e-4)


def test_save_and_load_round_trip(tmp_path):
    adapter = attached("qwen2")
    save_adapter(adapter, tmp_path / "adapter", {"note": "x"})
    loaded = attach(tiny_model("qwen2"), read_adapter(tmp_path / "adapter"))
    assert read_adapter(tmp_path / "adapter").meta["note"] == "x"
    assert loaded.config.target_modules == adapter.config.target_modules
    ids = prompt(12)
    with torch.no_grad():
        assert torch.equal(loaded.predict(ids), adapter.predict(ids))
    lora, emb = loaded.state_dict_parts()
    assert emb.shape == (N, 32) and all("lora_" in k for k in lora)


def test_target_modules_and_init():
    model = tiny_model("llama")
    assert resolve_target_modules(model, "all-linear") == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert resolve_target_modules(model, "q_proj,v_proj") == ["q_proj", "v_proj"]
    with pytest.raises(LkvError, match="lookahead.target_modules: wq"):
        resolve_target_modules(model, ["wq"])
    with pytest.raises(LkvError, match="lookahead.init"):
        LookaheadConfig(init="zeros").validate()
    mean = LookaheadAdapter.attach(model, LookaheadConfig(num_tokens=8)).embeddings.detach()
    assert mean.shape == (8, 32) and (mean - mean.mean(0)).abs().max() < 0.1  # mean + small noise
    rand = LookaheadAdapter.attach(tiny_model("llama"), LookaheadConfig(num_tokens=8, init="random")).embeddings
    assert rand.detach().std() > 5 * (mean - mean.mean(0)).std()
