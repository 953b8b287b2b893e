"""Scorers: registry, shapes on every tiny architecture, and each score against an independent reference."""

import pytest
import torch
from helpers import eager_attention
from tiny_models import ARCHS, tiny_model

from lkvcli.collect import ground_truth, ground_truth_targets
from lkvcli.attention import normalise
from lkvcli.errors import LkvError
from lkvcli.evict import keep_indices
from lkvcli.scorers import available, get_scorer, prepare
from lkvcli.targets import TargetRecord

ALL = ["draft", "h2o", "knorm", "kvzip", "lookahead", "oracle", "pyramidkv", "random", "snapkv", "streamingllm", "tova"]
L = 30  # longer than gemma3's sliding window (8)


def _record(model, ids):
    torch.manual_seed(0)
    target = torch.rand(model.config.num_hidden_layers, model.config.num_key_value_heads, ids.shape[1])
    return TargetRecord(id="r", prompt_ids=ids[0], response_ids=torch.tensor([1]), target=target / target.sum(-1, True))


def _resources(model):
    from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig

    return {"adapter": LookaheadAdapter.attach(model, LookaheadConfig(num_tokens=4), seed=1)}


def test_registry_lists_every_method_and_rejects_unknown_names_and_options():
    assert available() == ALL
    with pytest.raises(LkvError, match="known methods: full, draft, h2o"):
        get_scorer("snapkvv")
    with pytest.raises(LkvError, match="known fields"):
        get_scorer("snapkv", windw=3)
    with pytest.raises(LkvError, match="pooling_kernel"):
        get_scorer("snapkv", pooling="avg", pooling_kernel=4)
    assert get_scorer("snapkv", window=8).recent_window == 4  # half the window is always kept
    for name in ALL:
        cls = type(get_scorer(name))
        assert cls.__doc__ and cls.name == name


@pytest.mark.parametrize("arch", ARCHS)
def test_every_scorer_runs_and_returns_the_right_shape(arch):
    model = tiny_model(arch, seed=1)
    ids = torch.randint(0, 100, (1, L))
    resources = _resources(model)
    shape = (1, model.config.num_hidden_layers, model.config.num_key_value_heads, L)
    for name in ALL:
        scorer = get_scorer(name)
        ctx = prepare(scorer, model, ids, record=_record(model, ids), resources=resources)
        scores = scorer.score(ctx)
        assert scores.shape == shape and scores.dtype == torch.float32, name
        assert torch.isfinite(scores).all(), name
        if scorer.distribution:
            assert torch.allclose(scores.sum(-1), torch.ones(shape[:-1]), atol=1e-4), name
        assert ctx.state.cache.layers[-1].keys.shape[-2] == L  # scoring leaves the prefill cache as it was


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("name,query_start", [("snapkv", L - 6), ("tova", L - 1), ("h2o", 0)])
def test_query_scorers_match_eager_attention(arch, name, query_start):
    model = tiny_model(arch, seed=2)
    ids = torch.randint(0, 100, (1, L))
    scorer = get_scorer(name, **({"window": 6} if name == "snapkv" else {}))
    scores = scorer.score(prepare(scorer, model, ids))
    ref = eager_attention(model, ids, query_start, L)
    assert (scores[0] - ref).abs().max() < 1e-5


def test_pooling_smooths_and_renormalises():
    model = tiny_model("llama", seed=3)
    ids = torch.randint(0, 100, (1, L))
    plain, pooled = get_scorer("snapkv"), get_scorer("snapkv", pooling="avg", pooling_kernel=5)
    a = plain.score(prepare(plain, model, ids))
    b = pooled.score(prepare(pooled, model, ids))
    ref = torch.nn.functional.avg_pool1d(a.view(-1, 1, L), 5, 1, 2).view(a.shape)
    assert torch.allclose(b, ref / ref.sum(-1, keepdim=True), atol=1e-6)
    peaks = get_scorer("snapkv", pooling="avg", pooling_kernel=5, pooling_keeps_peaks=True)
    c = peaks.score(prepare(peaks, model, ids))
    kept = torch.maximum(a, ref)
    assert torch.allclose(c, kept / kept.sum(-1, keepdim=True), atol=1e-6)
    # the largest score stays the largest: a peak is never lowered below its pooled neighbours
    assert torch.equal(c.argmax(-1), a.argmax(-1))


def test_draft_with_the_target_model_equals_the_ground_truth_of_its_first_tokens():
    model = tiny_model("qwen2", seed=4)
    ids = torch.randint(0, 100, (1, L))
    scorer = get_scorer("draft", tokens=5)
    scores = scorer.score(prepare(scorer, model, ids))
    _, target, _ = ground_truth(model, ids, max_new_tokens=5, stop_ids=set())
    assert (scores[0] - target).abs().max() < 1e-5
    # the same drafts from a separately given draft model (another code path) give the same scores
    other = get_scorer("draft", tokens=5, draft_model="same")
    again = other.score(prepare(other, model, ids, resources={"draft_models": {"same": model}}))
    assert (again - scores).abs().max() < 1e-5
    laq = get_scorer("draft", tokens=3, compress_budget=8, snapkv_window=4)
    assert laq.score(prepare(laq, model, ids)).shape == scores.shape


