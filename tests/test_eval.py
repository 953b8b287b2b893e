"""`lkv eval` end to end on a tiny model (real SmolLM2 tokenizer), its metrics, and every bad input."""

import json

import pytest
from helpers import lkv, one_line_error, tiny_llama_folder

from lkvcli.evaluate import answer_score, context_split, rouge_l
from lkvcli.report import summary_rows
from lkvcli.targets import TargetsReader

ROWS = [{"id": f"q{i}", "context": "The red fox jumps over the lazy dog near the river. " * (5 + i),
         "question": f"What colour is fox number {i}?", "answer": "red", "task": "colour"} for i in range(3)]
ROWS.append({"id": "open", "prompt": "Write a short poem about the sea and the moon. " * 6, "task": "poem"})


@pytest.fixture(scope="module")
def setup_dir(tmp_path_factory):
    from lkvcli.collect import CollectConfig, collect

    root = tmp_path_factory.mktemp("eval")
    model = tiny_llama_folder(root / "model", max_positions=512)
    (root / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    collect(CollectConfig(model=str(model), data=str(root / "p.jsonl"), out=str(root / "t"), max_new_tokens=5))
    return root


def _adapter(root, model_folder, name, seed=0, val_ids=None):
    from lkvcli.adapter_folder import save_adapter
    from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig
    from lkvcli.models import load_model
    from lkvcli.runs import RunInfo, write_run_info

    loaded = load_model(str(model_folder), device="cpu")
    adapter = LookaheadAdapter.attach(loaded.model, LookaheadConfig(num_tokens=3), seed=seed)
    run = root / name
    model = {"source": str(model_folder), "fingerprint": loaded.fingerprint}
    save_adapter(adapter, run / "adapter", {"model": model})
    write_run_info(run, RunInfo(model=model, val_ids=val_ids or []))
    return run


def test_full_budget_answers_equal_the_collected_response_in_both_modes(setup_dir, tmp_path):
    run = _adapter(setup_dir, setup_dir / "model", "run", val_ids=["q0", "q2", "open"])
    for mode in ("whole", "context"):
        out = tmp_path / mode
        r = lkv("eval", "--targets", setup_dir / "t", "--adapter", run, "--budgets", "1.0,8", "--out", out,
                "--mode", mode, "--parts", "prediction,answers")
        assert r.exit_code == 0, r.output
        results = json.loads((out / "results.json").read_text())
        assert results["meta"]["records"] == ["q0", "q2", "open"]  # the adapter run's validation split
        assert set(results["methods"]) == {"draft", "h2o", "knorm", "kvzip", "lookahead", "oracle", "pyramidkv", "random",
                                           "snapkv", "streamingllm", "tova"}
        for name, entry in results["answers"]["methods"].items():
            assert entry["1"]["same_as_full"] == 1.0, (mode, name)  # nothing evicted: token for token the same
            assert entry["8"]["cache_ratio"] < 1
        oracle = results["prediction"]["oracle"]
        assert oracle["kl"] < 1e-3 and oracle["budgets"]["1"]["recall"] == pytest.approx(1.0)
        assert oracle["budgets"]["8"]["recall"] >= max(e["budgets"]["8"]["recall"]
                                                       for e in results["prediction"].values()) - 1e-6
        rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
        assert {r["part"] for r in rows} == {"prediction", "answers"} and all("id" in r for r in rows)
        assert (out / "report.md").read_text().startswith("# lkv eval")
        assert {p.name for p in (out / "plots").iterdir()} == {"recall_vs_budget.png", "answers_vs_budget.png"}
        assert json.loads((out / "config.json").read_text())["eval"]["mode"] == mode
        header, table = summary_rows(results)
        assert header == ["method", "recall@1", "recall@8", "agree@1", "agree@8"]
        by_name = {row[0]: row for row in table}
        assert set(by_name) == set(results["methods"]) and by_name["oracle"][1] == "1.000"
        assert by_name["snapkv"][2] == f"{results['prediction']['snapkv']['budgets']['8']['recall']:.3f}"
        assert by_name["snapkv"][4] == f"{results['answers']['methods']['snapkv']['8']['agreement']:.3f}"


def test_overhead_part_and_json_output(setup_dir, tmp_path):
    r = lkv("--json", "eval", "--targets", setup_dir / "t", "--methods", "snapkv,streamingllm", "--budgets", "8",
            "--parts", "overhead", "--out", tmp_path / "o", "--repeats", "2", "--overhead-prompts", "1",
            "scorers.snapkv.window=4")
    assert r.exit_code == 0, r.output
    overhead = json.loads((tmp_path / "o" / "results.json").read_text())["overhead"]
    assert overhead["budget"] == "8" and overhead["repeats"] == 2 and len(overhead["prompts"]) == 1  # as asked
    methods = overhead["methods"]
    assert set(methods) == {"plain", "snapkv", "streamingllm"}
    assert all(entry["repeats"] == 2 for entry in methods.values())
    plain = methods["plain"]  # the baseline: a real prefill, no scoring, no eviction, the cache kept whole
    assert plain["prefill_s"] > 0 and plain["ttft_s"] >= plain["prefill_s"]  # the first token comes after prefill
    assert plain["score_s"] == plain["evict_s"] == 0 and plain["cache_bytes_after"] == plain["cache_bytes_before"]
    for name, entry in methods.items():  # every row is relative to plain's medians, as reported
        added = entry["prefill_s"] - plain["prefill_s"] + entry["score_s"] + entry["evict_s"]
        assert entry["scoring_s"] == pytest.approx(added, rel=1e-9, abs=1e-12), name
        assert entry["scoring_pct"] == pytest.approx(100 * added / plain["prefill_s"], rel=1e-9, abs=1e-9), name
        assert entry["overhead_pct"] == pytest.approx(100 * (entry["ttft_s"] - plain["ttft_s"]) / plain["ttft_s"],
                                                      rel=1e-9, abs=1e-9), name
    assert methods["snapkv"]["cache_bytes_after"] < methods["snapkv"]["cache_bytes_before"]
    assert methods["snapkv"]["cache_bytes_before"] == plain["cache_bytes_before"]  # the same prompt, prefilled
    assert (tmp_path / "o" / "plots" / "overhead.png").is_file()
    assert json.loads((tmp_path / "o" / "config.json").read_text())["scorers"]["snapkv"]["window"] == 4


def test_overhead_table_is_relative_to_plain_prefill():
    """The overhead arithmetic exactly, on made-up timings (a fake clock): per method the median of each
    timing, then time to first token and the time added before it, against plain prefill's medians."""
    from lkvcli.evaluate import overhead_table

    def run(prefill, score, evict, ttft, before=1000, after=1000):
        return {"prefill_s": prefill, "score_s": score, "evict_s": evict, "ttft_s": ttft,
                "cache_bytes_before": before, "cache_bytes_after": after, "peak_mb": None}

    samples = {  # three repeats each, out of order: the medians are the middle values, not the means
        "plain": [run(0.5, 0, 0, 2.0), run(0.25, 0, 0, 1.0), run(4.0, 0, 0, 8.0)],  # medians: prefill .5, ttft 2
        "slow": [run(1.0, 0.25, 0.125, 3.0, after=250), run(0.75, 0.5, 0.25, 9.0, after=250),
                 run(0.5, 0.125, 0.0, 2.5, after=250)],  # medians: prefill .75, score .25, evict .125, ttft 3
        "fast": [run(0.5, 0, 0, 1.5), run(0.5, 0, 0, 1.0), run(0.5, 0, 0, 1.0)],  # ttft median 1: faster than plain
    }
    table = overhead_table(samples)
    assert set(table) == {"plain", "slow", "fast"}
    plain, slow, fast = table["plain"], table["slow"], table["fast"]
    assert (plain["prefill_s"], plain["ttft_s"], plain["repeats"]) == (0.5, 2.0, 3)
    assert plain["overhead_pct"] == 0 and plain["scoring_s"] == 0 and plain["scoring_pct"] == 0
    assert (slow["prefill_s"], slow["score_s"], slow["evict_s"], slow["ttft_s"]) == (0.75, 0.25, 0.125, 3.0)
    assert slow["scoring_s"] == 0.625  # (0.75 - 0.5) + 0.25 + 0.125
    assert slow["scoring_pct"] == 125.0  # 0.625 / 0.5
    assert slow["overhead_pct"] == 50.0  # (3 - 2) / 2
    assert slow["cache_bytes_after"] == 250 and slow["peak_mb"] is None and slow["repeats"] == 3
    assert fast["overhead_pct"] == -50.0 and fast["scoring_s"] == 0  # (1 - 2) / 2: a method may beat plain


def test_bad_inputs_fail_with_one_clear_line(setup_dir, tmp_path):
    t = setup_dir / "t"
    one_line_error(lkv("eval", "--targets", t, "--budgets", "0", "--out", tmp_path / "a"), "budget 0 must be positive")
    one_line_error(lkv("eval", "--targets", t, "--budgets", "100000", "--out", tmp_path / "a"),
                   "budget 100000 is larger than the prompt of record")
    one_line_error(lkv("eval", "--targets", t, "--methods", "snapkv,foo", "--out", tmp_path / "a"),
                   "unknown method 'foo'", "snapkv", "lookahead", "oracle")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    one_line_error(lkv("eval", "--targets", t, "--out", blocker / "r"), "not writable")
    one_line_error(lkv("eval", "--targets", t, "--methods", "lookahead", "--out", tmp_path / "a"), "needs an adapter")
    other = tiny_llama_folder(tmp_path / "other", seed=1, max_positions=512)
    run = _adapter(tmp_path, other, "other-run")
    one_line_error(lkv("eval", "--targets", t, "--adapter", run, "--out", tmp_path / "a"), "trained for another model")
    one_line_error(lkv("eval", "--targets", t, "--model", other, "--out", tmp_path / "a"), "collected with another model")
    one_line_error(lkv("eval", "--targets", tmp_path / "nothing", "--out", tmp_path / "a"), "not a targets folder")
    one_line_error(lkv("eval", "--targets", t, "--parts", "speed", "--out", tmp_path / "a"), "unknown part 'speed'")


def test_context_split_is_the_question_start(setup_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(setup_dir / "model")
    reader = TargetsReader(setup_dir / "t")
    record = reader[reader.ids().index("q1")]
    cut = context_split(record, tokenizer)
    head = tokenizer.decode(record.prompt_ids[:cut])
    tail = tokenizer.decode(record.prompt_ids[cut:])
    assert head.endswith("river. \n\n") or head.rstrip().endswith("river.")
    assert tail.startswith("What colour is fox number 1?")
    poem = reader[reader.ids().index("open")]
    assert tokenizer.decode(poem.prompt_ids[context_split(poem, tokenizer):]).startswith("<|im_end|>")


def test_answer_metrics():
    assert rouge_l("the cat sat", "the cat sat") == 1.0 and rouge_l("a b", "c d") == 0.0
    assert rouge_l("the cat sat on the mat", "the cat on a mat") == pytest.approx(2 * (4 / 6) * (4 / 5) / (4 / 6 + 4 / 5))  # LCS "the cat on mat"
    assert answer_score("It is Red.", "red", "contains_all", "") == 1.0
    assert answer_score("red and blue", ["red", "green"], "contains_all", "") == 0.0
    assert answer_score("red and blue", ["red", "green"], "contains_any", "") == 1.0
    assert answer_score(" Red! ", "red", "exact", "") == 1.0
    assert answer_score("a poem", None, "agreement", "a poem") == 1.0


def test_adapter_from_a_training_run_and_from_its_bundle(trained_run, tmp_path):
    """A real `lkv train` run (its validation split is used) and its `lkv export` bundle score identically."""
    run = trained_run["run"]
    targets = run.parent / "targets"
    val_ids = json.loads((run / "run.json").read_text())["val_ids"]
    r = lkv("eval", "--targets", targets, "--adapter", run, "--methods", "lookahead", "--budgets", "4",
            "--parts", "prediction", "--out", tmp_path / "a")
    assert r.exit_code == 0, r.output
    a = json.loads((tmp_path / "a" / "results.json").read_text())
    assert a["meta"]["records"] == val_ids and a["meta"]["adapter"]["step"] == 4
    bundle = tmp_path / "bundle"
    assert lkv("export", run, "--out", bundle, "--no-model-check").exit_code == 0
    r = lkv("eval", "--targets", targets, "--adapter", bundle, "--methods", "lookahead", "--budgets", "4",
            "--parts", "prediction", "--out", tmp_path / "b", "--split", "all", "--limit", len(val_ids))
    assert r.exit_code == 0, r.output
    b = json.loads((tmp_path / "b" / "results.json").read_text())
    r = lkv("eval", "--targets", targets, "--adapter", run, "--methods", "lookahead", "--budgets", "4",
            "--parts", "prediction", "--out", tmp_path / "c", "--split", "all", "--limit", len(val_ids))
    c = json.loads((tmp_path / "c" / "results.json").read_text())
    assert b["prediction"]["lookahead"]["kl"] == pytest.approx(c["prediction"]["lookahead"]["kl"], abs=1e-6)


def test_a_results_folder_from_other_settings_is_refused_and_kept(setup_dir, tmp_path):
    t, out = setup_dir / "t", tmp_path / "r"
    args = ["eval", "--targets", t, "--methods", "snapkv", "--budgets", "8", "--parts", "prediction,answers",
            "--out", out]
    assert lkv(*args).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    r = lkv(*args, "--max-new-tokens", "2")
    one_line_error(r, "other settings", "max_new_tokens", "--overwrite")
    assert r.exit_code == 2
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    again = lkv(*args)  # the same settings resume: nothing to compute, the same results
    assert again.exit_code == 0 and "0 computed now" in again.output
    assert json.loads((out / "results.json").read_text())["answers"] == json.loads(before["results.json"])["answers"]
    assert lkv(*args, "--max-new-tokens", "2", "--overwrite").exit_code == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert json.loads((out / "journal.json").read_text())["max_new_tokens"] == 2 and len(rows) == len(ROWS) * 3
