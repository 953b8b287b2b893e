"""One writer per folder: a second collect / train / eval into a folder in use is refused with one line
naming the holder; a lock whose process died is taken over (and logged); a clean exit leaves none."""

import json
import logging
import os
import socket
import subprocess
import sys
import textwrap

import pytest
from helpers import lkv, one_line_error
from tiny_models import save_tiny_model

from lkvcli.errors import LkvError
from lkvcli.locks import LOCK_FILE, folder_lock

HOLD = textwrap.dedent("""
    import sys, time
    from lkvcli.locks import folder_lock
    with folder_lock(sys.argv[1], "a test holder"):
        print("held", flush=True)
        time.sleep(float(sys.argv[2]))
""")


@pytest.fixture()
def holder(tmp_path):
    """Start a process holding ``folder``'s lock; yields (start(folder), the process)."""
    procs = []

    def start(folder, seconds=60):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), str(seconds)], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "held"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_held_folder_is_refused_naming_pid_and_host(tmp_path, holder):
    proc = holder(tmp_path / "f")
    with pytest.raises(LkvError) as err, folder_lock(tmp_path / "f", "lkv eval"):
        pass
    message = str(err.value)
    assert f"pid {proc.pid} on {socket.gethostname()}" in message and "a test holder" in message
    assert "\n" not in message


def test_a_killed_holders_lock_is_taken_over_and_logged(tmp_path, holder, caplog):
    proc = holder(tmp_path / "f")
    proc.kill()  # SIGKILL: no chance to clean up
    proc.wait()
    with caplog.at_level(logging.WARNING, logger="lkvcli"), folder_lock(tmp_path / "f", "lkv eval") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert f"left by a test holder, pid {proc.pid}" in caplog.text
    assert (tmp_path / "f" / LOCK_FILE).read_text() == ""  # released cleanly: nothing to take over
    with caplog.at_level(logging.WARNING, logger="lkvcli"):
        caplog.clear()
        with folder_lock(tmp_path / "f", "lkv eval"):
            pass
    assert "took over" not in caplog.text


def test_released_after_an_error_inside(tmp_path):
    with pytest.raises(ZeroDivisionError), folder_lock(tmp_path / "f", "x"):
        1 / 0
    with folder_lock(tmp_path / "f", "x"):
        pass


def test_commands_refuse_a_folder_in_use(tmp_path, holder):
    model = save_tiny_model("llama", tmp_path / "model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"item {i} " * 6}) + "\n" for i in range(4)))
    done = lkv("collect", "--model", model, "--data", prompts, "--out", tmp_path / "t", "--max-new-tokens", 3,
               "--device", "cpu")
    assert done.exit_code == 0, done.output
    assert (tmp_path / "t" / LOCK_FILE).read_text() == ""
    proc = holder(tmp_path / "t")
    one_line_error(lkv("collect", "--model", model, "--data", prompts, "--out", tmp_path / "t", "--max-new-tokens",
                       3, "--device", "cpu"), f"pid {proc.pid}", "is in use")
    holder(tmp_path / "run")
    one_line_error(lkv("train", "--model", model, "--data", tmp_path / "t", "--out", tmp_path / "run", "--steps", 1,
                       "val_split=1", "lookahead.num_tokens=2", "device=cpu"), "is in use")
    assert not (tmp_path / "run" / "config.json").exists()
    holder(tmp_path / "res")
    one_line_error(lkv("eval", "--targets", tmp_path / "t", "--methods", "snapkv", "--budgets", 4, "--parts",
                       "prediction", "--out", tmp_path / "res", "--device", "cpu"), "is in use")
    assert not (tmp_path / "res" / "predictions.jsonl").exists()
