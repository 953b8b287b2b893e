"""The eval engine (one shared prefill, batched decoding, the resumable journal) against the
one-method-at-a-time reference, on tiny models of several architectures and on SmolLM2."""

import pytest
import torch
from helpers import assert_rows_match, key, rows_of
from tiny_models import save_tiny_model, write_tiny_targets

from lkvcli.errors import LkvError
from lkvcli.evaluate import EvalConfig, evaluate, evaluate_record_sequential, setup
from lkvcli.evaluate.journal import PREDICTIONS
from lkvcli.generate import Prefill, decode_batch, prefill, stack_states
from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig
from lkvcli.models import load_model

METHODS = ["lookahead", "snapkv", "pyramidkv", "tova", "h2o", "streamingllm", "oracle", "draft", "kvzip", "knorm", "random"]
def tiny_run(tmp_path, arch, mode="whole", budgets=("3", "6", "12", "1.0"), methods=METHODS, **extra):
    folder = save_tiny_model(arch, tmp_path / f"model-{arch}")
    loaded = load_model(str(folder), device="cpu")
    targets = tmp_path / f"targets-{arch}"
    if not targets.exists():
        write_tiny_targets(targets, loaded.model, n=4, lengths=(24, 40), response_len=6, with_text=True)
    adapter = LookaheadAdapter.attach(loaded.model, LookaheadConfig(num_tokens=3))
    config = EvalConfig(targets=[str(targets)], methods=list(methods), budgets=list(budgets),
                        parts=["prediction", "answers"], out=str(tmp_path / f"out-{arch}-{mode}"), split="all",
                        mode=mode, device="cpu", **extra)
    return setup(config, loaded=loaded, adapter=adapter)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_engine_rows_equal_the_one_method_at_a_time_path(tmp_path, arch):
    run = tiny_run(tmp_path, arch)
    evaluate(run)
    engine = rows_of(tmp_path / f"out-{arch}-whole")
    reference = [row for i in run.record_indices for row in evaluate_record_sequential(run, run.reader[i])]
    assert len(reference) == 4 * (1 + 2 * len(METHODS) * 4)
    assert assert_rows_match(reference, engine) == 0


def test_padded_batch_decodes_like_each_row_alone():
    """Rows evicted to different sizes, stacked with padding: logits within 1e-5 of decoding alone."""
    from lkvcli.evict import evict, keep_indices
    from lkvcli.scorers import get_scorer
    from tiny_models import tiny_model

    model = tiny_model("llama")
    ids = torch.randint(1, 90, (1, 30), generator=torch.Generator().manual_seed(1))
    state = prefill(model, ids)
    scores = torch.rand(1, 2, 2, 30, generator=torch.Generator().manual_seed(2))
    budgets = [[4, 4], [9, 9], [30, 30], get_scorer("pyramidkv").layer_budgets(8, 2, 30)]
    singles = []
    for per_layer in budgets:
        cache = evict(state.cache, keep_indices(scores, per_layer)).cache
        singles.append(Prefill(cache, state.logits.clone(), state.next_position))
    batch = stack_states(singles)
    assert batch.key_valid is not None
    rows = decode_batch(model, batch, 8)
    for single, row in zip(singles, rows):
        alone = decode_batch(model, single, 8)[0]
        assert alone.tokens == row.tokens
        assert max(abs(a - b) for a, b in zip(alone.margins, row.margins)) < 1e-5


def test_context_mode_batches_the_question_feed(tmp_path):
    run = tiny_run(tmp_path, "llama", mode="context", methods=["snapkv", "pyramidkv", "oracle", "lookahead"])
    evaluate(run)
    rows = rows_of(tmp_path / "out-llama-context")
    assert all(r["scored_len"] < r["prompt_len"] for r in rows)
    reference = [row for i in run.record_indices for row in evaluate_record_sequential(run, run.reader[i])]
    assert assert_rows_match(reference, rows) == 0


def test_resume_after_an_interrupt_gives_the_same_aggregates(tmp_path):
    straight = tiny_run(tmp_path / "a", "llama", methods=["snapkv", "pyramidkv", "oracle"])
    expected = evaluate(straight)

    run = tiny_run(tmp_path / "b", "llama", methods=["snapkv", "pyramidkv", "oracle"])
    seen = []

    def stop_after_two(event):
        if event.kind == "advance":
            seen.append(event)
            if len(seen) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(run, on_event=stop_after_two)
    journal = tmp_path / "b" / "out-llama-whole" / PREDICTIONS
    written = journal.read_text().splitlines()
    assert 0 < len(written) < len(rows_of(tmp_path / "a" / "out-llama-whole"))
    with open(journal, "a") as fh:  # a SIGKILL in the middle of a line
        fh.write(written[-1][: len(written[-1]) // 2])
    resumed = evaluate(run)
    assert resumed["meta"]["resumed_rows"] == len(written)
    assert resumed["prediction"] == expected["prediction"] and resumed["answers"] == expected["answers"]
    keys = [key(r) for r in rows_of(tmp_path / "b" / "out-llama-whole")]
    assert len(keys) == len(set(keys)) == len(rows_of(tmp_path / "a" / "out-llama-whole"))
    again = evaluate(run)  # everything done: no model work, same numbers
    assert again["throughput"]["records_computed"] == 0 and again["answers"] == expected["answers"]


def test_a_folder_with_other_settings_is_refused_then_replaced_with_overwrite(tmp_path):
    run = tiny_run(tmp_path, "llama", methods=["snapkv"], budgets=("3",))
    evaluate(run)
    before = (tmp_path / "out-llama-whole" / PREDICTIONS).read_bytes()
    other = tiny_run(tmp_path, "llama", methods=["snapkv"], budgets=("3",), max_new_tokens=2)
    with pytest.raises(LkvError, match="other settings .*max_new_tokens.*--overwrite"):
        evaluate(other)
    assert (tmp_path / "out-llama-whole" / PREDICTIONS).read_bytes() == before
    other.config.overwrite = True
    evaluate(other)
    assert {r["budget"] for r in rows_of(tmp_path / "out-llama-whole")} == {None, "3"}
    assert (tmp_path / "out-llama-whole" / PREDICTIONS).read_bytes() != before
    changed = tiny_run(tmp_path, "llama", methods=["snapkv"], budgets=("3",), max_new_tokens=2,
                       scorers={"snapkv": {"window": 4}})
    with pytest.raises(LkvError, match="options of snapkv"):
        evaluate(changed)
    more = tiny_run(tmp_path, "llama", methods=["snapkv", "tova"], budgets=("3", "6"), max_new_tokens=2)
    evaluate(more)  # new methods and budgets add rows to the same journal
    assert {(r["method"], r["budget"]) for r in rows_of(tmp_path / "out-llama-whole")} >= {("tova", "6"), ("snapkv", "3")}


def test_engine_with_head_adaptive_allocations(tmp_path):
    run = tiny_run(tmp_path, "qwen2", methods=["snapkv", "oracle", "lookahead", "pyramidkv"],
                   scorers={"snapkv": {"allocation": "heads", "recent_window": 0}, "oracle": {"allocation": "global"},
                            "pyramidkv": {"allocation": "heads"}})
    evaluate(run)
    rows = rows_of(tmp_path / "out-qwen2-whole")
    reference = [row for i in run.record_indices for row in evaluate_record_sequential(run, run.reader[i])]
    assert assert_rows_match(reference, rows) == 0
    padded = [r for r in rows if r["part"] == "answers" and r.get("padding_bytes")]
    assert padded and all(r["cache_bytes_after"] < r["cache_bytes_before"] for r in padded)
