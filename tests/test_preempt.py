"""Preemption: SIGTERM / SIGUSR1 stop collect, train and eval after the unit under way (or drop it once the
grace period is over), keep what was complete, exit 75, and a re-run resumes to the same result."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import adapter_weights, lkv
from tiny_models import save_tiny_model, tiny_loaded

import lkvcli.train.loop as loop
from lkvcli.lookahead import LookaheadConfig
from lkvcli.preempt import EXIT_PREEMPTED, StopRequest, Stopped
from lkvcli.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


def config(tiny_targets, out, **changes) -> TrainConfig:
    values = dict(data=[str(tiny_targets)], out=str(out), steps=10, batch_size=2, lr=1e-2, val_split=4, eval_every=0,
                  checkpoint_every=4, lookahead=LookaheadConfig(num_tokens=4, lora_dropout=0.1))
    return TrainConfig(**{**values, **changes})


def signal_during_step(monkeypatch, step: int, signum=signal.SIGTERM, linger: float = 0.0):
    """Send ``signum`` to this process inside training step ``step`` (1-based), mid-forward; then keep
    computing for ``linger`` seconds (a slow step)."""
    calls, real = [], loop.batch_loss

    def batch_loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            os.kill(os.getpid(), signum)
            time.sleep(linger)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "batch_loss", batch_loss)


def test_stop_request_waits_for_the_unit_then_drops_it_after_the_grace_period():
    with StopRequest(grace_s=30) as stop:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested and stop.signum == signal.SIGUSR1
        with pytest.raises(Stopped) as err:
            stop.check()
    assert err.value.preempted and not err.value.dropped
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    with pytest.raises(Stopped) as err, StopRequest(grace_s=0.05):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the unit outlives the grace period
    assert err.value.dropped and err.value.signum == signal.SIGTERM
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_train_signalled_mid_step_resumes_bit_identical(tiny_targets, tmp_path, monkeypatch, signum):
    train(config(tiny_targets, tmp_path / "straight"), loaded=tiny_loaded())
    signal_during_step(monkeypatch, 6, signum)
    with pytest.raises(Stopped) as err:
        train(config(tiny_targets, tmp_path / "cut"), loaded=tiny_loaded())
    assert err.value.preempted and not err.value.dropped
    assert (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip() == "step-000006"  # step 6 finished
    monkeypatch.undo()
    train(config(tiny_targets, tmp_path / "cut", resume=True), loaded=tiny_loaded())
    a, b = adapter_weights(tmp_path / "straight"), adapter_weights(tmp_path / "cut")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_step_outliving_the_grace_period_is_dropped(tiny_targets, tmp_path, monkeypatch):
    train(config(tiny_targets, tmp_path / "straight"), loaded=tiny_loaded())
    monkeypatch.setenv("LKV_GRACE_S", "0.2")
    signal_during_step(monkeypatch, 6, linger=5)
    with pytest.raises(Stopped) as err:
        train(config(tiny_targets, tmp_path / "cut"), loaded=tiny_loaded())
    assert err.value.dropped
    assert (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip() == "step-000005"  # 6 was dropped
    monkeypatch.undo()
    train(config(tiny_targets, tmp_path / "cut", resume=True), loaded=tiny_loaded())
    a, b = adapter_weights(tmp_path / "straight"), adapter_weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_commands_exit_75_and_say_so(tiny_targets, tmp_path, monkeypatch):
    import lkvcli.collect
    import lkvcli.evaluate.run

    model = save_tiny_model("llama", tmp_path / "model")
    signal_during_step(monkeypatch, 2)
    r = lkv("train", "--model", model, "--data", tiny_targets, "--out", tmp_path / "run", "--steps", 6, "val_split=4",
            "lookahead.num_tokens=2", "device=cpu")
    assert r.exit_code == EXIT_PREEMPTED and "preempted (SIGTERM): checkpoint at step 2 kept" in r.output, r.output

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"item {i} " * 6}) + "\n" for i in range(4)))
    calls, real = [], lkvcli.collect.collect_record

    def collect_record(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(lkvcli.collect, "collect_record", collect_record)
    args = ["collect", "--model", model, "--data", prompts, "--out", tmp_path / "t", "--max-new-tokens", 3,
            "--device", "cpu"]
    r = lkv(*args)
    assert r.exit_code == EXIT_PREEMPTED and "preempted (SIGTERM)" in r.output, r.output
    written = [json.loads(x)["id"] for x in (tmp_path / "t" / "records.jsonl").read_text().splitlines()]
    assert written == ["p0", "p1"]  # the record under way finished and was written; none after it
    monkeypatch.setattr(lkvcli.collect, "collect_record", real)
    assert lkv(*args).exit_code == 0
    assert len((tmp_path / "t" / "records.jsonl").read_text().splitlines()) == 4

    evaluated, real_record = [], lkvcli.evaluate.run.evaluate_record

    def evaluate_record(*a, **k):
        evaluated.append(1)
        if len(evaluated) == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        return real_record(*a, **k)

    monkeypatch.setattr(lkvcli.evaluate.run, "evaluate_record", evaluate_record)
    args = ["eval", "--targets", tmp_path / "t", "--methods", "snapkv,streamingllm", "--budgets", "4", "--parts",
            "prediction", "--split", "all", "--out", tmp_path / "res", "--device", "cpu"]
    r = lkv(*args)
    assert r.exit_code == EXIT_PREEMPTED and "preempted (SIGUSR1)" in r.output, r.output
    rows = (tmp_path / "res" / "predictions.jsonl").read_text().splitlines()
    assert {json.loads(x)["id"] for x in rows} == {"p0"}
    monkeypatch.setattr(lkvcli.evaluate.run, "evaluate_record", real_record)
    assert lkv(*args).exit_code == 0
    assert lkv(*[a if a != tmp_path / "res" else tmp_path / "res2" for a in args]).exit_code == 0
    ours, straight = (json.loads((tmp_path / f / "results.json").read_text())["prediction"] for f in ("res", "res2"))
    assert ours == straight


DRIVER = """
import os, signal, sys
import torch.distributed as dist
from tiny_models import tiny_loaded
import lkvcli.train.loop as loop
from lkvcli.lookahead import LookaheadConfig
from lkvcli.preempt import Stopped
from lkvcli.train import TrainConfig, train
data, out, cut, resume = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "resume"
calls, real = [], loop.batch_loss
def batch_loss(*args, **kwargs):  # rank 0 alone gets SIGTERM, mid-step
    calls.append(1)
    if len(calls) == cut and int(os.environ["RANK"]) == 0:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(*args, **kwargs)
