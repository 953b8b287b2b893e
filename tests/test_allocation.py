"""Head-adaptive budgets (``allocation: heads | global``): the kept sets, the memory they free, and
decoding over caches whose heads keep different numbers of entries."""

import pytest
import torch
from tiny_models import tiny_model

from lkvcli.evict import cache_bytes, compress, evict, full_attention_layers, keep_indices
from lkvcli.generate import Prefill, decode_batch, prefill, stack_states
from lkvcli.scorers import get_scorer


def random_scores(layers, kv, L, seed=0):
    scores = torch.rand(1, layers, kv, L, generator=torch.Generator().manual_seed(seed)) ** 4
    return scores / scores.sum(-1, keepdim=True)


def test_heads_allocation_keeps_the_layers_top_entries_across_its_heads():
    scores = random_scores(3, 4, 50)
    kept = keep_indices(scores, [6, 6, 6], allocation="heads")
    for layer, idx in enumerate(kept):
        real = idx[0] >= 0
        assert int(real.sum()) == 6 * 4 and bool((real.sum(-1) >= 1).all())
        chosen = {(h, int(p)) for h in range(4) for p in idx[0, h][real[h]]}
        flat = scores[0, layer]
        best = {(int(i) // 50, int(i) % 50) for i in flat.flatten().topk(24).indices}
        # the best position of each head is always kept; otherwise the top 24 of the layer
        assert len(chosen & best) >= 24 - 4
        assert idx.shape[-1] == int(real.sum(-1).max())  # padded to the layer's longest head only
        for h in range(4):
            row = idx[0, h][real[h]]
            assert torch.equal(row, row.sort().values) and bool((idx[0, h][~real[h]] == -1).all())


def test_global_allocation_shares_one_budget_over_the_full_attention_layers():
    scores = random_scores(4, 2, 40)
    scores[:, 1] = scores[:, 1] ** 0.2  # a flat layer: in a global top it should get less
    scores[:, 1] /= scores[:, 1].sum(-1, keepdim=True)
    kept = keep_indices(scores, [5] * 4, allocation="global", pooled_layers=[0, 1, 3])
    assert kept[2] is None  # left out of the pool (a sliding layer): kept whole
    counts = [int((kept[i][0] >= 0).sum()) for i in (0, 1, 3)]
    assert sum(counts) == 5 * 2 * 3 and counts[1] < min(counts[0], counts[2])


@pytest.mark.parametrize("allocation", ["heads", "global"])
def test_eviction_frees_what_the_kept_entries_do_not_need(allocation):
    model = tiny_model("llama")
    ids = torch.randint(1, 90, (1, 40), generator=torch.Generator().manual_seed(3))
    state = prefill(model, ids)
    scores = random_scores(2, 2, 40, seed=4)
    kept = keep_indices(scores, [8, 8], allocation=allocation, pooled_layers=[0, 1])
    ev = evict(state.cache, kept)
    layer = state.cache.layers[0]
    entry = 2 * layer.keys.shape[-1] * layer.keys.element_size()  # key + value of one entry in one head
    real = sum(int((k >= 0).sum()) for k in kept)
    slots = sum(k.numel() for k in kept)
    assert real == 8 * 2 * 2
    assert ev.bytes_after == cache_bytes(ev.cache) == slots * entry
    assert ev.bytes_after - ev.padding_bytes == real * entry  # exactly what the kept entries need
    assert ev.padding_bytes == (slots - real) * entry
    assert ev.bytes_after < ev.bytes_before / 2


@pytest.mark.parametrize("arch,allocation", [("llama", "heads"), ("llama", "global"), ("qwen2", "heads")])
def test_decoding_over_padded_heads_equals_masking_the_full_cache(arch, allocation):
    model = tiny_model(arch)
    ids = torch.randint(1, 90, (1, 36), generator=torch.Generator().manual_seed(5))
    state = prefill(model, ids)
    layers, kv = len(state.cache.layers), state.cache.layers[0].keys.shape[1]
    scorer = get_scorer("snapkv", allocation=allocation, recent_window=0)
    scores = random_scores(layers, kv, 36, seed=6)
    scores[:, :, 0] = scores[:, :, 0] ** 3  # a peaky head 0, flatter others: the heads keep different counts
    scores = scores / scores.sum(-1, keepdim=True)
    small, ev = compress(scorer, scores, state, 10)
    assert small.key_valid and ev.bytes_after < ev.bytes_before
    # reference: the whole cache, every evicted key masked out per head
    full = Prefill(evict(state.cache, [None] * layers).cache, state.logits.clone(), state.next_position,
                   key_valid={i: torch.zeros(1, kv, 37, dtype=torch.bool).scatter_(-1, k + 1, True)[..., 1:]
                              for i, k in enumerate(ev.kept) if k is not None})  # slot 0 takes the -1 padding
    assert set(full.key_valid) == set(full_attention_layers(state.cache)) - {
        i for i, layer in enumerate(state.cache.layers) if getattr(layer, "is_sliding", False)}
    a, b = decode_batch(model, small, 6)[0], decode_batch(model, full, 6)[0]
    assert a.tokens == b.tokens
    assert max(abs(x - y) for x, y in zip(a.margins, b.margins)) < 1e-5
    # and in a batch next to a uniform eviction of the same prompt
    uniform, _ = compress(get_scorer("snapkv"), scores, state, 10)
    rows = decode_batch(model, stack_states([small_again(scorer, scores, state), uniform]), 6)
    assert rows[0].tokens == a.tokens and rows[1].tokens == decode_batch(
        model, compress(get_scorer("snapkv"), scores, state, 10)[0], 6)[0].tokens


def small_again(scorer, scores, state):
    return compress(scorer, scores, state, 10)[0]
