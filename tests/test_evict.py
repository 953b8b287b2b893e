"""Eviction runtime: kept sets, physical shrinking, positions and masks after eviction, padding."""

import pytest
import torch
from tiny_models import tiny_model

from lkvcli.errors import LkvError
from lkvcli.evict import cache_bytes, compress, evict, feed, keep_indices, parse_budget, resolve_budget
from lkvcli.generate import greedy_decode, prefill
from lkvcli.scorers import get_scorer, prepare


def test_kept_entries_are_the_top_scores():
    torch.manual_seed(0)
    scores = torch.rand(2, 3, 2, 50)
    kept = keep_indices(scores, [10, 10, 10])
    for layer, idx in enumerate(kept):
        ref = scores[:, layer].topk(10, dim=-1).indices.sort(-1).values
        assert torch.equal(idx, ref)


def test_protected_positions_win_sinks_first():
    scores = torch.zeros(1, 1, 1, 20)
    scores[..., 5:9] = 1.0
    kept = keep_indices(scores, [8], sink_tokens=2, recent_window=3)[0][0, 0].tolist()
    assert kept[:2] == [0, 1] and kept[-3:] == [17, 18, 19] and set(kept[2:5]) <= {5, 6, 7, 8}
    tight = keep_indices(scores, [4], sink_tokens=2, recent_window=3)[0][0, 0].tolist()
    assert tight == [0, 1, 18, 19]  # over budget: sinks, then the most recent
    assert keep_indices(scores, [20])[0] is None  # budget >= L keeps everything


def test_budgets_parse_and_resolve():
    assert parse_budget("128") == 128 and parse_budget("0.1") == 0.1 and parse_budget("1.0") == 1.0
    assert resolve_budget(0.1, 1000) == 100 and resolve_budget(128, 100) == 100 and resolve_budget(1.0, 77) == 77
    for bad in ("0", "-3", "abc", "12.5"):
        with pytest.raises(LkvError):
            parse_budget(bad)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_cache_physically_shrinks_and_prefill_cache_is_untouched(arch):
    model = tiny_model(arch)
    ids = torch.randint(0, 100, (1, 30))
    state = prefill(model, ids)
    originals = [layer.keys.clone() for layer in state.cache.layers]
    scores = torch.rand(1, len(originals), model.config.num_key_value_heads, 30)
    kept = keep_indices(scores, [6] * len(originals))
    ev = evict(state.cache, kept)
    for layer, new, old, idx in zip(state.cache.layers, ev.cache.layers, originals, kept):
        assert torch.equal(layer.keys, old)
        if layer.is_sliding:  # sliding layers are never evicted
            assert torch.equal(new.keys, old)
            continue
        assert new.keys.shape == (1, old.shape[1], 6, old.shape[-1]) and new.values.shape == new.keys.shape
        ref = torch.stack([old[0, h, idx[0, h]] for h in range(old.shape[1])])
        assert torch.equal(new.keys[0], ref)
    assert ev.bytes_after == cache_bytes(ev.cache) < ev.bytes_before == cache_bytes(state.cache)
    if arch != "gemma3":
        assert ev.bytes_after * 5 == ev.bytes_before


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3"])
def test_full_budget_generation_equals_full_cache_and_generate(arch):
    model = tiny_model(arch, seed=1)
    ids = torch.randint(0, 100, (1, 25))
    scorer = get_scorer("snapkv")
    ctx = prepare(scorer, model, ids)
    state, ev = compress(scorer, scorer.score(ctx), ctx.state, 25)
    evicted, _ = greedy_decode(model, state, 12)
    full, _ = greedy_decode(model, prefill(model, ids), 12)
    ref = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)[0, 25:].tolist()
    assert evicted == full == ref
    assert ev.bytes_after == ev.bytes_before


def _masked_reference(model, ids, extra, kept):
    """Logits at the last position of ids+extra, with the extra tokens blind to the evicted prompt keys."""
    L, n = ids.shape[1], extra.shape[1]
    T = L + n
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    full_mask = causal.clone()
    blocked = torch.ones(L, dtype=torch.bool)
    blocked[kept] = False
    full_mask[L:, :L] &= ~blocked
    masks = full_mask[None, None]
    window = getattr(model.config, "sliding_window", None)
    if "sliding_attention" in getattr(model.config, "layer_types", []):
        i = torch.arange(T)
        sliding = causal & (i[:, None] - i[None, :] < window)
        masks = {"full_attention": masks, "sliding_attention": sliding[None, None]}
    with torch.no_grad():
        return model(torch.cat([ids, extra], 1), attention_mask=masks).logits[0, -1]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
