"""Prefills kept across epochs (``prefill_cache_mb``): same results as without, within the budget."""

import json
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_loaded, tiny_model, write_tiny_targets

from lkvcli.adapter_folder import read_adapter
from lkvcli.errors import LkvError
from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig, left_pad
from lkvcli.targets import TargetsReader
from lkvcli.train import PrefillCache, TrainConfig, train


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return write_tiny_targets(tmp_path_factory.mktemp("data") / "targets", tiny_model("llama"), n=12)


def run(targets, out, **changes) -> tuple[dict, dict, list]:
    """12 steps of 2 = 3 epochs over the 8 training records; 5 validation passes over 4."""
    values = dict(data=[str(targets)], out=str(out), steps=12, batch_size=2, lr=1e-2, val_split=4, eval_every=3,
                  checkpoint_every=0, lookahead=LookaheadConfig(num_tokens=4, lora_dropout=0.1))
    summary = train(TrainConfig(**{**values, **changes}), loaded=tiny_loaded())
    files = read_adapter(Path(out) / "adapter")
    weights = {**files.lora, "embeddings": files.embeddings}
    metrics = [{k: v for k, v in json.loads(line).items() if k not in ("steps_per_s", "time_s")}
               for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return summary, weights, metrics


def test_cache_gives_bit_identical_training_within_budget(targets, tmp_path):
    off, w_off, m_off = run(targets, tmp_path / "off", prefill_cache_mb=0)
    on, w_on, m_on = run(targets, tmp_path / "on")
    small, w_small, m_small = run(targets, tmp_path / "small", prefill_cache_mb=0.02)  # ~5 of 12 prompts
    for weights, metrics in ((w_on, m_on), (w_small, m_small)):
        assert weights.keys() == w_off.keys() and all(torch.equal(weights[k], w_off[k]) for k in w_off)
        assert metrics == m_off
    uses = 12 * 2 + 5 * 4  # training examples + validation examples
    assert off["prefill_cache"] | {"budget_mb": 0} == {"hits": 0, "misses": uses, "prompts": 0, "mb": 0, "budget_mb": 0}
    assert on["prefill_cache"]["prompts"] == 12 and on["prefill_cache"]["misses"] == 12
    assert on["prefill_cache"]["hits"] == uses - 12
    stats = small["prefill_cache"]
    assert 0 < stats["prompts"] < 12 and stats["mb"] <= 0.02 and stats["hits"] > 0
    assert stats["hits"] + stats["misses"] == uses


def test_resume_may_change_the_budget(targets, tmp_path):
    _, straight, _ = run(targets, tmp_path / "a", checkpoint_every=4)

    def interrupt_at_6(event):
        if event.kind == "advance" and event.done == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(data=[str(targets)], out=str(tmp_path / "b"), steps=12, batch_size=2, lr=1e-2,
                          val_split=4, eval_every=3, checkpoint_every=4,
                          lookahead=LookaheadConfig(num_tokens=4, lora_dropout=0.1)),
              on_event=interrupt_at_6, loaded=tiny_loaded())
    _, resumed, _ = run(targets, tmp_path / "b", checkpoint_every=4, resume=True, prefill_cache_mb=0)
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: sliding-window layers hold the last keys only
def test_batch_cache_matches_a_batched_prefill(targets, arch):
    adapter = LookaheadAdapter.attach(tiny_model(arch), LookaheadConfig(num_tokens=4))
    records = [TargetsReader(targets)[i] for i in range(4)]
    assert len({r.prompt_len for r in records}) > 1
    ids, mask = left_pad([r.prompt_ids for r in records])
    batched, cached = adapter.prefill(ids, mask), PrefillCache(1).batch(adapter, records)
    assert cached.get_seq_length() == batched.get_seq_length()
    for a, b in zip(batched.layers, cached.layers):
        assert a.keys.shape == b.keys.shape and type(a) is type(b)
    torch.testing.assert_close(adapter.score(cached, attention_mask=mask), adapter.score(batched, attention_mask=mask),
                               atol=1e-6, rtol=1e-5)  # only float rounding of the padded rows differs
    one = records[:1]  # a batch of one is exactly the prompt's own prefill
    assert torch.equal(adapter.score(PrefillCache().batch(adapter, one)),
                       adapter.score(adapter.prefill(one[0].prompt_ids.view(1, -1))))


def test_inference_mode_prefills_are_not_kept(targets):
    adapter = LookaheadAdapter.attach(tiny_model("llama"), LookaheadConfig(num_tokens=4))
    cache, record = PrefillCache(1), TargetsReader(targets)[0]
    with torch.inference_mode():
        cache.batch(adapter, [record])
    assert cache.stats()["prompts"] == 0
    cache.batch(adapter, [record])
    cache.batch(adapter, [record])
    assert cache.stats() | {"mb": 0} == {"hits": 1, "misses": 2, "prompts": 1, "mb": 0, "budget_mb": 1.0}


def test_negative_budget_is_refused(targets):
    with pytest.raises(LkvError, match="prefill_cache_mb"):
        TrainConfig(data=[str(targets)], prefill_cache_mb=-1).validate()
