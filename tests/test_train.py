"""Training: loss, batching, resume, data parallel, guards and the `lkv train` command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import adapter_weights, one_line_error
from tiny_models import save_tiny_model, tiny_loaded, tiny_model
from typer.testing import CliRunner

from lkvcli.adapter_folder import read_adapter
from lkvcli.adapters import attach
from lkvcli.cli import app
from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig
from lkvcli.targets import TargetsReader
from lkvcli.train import TrainConfig, batch_kl, kl_per_example, lr_lambda, split_records, train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def targets(tiny_targets):
    return tiny_targets


def make_config(targets, out, **changes) -> TrainConfig:
    values = dict(data=[str(targets)], out=str(out), steps=6, batch_size=2, lr=1e-2, val_split=4, eval_every=3,
                  checkpoint_every=0, lookahead=LookaheadConfig(num_tokens=4))
    return TrainConfig(**{**values, **changes})


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_kl_skips_all_zero_rows():
    pred = torch.softmax(torch.randn(1, 2, 1, 5), -1)
    target = torch.softmax(torch.randn(1, 2, 1, 5), -1)
    target[0, 1] = 0  # e.g. a sliding-window layer without ground truth
    row0 = (target[0, 0, 0] * (target[0, 0, 0] / pred[0, 0, 0]).log()).sum()
    torch.testing.assert_close(kl_per_example(target, pred), row0.view(1))
    assert kl_per_example(pred, pred).abs().max() < 1e-6


def test_batch_equals_per_example_loss_and_grads(targets):
    reader = TargetsReader(targets)
    records = [reader[i] for i in range(4)]
    assert len({r.prompt_len for r in records}) > 1
    adapter = LookaheadAdapter.attach(tiny_model("llama"), LookaheadConfig(num_tokens=4))
    with torch.no_grad():
        for name, p in adapter.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    params = [p for _, p in adapter.named_parameters()]

    def run(batches):
        for p in params:
            p.grad = None
        losses = torch.cat([batch_kl(adapter, b) for b in batches])
        losses.sum().backward()
        return losses.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    loss_b, grads_b = run([records])
    loss_1, grads_1 = run([[r] for r in records])
    torch.testing.assert_close(loss_b, loss_1, atol=1e-6, rtol=1e-5)
    for gb, g1 in zip(grads_b, grads_1):
        torch.testing.assert_close(gb, g1, atol=1e-5, rtol=1e-4)  # float32 sums in another order


def test_validation_split_is_seeded_and_by_id():
    ids = [f"r{i}" for i in range(40)]
    train_idx, val_idx = split_records(ids, 0.25, seed=3)
    assert len(val_idx) == 10 and not set(train_idx) & set(val_idx)
    assert split_records(ids, 10, seed=3) == (train_idx, val_idx)
    assert split_records(ids, 10, seed=4)[1] != val_idx
    shuffled = ids[::-1]  # the same ids in another order select the same validation records
    assert {shuffled[i] for i in split_records(shuffled, 10, seed=3)[1]} == {ids[i] for i in val_idx}


def test_schedule_warmup_then_cosine():
    f = lr_lambda(TrainConfig(data=["."], schedule="cosine", warmup_steps=2, min_lr_ratio=0.1), total_steps=12)
    assert [f(0), f(1), f(2)] == [0.5, 1.0, 1.0]
    assert f(7) == pytest.approx(0.55) and f(12) == pytest.approx(0.1)
    assert lr_lambda(TrainConfig(data=["."], schedule="linear"), 10)(5) == pytest.approx(0.5)


def test_training_lowers_val_kl_and_writes_run_folder(targets, tmp_path):
    events = []
    summary = train(make_config(targets, tmp_path / "run", steps=12), on_event=events.append, loaded=tiny_loaded())
    assert summary["val_kl"] < summary["val_kl_start"]
    run = tmp_path / "run"
    assert {"config.json", "run.json", "metrics.jsonl", "adapter", "checkpoints"} <= {p.name for p in run.iterdir()}
    info = json.loads((run / "run.json").read_text())
    assert info["model"]["fingerprint"]["weights"] and len(info["val_ids"]) == 4 and info["lkv_version"]
    assert info["environment"]["torch"] == torch.__version__ and info["environment"]["threads"] == torch.get_num_threads()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0] == {"step": 0, "val_kl": summary["val_kl_start"]} and metrics[-1]["step"] == 12
    assert [e.kind for e in events][:2] == ["start", "note"] and events[-1].kind == "done"
    assert events[-1].data["val_kl"] == summary["val_kl"] and events[1].data["val_kl"] == summary["val_kl_start"]
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    files = {p.name for p in checkpoint.rglob("*") if p.is_file()}
    assert files and all(f.endswith((".json", ".safetensors")) for f in files)  # no pickles
    assert not list((run / "checkpoints").glob(".tmp-*"))
    adapter = attach(tiny_model("llama"), read_adapter(run / "adapter"))
    assert torch.equal(adapter.embeddings.detach(), adapter_weights(run)["embeddings"])


def test_resume_after_interrupt_equals_straight_run(targets, tmp_path):
    straight = train(make_config(targets, tmp_path / "a", steps=20, checkpoint_every=4), loaded=tiny_loaded())

    def interrupt_at_10(event):
        if event.kind == "advance" and event.done == 10:
            raise KeyboardInterrupt

    config = make_config(targets, tmp_path / "b", steps=20, checkpoint_every=4)
    with pytest.raises(KeyboardInterrupt):
        train(config, on_event=interrupt_at_10, loaded=tiny_loaded())
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text().strip() == "step-000010"
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").glob("step-*")) == ["step-000008", "step-000010"]
    with pytest.raises(Exception, match="--resume"):
        train(config, loaded=tiny_loaded())
    resumed = train(make_config(targets, tmp_path / "b", steps=20, checkpoint_every=4, resume=True),
                    loaded=tiny_loaded())
    assert max_diff(adapter_weights(tmp_path / "a"), adapter_weights(tmp_path / "b")) <= 1e-6
    assert resumed["val_kl"] == pytest.approx(straight["val_kl"], abs=1e-6)
    steps = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps)


DRIVER = """
import sys
import torch.distributed as dist
from tiny_models import tiny_loaded
from lkvcli.lookahead import LookaheadConfig
from lkvcli.train import TrainConfig, train
data, out, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
train(TrainConfig(data=[data], out=out, steps=6, batch_size=batch, lr=1e-2, val_split=4, eval_every=3,
                  checkpoint_every=0, lookahead=LookaheadConfig(num_tokens=4)), loaded=tiny_loaded("llama"))