@pytest.mark.parametrize("n_extra", [1, 5])
def test_positions_and_mask_after_eviction_match_a_masked_reference(arch, n_extra):
    """Decode (1 token) and question feed (5 tokens) over an evicted cache equal a full run that blocks the evicted keys."""
    model = tiny_model(arch, seed=2)
    torch.manual_seed(3)
    L = 24
    ids, extra = torch.randint(0, 100, (1, L)), torch.randint(0, 100, (1, n_extra))
    kept_pos = torch.tensor(sorted(torch.randperm(L)[:9].tolist()))
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    scores = torch.zeros(1, layers, kv, L)
    scores[..., kept_pos] = 1.0  # the same kept set in every layer and head: one 4D mask expresses it
    state = prefill(model, ids)
    small, _ = compress(get_scorer("random"), scores, state, 9)
    feed(model, small, extra)
    assert small.next_position == L + n_extra
    ref = _masked_reference(model, ids, extra, kept_pos)
    assert (small.logits[0] - ref).abs().max() < 1e-4


def test_token_by_token_feed_equals_one_forward(monkeypatch):
    import lkvcli.evict as ev_mod

    model = tiny_model("llama", seed=4)
    ids, extra = torch.randint(0, 100, (1, 30)), torch.randint(0, 100, (1, 6))
    scorer = get_scorer("snapkv", window=4)
    ctx = prepare(scorer, model, ids)
    scores = scorer.score(ctx)
    a, _ = compress(scorer, scores, ctx.state, 10)
    b, _ = compress(scorer, scores, ctx.state, 10)
    feed(model, a, extra)
    monkeypatch.setattr(ev_mod, "uniform_length", lambda cache: False)
    feed(model, b, extra)
    assert (a.logits - b.logits).abs().max() < 1e-5


def test_pyramidkv_budgets_decrease_keep_the_total_and_decode():
    model = tiny_model("llama", seed=5)
    scorer = get_scorer("pyramidkv", window=4)
    budgets = scorer.layer_budgets(20, 8, 100)
    assert sum(budgets) == 160 and budgets == sorted(budgets, reverse=True) and budgets[0] > budgets[-1] >= scorer.recent_window
    assert scorer.layer_budgets(100, 8, 100) == [100] * 8  # a full budget keeps everything
    capped = scorer.layer_budgets(90, 8, 100)
    assert sum(capped) == 720 and max(capped) == 100
    ids = torch.randint(0, 100, (1, 40))
    ctx = prepare(scorer, model, ids)
    state, ev = compress(scorer, scorer.score(ctx), ctx.state, 12)
    lengths = [layer.keys.shape[-2] for layer in ev.cache.layers]
    assert lengths[0] > lengths[1] and sum(lengths) == 24
    feed(model, state, torch.randint(0, 100, (1, 3)))  # per-layer lengths differ: one token at a time
    assert len(greedy_decode(model, state, 3)[0]) == 3


def test_left_padded_batch_evicts_padding_away_and_matches_single_rows():
    model = tiny_model("llama", seed=6)
    torch.manual_seed(7)
    rows = [torch.randint(1, 100, (20,)), torch.randint(1, 100, (14,))]
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, 20 - len(r):], mask[i, 20 - len(r):] = r, 1
    scorer = get_scorer("snapkv", window=4, sink_tokens=1)
    ctx = prepare(scorer, model, ids, attention_mask=mask)
    assert ctx.state.next_position.tolist() == [20, 14]
    batch_state, _ = compress(scorer, scorer.score(ctx), ctx.state, 8, attention_mask=mask)
    for layer in batch_state.cache.layers:
        assert layer.keys.shape[-2] == 8
    nxt = torch.tensor([[5], [6]])
    with torch.no_grad():
        out = model(input_ids=nxt, position_ids=ctx.state.next_position[:, None], cache=batch_state.cache).logits[:, -1]
    for i, r in enumerate(rows):
        one = prepare(scorer, model, r[None])
        single, _ = compress(scorer, scorer.score(one), one.state, 8)
        feed(model, single, nxt[i : i + 1])
        assert (single.logits[0] - out[i]).abs().max() < 1e-4
    with pytest.raises(LkvError, match="shortest prompt"):
        compress(scorer, scorer.score(ctx), ctx.state, 16, attention_mask=mask)