def test_lookahead_scorer_is_the_adapters_score():
    model = tiny_model("llama", seed=5)
    ids = torch.randint(0, 100, (1, L))
    resources = _resources(model)
    scorer = get_scorer("lookahead")
    scores = scorer.score(prepare(scorer, model, ids, resources=resources))
    assert torch.allclose(scores, resources["adapter"].predict(ids), atol=1e-6)
    with pytest.raises(LkvError, match="needs an adapter"):
        scorer.score(prepare(scorer, tiny_model("llama"), ids))


def test_lookahead_mixed_with_its_own_draft_is_the_weighted_sum_of_both():
    model = tiny_model("mistral", seed=7)
    ids = torch.randint(0, 100, (1, L))
    resources = _resources(model)
    adapter = resources["adapter"]
    _, truth, _ = ground_truth_targets(model, ids, max_new_tokens=3, stop_ids=set(), extras=("max",))
    lookahead = adapter.score(adapter.prefill(ids), query_reduction="max")
    for weight, combine in ((0.0, "sum"), (0.3, "sum"), (1.0, "sum"), (0.5, "max")):
        scorer = get_scorer("lookahead", query_reduction="max", draft_tokens=3, draft_weight=weight, draft_combine=combine)
        scores = scorer.score(prepare(scorer, model, ids, resources=resources))
        # the draft part is the max target of the model's first 3 answer tokens (collect's independent path)
        parts = (1 - weight) * lookahead, weight * truth["max"][None]
        expected = parts[0] + parts[1] if combine == "sum" else normalise(torch.maximum(*parts))
        assert (scores - expected).abs().max() < 1e-5
    for bad in ({"draft_tokens": -1}, {"draft_weight": 1.5}):
        with pytest.raises(LkvError, match="draft_tokens must be >= 0"):
            get_scorer("lookahead", **bad)


def test_simple_scorers_keep_what_they_promise():
    model = tiny_model("llama", seed=6)
    ids = torch.randint(0, 100, (1, L))
    stream = get_scorer("streamingllm")
    kept = keep_indices(stream.score(prepare(stream, model, ids)), [10, 10], sink_tokens=stream.sink_tokens)
    assert kept[0][0, 0].tolist() == [0, 1, 2, 3, *range(L - 6, L)]
    knorm = get_scorer("knorm")
    ctx = prepare(knorm, model, ids)
    norms = ctx.state.cache.layers[1].keys[0].norm(dim=-1)  # (kv, L)
    kept = keep_indices(knorm.score(ctx), [5, 5])[1][0]
    assert torch.equal(kept, norms.topk(5, largest=False).indices.sort(-1).values)
    r1, r2, r3 = (get_scorer("random", seed=s) for s in (1, 1, 2))
    a, b, c = (s.score(prepare(s, model, ids)) for s in (r1, r2, r3))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_oracle_is_the_record_target_and_recalls_everything_at_full_budget():
    from lkvcli.evaluate import prediction_metrics

    model = tiny_model("mistral", seed=7)
    ids = torch.randint(0, 100, (1, L))
    record = _record(model, ids)
    oracle = get_scorer("oracle")
    scores = oracle.score(prepare(oracle, model, ids, record=record))
    assert torch.allclose(scores[0], record.target)
    m = prediction_metrics(oracle, scores, record.target, [5, L])
    assert m["kl"] < 1e-6 and m["budgets"][L]["recall"] == pytest.approx(1.0)
    assert m["budgets"][5]["overlap"] == pytest.approx(1.0)
    snap = get_scorer("snapkv", window=4)
    s = prediction_metrics(snap, snap.score(prepare(snap, model, ids)), record.target, [5])
    assert s["budgets"][5]["recall"] <= m["budgets"][5]["recall"] + 1e-6


def test_lookahead_scorer_can_take_the_max_over_its_queries():
    model = tiny_model("llama", seed=4)
    ids = torch.randint(0, 100, (1, L))
    resources = _resources(model)
    scorer = get_scorer("lookahead", query_reduction="max")
    ctx = prepare(scorer, model, ids, resources=resources)
    with torch.inference_mode():
        expected = resources["adapter"].score(ctx.state.cache, query_reduction="max")
    assert torch.equal(scorer.score(ctx), expected)
    with pytest.raises(LkvError, match="query_reduction"):
        get_scorer("lookahead", query_reduction="median")
