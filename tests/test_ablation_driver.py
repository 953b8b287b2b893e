"""benchmarks/ablation.py: the commands it plans from a spec, and the table it reads back from results folders."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec_ = importlib.util.spec_from_file_location("ablation", ROOT / "benchmarks" / "ablation.py")
ablation = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(ablation)

SPEC = {
    "model": "m",
    "collect": {"train": "builtin:n=4", "held": {"data": "builtin:n=2,tasks=needle", "max_new_tokens": 8,
                                                                 "reduction": "max"}},
    "train_targets": ["train"],
    "eval_sets": {"held": {"targets": ["held"], "split": "all"},
                  "ctx": {"targets": ["held"], "eval": {"mode": "context"}}},
    "budgets": [8, 16],
    "baselines": ["snapkv"],
    "train": {"steps": 2, "exclude_tasks": ["needle"]},
    "settings": [{"name": "a"}, {"name": "b", "train": {"objective.target": "max"}, "sets": ["held"]},
                 {"name": "a+tail", "from": "a", "eval": {"scorers.lookahead.recent_window": 4}, "sets": ["held"]}],
}


def args_of(cmd):
    return cmd[cmd.index("lkvcli") + 1:]


def test_plan_collects_trains_then_evaluates_each_setting_on_its_sets(tmp_path):
    steps = ablation.plan(SPEC, tmp_path)
    kinds = [(s["kind"], s["name"], s.get("set")) for s in steps]
    assert kinds == [("collect", "train", None), ("collect", "held", None), ("train", "a", None), ("train", "b", None),
                     ("eval", "baselines", "held"), ("eval", "a", "held"), ("eval", "b", "held"),
                     ("eval", "a+tail", "held"), ("eval", "baselines", "ctx"), ("eval", "a", "ctx")]
    held = args_of(steps[1]["cmd"])
    assert held[held.index("--max-new-tokens") + 1] == "8" and str(tmp_path / "targets" / "held") in held
    assert held[held.index("--reduction") + 1] == "max" and "--reduction" not in args_of(steps[0]["cmd"])
    b = args_of(steps[3]["cmd"])
    assert b[:1] == ["train"] and "steps=2" in b and 'exclude_tasks=["needle"]' in b and "objective.target=max" in b
    tail = args_of(steps[7]["cmd"])
    assert tail[tail.index("--adapter") + 1] == str(tmp_path / "runs" / "a")  # reuses a's adapter
    assert "scorers.lookahead.recent_window=4" in tail and "--budgets" in tail and "8,16" in tail
    ctx = args_of(steps[9]["cmd"])
    assert "mode=context" in ctx and ctx[ctx.index("--out") + 1] == str(tmp_path / "results" / "a" / "ctx")


def test_baselines_name_the_run_of_the_first_setting_that_evaluates_their_set(tmp_path):
    spec = {**SPEC, "settings": [{"name": "b", "sets": ["held"]}, {"name": "c", "sets": ["ctx"]}]}
    evals = {s["set"]: args_of(s["cmd"]) for s in ablation.plan(spec, tmp_path) if s["name"] == "baselines"}
    assert evals["held"][evals["held"].index("--adapter") + 1] == str(tmp_path / "runs" / "b")
    assert evals["ctx"][evals["ctx"].index("--adapter") + 1] == str(tmp_path / "runs" / "c")  # so `--only c` runs alone


def test_table_reads_each_rows_results_and_skips_missing_ones(tmp_path):
    steps = ablation.plan(SPEC, tmp_path)

    def write(setting, method, score, recall):
        folder = tmp_path / "results" / setting / "held"
        folder.mkdir(parents=True)
        budgets = {b: {"recall": recall, "critical_recall": recall / 2, "critical_heads": 0.1,
                       "critical_recall_by_layer": [recall / 4, recall]} for b in ("8", "16")}
        (folder / "results.json").write_text(json.dumps({
            "prediction": {method: {"kl": 0.2, "records": 3, "budgets": budgets}},
            "answers": {"full": {"score": 0.75}, "methods": {method: {"8": {"score": score}, "16": {"score": 0.5}}}}}))

    write("baselines", "snapkv", 0.0, 0.6)
    write("a", "lookahead", 0.25, 0.8)
    rows, text = ablation.table({**SPEC, "budgets": ["8", "16"]}, steps, "8")
    assert set(rows["held"]) == {"snapkv", "a"}  # b and a+tail have no results yet
    assert rows["held"]["a"]["score@8"] == 0.25 and rows["held"]["a"]["critical_recall"] == 0.4
    assert "| a | 0.250 | 0.500 | 0.400 | 0.100 | 0.800 | 0.200 | - |" in text
    assert "full cache: 0.750; records: 3" in text and "### Commands" in text
    assert rows["held"]["a"]["critical_by_layer"] == [0.2, 0.8]
    pytest.importorskip("matplotlib")
    (plot,) = ablation.plot_layers(rows, "8", tmp_path)
    assert plot == tmp_path / "critical_by_layer-held.png" and plot.read_bytes()[:4] == b"\x89PNG"
    plot.unlink()
    assert ablation.plot_layers(rows, "8", tmp_path, only={"b"}) == [] and not plot.exists()  # b has no results
    assert ablation.plot_layers(rows, "8", tmp_path, only={"a"}) == [plot] and plot.exists()


def test_dry_run_prints_commands_and_writes_no_log(tmp_path, capsys, monkeypatch):
    path = tmp_path / "spec.yaml"
    import yaml

    path.write_text(yaml.safe_dump(SPEC))
    monkeypatch.setattr(sys, "argv", ["ablation.py"])
    ablation.main([str(path), "--out", str(tmp_path / "out"), "--dry-run", "--only", "a", "--sets", "held"])
    out = capsys.readouterr().out
    planned = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(planned) == 3  # a's training, held baselines, a's eval on held
    assert not (tmp_path / "out" / "ablation.log").exists()


def test_baseline_variants_run_on_their_own_with_their_overrides(tmp_path):
    variant = {"name": "oracle-global", "method": "oracle", "eval": {"scorers.oracle.allocation": "global"}}
    spec = {**SPEC, "baselines": ["snapkv", variant], "settings": [{"name": "a"}]}
    steps = ablation.plan(spec, tmp_path)
    held = [s for s in steps if s["kind"] == "eval" and s["set"] == "held"]
    assert [s["name"] for s in held] == ["baselines", "oracle-global", "a"]
    plain, own = args_of(held[0]["cmd"]), args_of(held[1]["cmd"])
    assert plain[plain.index("--methods") + 1] == "snapkv" and "scorers.oracle.allocation=global" not in plain
    assert own[own.index("--methods") + 1] == "oracle" and "scorers.oracle.allocation=global" in own
    assert own[own.index("--out") + 1] == str(tmp_path / "results" / "oracle-global" / "held")
    folder = tmp_path / "results" / "oracle-global" / "held"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "prediction": {"oracle": {"kl": 0.0, "records": 2, "budgets": {"8": {"recall": 0.9}}}},
        "answers": {"full": {"score": 0.5}, "methods": {"oracle": {"8": {"score": 0.5, "cache_ratio": 0.125,
                                                                              "padding_ratio": 0.01}}}}}))
    rows, text = ablation.table({**spec, "budgets": ["8"]}, steps, "8")
    assert rows["held"]["oracle-global"]["score@8"] == 0.5
    assert "| oracle-global | 0.500 | - | - | 0.900 | 0.000 | 12.5% (1.0% pad) |" in text


def test_an_evaluation_set_may_name_its_own_baselines(tmp_path):
    spec = {**SPEC, "eval_sets": {**SPEC["eval_sets"], "ctx": {"targets": ["held"], "baselines": ["streamingllm", "oracle"]}}}
    steps = ablation.plan(spec, tmp_path)
    methods = {s["set"]: args_of(s["cmd"])[args_of(s["cmd"]).index("--methods") + 1]
               for s in steps if s["name"] == "baselines"}
    assert methods == {"held": "snapkv", "ctx": "streamingllm,oracle"}


def test_finished_steps_are_skipped_so_two_drivers_can_share_an_out_folder(tmp_path, capsys):
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "out"
    (out / "runs" / "a" / "adapter").mkdir(parents=True)  # a finished training
    (out / "results" / "baselines" / "held").mkdir(parents=True)
    (out / "results" / "baselines" / "held" / "results.json").write_text("{}")  # a finished evaluation
    (out / "runs" / "b" / "checkpoints").mkdir(parents=True)
    (out / "runs" / "b" / "checkpoints" / "latest").write_text("step-000001")  # an interrupted one
    ablation.main([str(path), "--out", str(out), "--dry-run", "--only", "a,b", "--sets", "held"])
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(planned) == 3  # b's training (resumed), a's and b's evaluations on held
    assert "runs/b" in planned[0] and planned[0].endswith("--resume")
    assert all("results/baselines" not in line for line in planned)


def test_a_setting_may_train_on_other_targets(tmp_path):
    spec = {**SPEC, "settings": [{"name": "a"}, {"name": "short", "train_targets": ["held"]}]}
    trains = {s["name"]: args_of(s["cmd"]) for s in ablation.plan(spec, tmp_path) if s["kind"] == "train"}
    assert trains["a"][trains["a"].index("--data") + 1] == str(tmp_path / "targets" / "train")
    assert trains["short"][trains["short"].index("--data") + 1] == str(tmp_path / "targets" / "held")


def test_a_set_with_tasks_gets_a_table_per_task(tmp_path):
    spec = {**SPEC, "budgets": ["8"], "settings": [{"name": "a"}],
            "eval_sets": {"held": {"targets": ["held"], "tasks": ["needle"]}}}
    steps = ablation.plan(spec, tmp_path)
    folder = tmp_path / "results" / "a" / "held"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "prediction": {"lookahead": {"records": 4, "budgets": {}}},
        "answers": {"full": {"score": 0.5}, "methods": {"lookahead": {"8": {"score": 0.25}}},
                    "by_task": {"needle": {"full": 1.0, "lookahead": {"8": 0.5}},
                                "summarise": {"full": 0.0, "lookahead": {"8": 0.0}}}}}))
    rows, text = ablation.table(spec, steps, "8")
    assert rows["held"]["a"]["by_task"]["needle"] == {"full": 1.0, "score@8": 0.5}
    assert "#### held, task needle (full cache 1.000)" in text and "| a | 0.500 |" in text
    assert "task summarise" not in text


def test_an_evaluation_set_may_name_its_own_budgets(tmp_path):
    spec = {**SPEC, "eval_sets": {**SPEC["eval_sets"], "ctx": {"targets": ["held"], "budgets": [4]}}}
    budgets = {s["set"]: args_of(s["cmd"])[args_of(s["cmd"]).index("--budgets") + 1]
               for s in ablation.plan(spec, tmp_path) if s["kind"] == "eval"}
    assert budgets == {"held": "8,16", "ctx": "4"}


@pytest.mark.parametrize("spec_file", sorted((ROOT / "benchmarks" / "ablations").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_spec_plans_each_setting_on_sets_it_has(spec_file, tmp_path):
    import yaml

    spec = yaml.safe_load(spec_file.read_text())
    steps = ablation.plan(spec, tmp_path)
    evaluated = {step["name"] for step in steps if step["kind"] == "eval"}
    assert {setting["name"] for setting in spec["settings"] if setting.get("sets", True)} <= evaluated


def test_a_setting_naming_a_missing_set_is_one_line_error(tmp_path, capsys):
    bad = {**SPEC, "settings": [{"name": "a", "sets": ["held", "hled"]}]}
    with pytest.raises(ValueError, match="evaluation sets the spec lacks: hled"):
        ablation.plan(bad, tmp_path)
    with pytest.raises(ValueError, match="unknown `from` setting 'z'"):
        ablation.plan({**SPEC, "settings": [{"name": "a"}, {"name": "b", "from": "z"}]}, tmp_path)
    spec_file = tmp_path / "bad.yaml"
    spec_file.write_text(json.dumps(bad))  # JSON is YAML
    with pytest.raises(SystemExit) as stop:
        ablation.main([str(spec_file), "--out", str(tmp_path / "out")])
    assert stop.value.code == 2 and "hled" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_table_numbers_never_print_as_negative_zero():
    assert [ablation._fmt(v) for v in (None, -1e-7, 0.0, 0.1234, -0.25)] == ["-", "0.000", "0.000", "0.123", "-0.250"]


def write_results(folder, methods):
    """A results folder as ``lkv eval`` writes it: per method ({budget: answer score}, critical recall at 8)."""
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({
        "prediction": {m: {"records": 2, "budgets": {"8": {"critical_recall": crit}}} for m, (_, crit) in methods.items()},
        "answers": {"full": {"score": 1.0},
                    "methods": {m: {b: {"score": s} for b, s in scores.items()} for m, (scores, _) in methods.items()}}}))


def test_goals_table_reads_gap_recovered_lead_and_critical_share_against_the_baselines(tmp_path):
    spec = {**SPEC, "budgets": ["8", "16"], "baselines": ["snapkv", "kvzip", "oracle"],
            "settings": [{"name": "a", "sets": ["held"]}], "eval_sets": {"held": {"targets": ["held"]}}}
    steps = ablation.plan(spec, tmp_path)
    write_results(tmp_path / "results" / "baselines" / "held", {"snapkv": ({"8": 0.2, "16": 0.5}, 0.1),
                                                          "kvzip": ({"8": 0.1, "16": 0.7}, 0.2),
                                                          "oracle": ({"8": 0.6, "16": 0.5}, 0.4)})
    write_results(tmp_path / "results" / "a" / "held", {"lookahead": ({"8": 0.5, "16": 0.45}, 0.3)})
    _, text = ablation.table(spec, steps, "8")
    # gap at 8: (0.5 - 0.2) / (0.6 - 0.2); at 16 SnapKV equals the oracle, so no gap; lowest lead -0.05 (at 16);
    # critical recall 0.3 of the oracle's 0.4; leads over KVzip +0.4 and -0.25
    assert "| a | 75% | - | -0.050 | 75% | +0.400 | -0.250 |" in text
    section = text.split("#### held, goals")[1].split("###")[0]
    assert [line.split(" | ")[0] for line in section.splitlines() if line.startswith("| ")] == ["| setting", "| a"]


def test_goals_table_of_a_context_set_reads_the_lead_over_the_best_heuristic_and_the_share_of_the_oracle(tmp_path):
    spec = {**SPEC, "budgets": ["8", "16"], "settings": [{"name": "a", "sets": ["ctx"]}],
            "eval_sets": {"ctx": {"targets": ["held"], "eval": {"mode": "context"},
                                  "baselines": ["snapkv", "tova", "kvzip", "oracle",
                                                {"name": "oracle+global", "method": "oracle",
                                                 "eval": {"scorers.oracle.allocation": "global"}}]},
                          "whole": {"targets": ["held"], "baselines": ["snapkv", "tova", "oracle"]}}}
    steps = ablation.plan(spec, tmp_path)
    scores = {"snapkv": ({"8": 0.1, "16": 0.2}, 0.1), "tova": ({"8": 0.3, "16": 0.1}, 0.1),
              "kvzip": ({"8": 0.9, "16": 0.9}, 0.2), "oracle": ({"8": 0.5, "16": 0.8}, 0.4)}
    for set_name in ("ctx", "whole"):
        write_results(tmp_path / "results" / "baselines" / set_name, scores)
        write_results(tmp_path / "results" / "a" / set_name, {"lookahead": ({"8": 0.35, "16": 0.6}, 0.2)})
    # an oracle variant is no heuristic either
    write_results(tmp_path / "results" / "oracle+global" / "ctx", {"oracle": ({"8": 0.9, "16": 0.9}, 0.4)})
    _, text = ablation.table(spec, steps, "8")
    # the best heuristic is TOVA at 8 (0.3: lead +0.05) and SnapKV at 16 (0.2: lead +0.4), KVzip is no heuristic;
    # 0.6 is 75% of the oracle's 0.8 at the largest budget (16); the oracle variant's 0.9 is left out too
    assert "| a | 62% | 67% | +0.250 | 50% | -0.550 | -0.300 | +0.050 | 75% |" in text
    assert "ans@16 / oracle's" in text.split("#### ctx, goals")[1].split("###")[0]
    assert "best heuristic" not in text.split("#### whole, goals")[1]  # whole-mode sets keep the whole-mode goals