if dist.is_initialized():
    dist.destroy_process_group()
"""


def test_two_processes_equal_one_process(targets, tmp_path):
    """Data parallel over 2 CPU processes (gloo, torchrun) == 1 process with the same global batch of 4:
    final weights within 1e-5 (only the order of float sums differs)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
              str(targets), str(tmp_path / "two"), "2"]
    done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    train(make_config(targets, tmp_path / "one", batch_size=4), loaded=tiny_loaded())
    assert json.loads((tmp_path / "two" / "run.json").read_text())["processes"] == 2
    assert max_diff(adapter_weights(tmp_path / "one"), adapter_weights(tmp_path / "two")) < 1e-5


# ---------------------------------------------------------------- the command

runner = CliRunner()


@pytest.mark.parametrize("body, needle", [
    ("train:\n  data: [{data}]\n  learning_rate: 0.1\n", "learning_rate"),
    ("train:\n  data: [{data}]\n  steps: many\n", "steps"),
    ("train:\n  data: [{data}]\n  lookahead:\n    tokens: 4\n", "tokens"),
    ("train:\n  data: [{data}]\n  lookahead:\n    num_tokens: 1.5\n", "lookahead.num_tokens"),
    ("train:\n  data: [/nonexistent/targets]\n", "data"),
])
def test_bad_recipes_fail_with_one_line(targets, tmp_path, body, needle):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(body.format(data=targets))
    one_line_error(runner.invoke(app, ["train", str(recipe), f"out={tmp_path / 'run'}"]), needle, alone=True)


def test_bad_override_fails_with_one_line(targets, tmp_path):
    one_line_error(runner.invoke(app, ["train", "--data", str(targets), "schedule=wavy"]), "schedule", alone=True)


def test_foreign_targets_are_refused(targets, tmp_path):
    other = save_tiny_model("llama", tmp_path / "other-model", seed=1)
    result = runner.invoke(app, ["train", "--model", str(other), "--data", str(targets), "--out", str(tmp_path / "r")])
    one_line_error(result, "collected for model", "fingerprints differ", alone=True)


def test_cli_trains_from_recipe_with_overrides(targets, tmp_path):
    model = save_tiny_model("llama", tmp_path / "model", seed=0)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model: {model}\ntrain:\n  data: [{targets}]\n  steps: 50\n  batch_size: 2\n  val_split: 4\n")
    run = tmp_path / "run"
    result = runner.invoke(app, ["train", str(recipe), "--steps", "3", "--out", str(run), "lookahead.num_tokens=4",
                                 "lr=0.005"])
    assert result.exit_code == 0, result.output
    assert "train: 3/3 loss" in result.output and "val KL" in result.output
    config = json.loads((run / "config.json").read_text())
    assert config["steps"] == 3 and config["lr"] == 0.005 and config["lookahead"]["num_tokens"] == 4
    assert (run / "adapter" / "adapter_model.safetensors").is_file()
    help_text = runner.invoke(app, ["train", "--help"]).output
    assert "lookahead.num_tokens=32" in help_text and "--resume" in help_text
