"""`lkv pipeline`: which subcommands a recipe turns into, and how re-runs resume."""

import pytest
import yaml

from lkvcli.commands.export import load_export_config
from lkvcli.commands.pipeline import _steps
from lkvcli.errors import LkvError

RECIPE = {"model": "m", "collect": {"out": "T"}, "train": {"out": "RUN"}, "eval": {"out": "RES"},
          "export": {"out": "BUNDLE"}}


def test_fresh_pipeline_runs_every_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    steps = _steps(RECIPE, str(path))
    assert [name for name, _ in steps] == ["collect", "train", "eval", "export"]
    assert steps[1][1] == ["train", str(path)]
    assert steps[3][1] == ["export", str(path), "--overwrite"]
    export = load_export_config(str(path), {}, [])  # what `lkv export RECIPE` resolves
    assert (export.run, export.out, export.eval) == ("RUN", "BUNDLE", None)  # no results yet


def test_rerun_resumes_training_and_keeps_a_finished_eval(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "RUN" / "checkpoints").mkdir(parents=True)
    (tmp_path / "RUN" / "checkpoints" / "latest").write_text("step-000010\n")
    (tmp_path / "RES").mkdir()
    (tmp_path / "RES" / "results.json").write_text("{}")
    (tmp_path / "RUN" / "checkpoints" / "step-000010" / "adapter").mkdir(parents=True)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(RECIPE))
    steps = dict(_steps(RECIPE, "r.yaml"))
    assert steps["train"] == ["train", "r.yaml", "resume=true"]
    assert "eval" not in steps and steps["export"] == ["export", "r.yaml", "--overwrite"]
    assert load_export_config("r.yaml", {}, []).eval == "RES"


def test_recipe_without_train_is_refused():
    with pytest.raises(LkvError, match="'train'"):
        _steps({"collect": {}}, "r.yaml")


def test_demo_recipe_sections_validate(tmp_path):
    from pathlib import Path

    from lkvcli.collect import CollectConfig
    from lkvcli.config import load_config
    from lkvcli.evaluate import EvalConfig
    from lkvcli.train import TrainConfig

    recipe = Path(__file__).resolve().parents[1] / "recipes" / "smollm2-135m-demo.yaml"
    assert load_config(CollectConfig, recipe, "collect", {}, []).max_new_tokens == 48
    train = load_config(TrainConfig, recipe, "train", {"data": [str(tmp_path)]}, [])
    assert train.lookahead.lora_rank == 8 and train.out == ".lkv-demo/run"
    assert load_config(EvalConfig, recipe, "eval", {}, []).adapter == train.out