loop.batch_loss = batch_loss
config = TrainConfig(data=[data], out=out, steps=8, batch_size=1, lr=1e-2, val_split=4, eval_every=0,
                     checkpoint_every=0, resume=resume, lookahead=LookaheadConfig(num_tokens=4))
try:
    train(config, loaded=tiny_loaded("llama"))
except Stopped:
    sys.exit(75)
finally:
    if dist.is_initialized():
        dist.destroy_process_group()
"""


def test_torchrun_preempted_then_resumed_equals_a_straight_run(tiny_targets, tmp_path):
    """2 CPU processes; rank 0 gets SIGTERM in step 3: both stop after the same step, the checkpoint is one,
    and resuming gives the weights of an uninterrupted 2-process run, bit for bit."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests")])}

    def launch(out, cut, resume="new"):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(script), str(tiny_targets), str(out), str(cut), resume], env=env, capture_output=True,
                              text=True, timeout=300)

    assert launch(tmp_path / "straight", 0).returncode == 0
    cut = launch(tmp_path / "cut", 3)
    assert cut.returncode != 0 and "75" in cut.stderr, cut.stderr[-3000:]
    latest = (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip()
    assert latest in ("step-000003", "step-000004")  # the step under way, or the next (the flag is shared there)
    assert launch(tmp_path / "cut", 0, "resume").returncode == 0
    a, b = adapter_weights(tmp_path / "straight"), adapter_weights(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)
