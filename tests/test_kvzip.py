"""The kvzip scorer against an independent eager reference of its re-reading pass."""

import pytest
import torch
from tiny_models import tiny_model

from lkvcli.errors import LkvError
from lkvcli.evict import keep_indices
from lkvcli.scorers import get_scorer, prepare

L = 30  # longer than gemma3's sliding window (8)


def reread_reference(model, ids: torch.Tensor, feed: torch.Tensor, first_query: int) -> torch.Tensor:
    """Eager attention over prompt + feed: for each layer and KV head, the largest probability that
    any query of ``feed`` from ``first_query`` on (and any query head of the group) pays each prompt key."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(torch.cat([ids, feed], 1), output_attentions=True).attentions
    finally:
        model.set_attn_implementation("lkv_sdpa")
    kv, n = model.config.num_key_value_heads, ids.shape[1]
    rows = []
    for a in attentions:
        a = a[0, :, n + first_query:, :n]  # (heads, queries, prompt keys)
        rows.append(a.reshape(kv, -1, n).amax(1))
    return torch.stack(rows)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_scores_are_the_peak_attention_of_the_reread_prompt(arch):
    model = tiny_model(arch, seed=4)
    ids = torch.randint(0, 100, (1, L))
    scorer = get_scorer("kvzip")
    ctx = prepare(scorer, model, ids)
    scores = scorer.score(ctx)[0]
    ref = reread_reference(model, ids, ids, 0)  # no tokenizer: no instruction, the prompt re-read as is
    assert scores.shape == ref.shape
    assert (scores - ref).abs().max() < 1e-5
    assert ctx.state.cache.layers[-1].keys.shape[-2] == L  # the cache is left as it was


def test_chunks_score_only_their_own_entries_after_the_previous_chunks_tail():
    model = tiny_model("llama", seed=5)
    ids = torch.randint(0, 100, (1, L))
    scorer = get_scorer("kvzip", chunk_size=12, overlap=3)
    scores = scorer.score(prepare(scorer, model, ids))[0]
    for start in (0, 12, 24):
        end = min(L, start + 12)
        lead = ids[:, max(0, start - 3):start]
        ref = reread_reference(model, ids, torch.cat([lead, ids[:, start:end]], 1), lead.shape[1])
        assert (scores[..., start:end] - ref[..., start:end]).abs().max() < 1e-5


def test_defaults_keep_sinks_and_one_global_top():
    scorer = get_scorer("kvzip")
    assert (scorer.sink_tokens, scorer.allocation, scorer.distribution) == (4, "global", False)
    model = tiny_model("llama", seed=6)
    ids = torch.randint(0, 100, (1, L))
    scores = scorer.score(prepare(scorer, model, ids))
    kept = keep_indices(scores, [8] * model.config.num_hidden_layers, sink_tokens=4, allocation="global")
    total = sum(int((k >= 0).sum()) for k in kept if k is not None)
    assert total == 8 * model.config.num_hidden_layers * model.config.num_key_value_heads
    for k in kept:
        assert all(set(range(4)) <= set(row.tolist()) for row in k[0])  # every head keeps the sinks


def test_bad_options_and_batches_are_refused():
    with pytest.raises(LkvError, match="chunk_size"):
        get_scorer("kvzip", chunk_size=0)
    model = tiny_model("llama", seed=7)
    scorer = get_scorer("kvzip")
    ctx = prepare(scorer, model, torch.randint(0, 100, (2, L)))
    with pytest.raises(LkvError, match="batch size 1"):
        scorer.score(ctx)
