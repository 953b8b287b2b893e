"""Fault injection at every write point of collect, train, eval and export (`lkvcli.faults`): the process dies
(``os._exit``, as under SIGKILL) at the first and at the last pass through each point; the same command run
again then ends exactly where an uninterrupted run ends: targets byte-identical, the final adapter bit-identical,
the eval aggregates identical, and the bundle either absent or complete and verified."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tiny_models import save_tiny_model

from lkvcli.bundle import read_bundle
from lkvcli.faults import FAULT_EXIT

TABLE: list[tuple[str, str, int, str]] = []  # (command, point, pass, result): printed at the end


def run(args, env_extra=None, check=True):
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env_extra or {})}
    env.pop("LKV_FAULT", None) if not env_extra or "LKV_FAULT" not in env_extra else None
    done = subprocess.run([sys.executable, "-m", "lkvcli", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=300)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    model = save_tiny_model("llama", root / "model")
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"item {i} " * 5}) + "\n" for i in range(5)))
    w = {"root": root, "model": model, "prompts": prompts}
    w["commands"] = {
        "collect": lambda out: ["collect", "--model", model, "--data", prompts, "--out", out, "--max-new-tokens", 3,
                                "--device", "cpu", "records_per_file=2"],
        "train": lambda out: ["train", "--model", model, "--data", root / "ref-collect", "--out", out, "--steps", 4,
                              "--batch-size", 2, "val_split=1", "checkpoint_every=2", "lookahead.num_tokens=2",
                              "device=cpu", "dtype=float32"],
        "eval": lambda out: ["eval", "--targets", root / "ref-collect", "--adapter", root / "ref-train", "--methods",
                             "lookahead,snapkv", "--budgets", "4,8", "--parts", "prediction,answers", "--split", "all",
                             "--out", out, "--device", "cpu", "decode_batch=2"],
        "export": lambda out: ["export", root / "ref-train", "--out", out, "--no-model-check"],
    }
    w["points"] = {}
    for name, command in w["commands"].items():  # the reference runs, tracing every write point
        trace = root / f"{name}.trace"
        run(command(root / f"ref-{name}"), {"LKV_FAULT_TRACE": str(trace)})
        w["points"][name] = Counter(trace.read_text().split())
    yield w
    print("\nfault table (command, point, pass, after resume):")
    for row in TABLE:
        print("  " + " | ".join(map(str, row)))


def same_files(a: Path, b: Path, skip=(".lkv.lock",)) -> bool:
    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file() and p.name not in skip}
    fa, fb = files(a), files(b)
    for manifest in ("manifest.json",):  # its creation time is the one field that differs
        for f in (fa, fb):
            if manifest in f:
                data = json.loads(f[manifest])
                data.pop("created", None)
                f[manifest] = json.dumps(data, sort_keys=True).encode()
    return fa == fb


def check(name: str, w: dict, out: Path) -> None:
    root = w["root"]
    if name == "collect":
        assert same_files(out, root / "ref-collect")
    elif name == "train":
        for f in ("adapter_model.safetensors", "lookahead_embeddings.safetensors"):
            assert (out / "adapter" / f).read_bytes() == (root / "ref-train" / "adapter" / f).read_bytes()
    elif name == "eval":
        ours, ref = (json.loads((d / "results.json").read_text()) for d in (out, root / "ref-eval"))
        assert ours["prediction"] == ref["prediction"] and ours["answers"] == ref["answers"]
    else:
        bundle = read_bundle(out)
        ref = read_bundle(root / "ref-export")
        tensors = ("adapter_model.safetensors", "lookahead_embeddings.safetensors")  # peft's config lists a set
        assert all(bundle.meta["files"][f] == ref.meta["files"][f] for f in tensors)


def cases():
    return [(name, point, first) for name in ("collect", "train", "eval", "export")
            for point in ("file-write", "journal-line", "folder-rename", "bundle-rename") for first in (True, False)]


@pytest.mark.parametrize("name, point, first", cases())
def test_a_fault_at_every_write_point_then_resume(world, name, point, first, tmp_path):
    passes = world["points"][name][point]
    if not passes or (not first and passes == 1):
        pytest.skip(f"{name} passes {point} {passes} time(s)")
    n = 1 if first else passes
    out = tmp_path / "out"
    command = world["commands"][name]
    died = run(command(out), {"LKV_FAULT": f"{point}:{n}"}, check=False)
    assert died.returncode == FAULT_EXIT, died.stderr[-2000:]
    if name == "export":  # absent, or complete and verified
        assert not out.exists() or read_bundle(out).meta["num_tokens"] == 2
    again = command(out)
    if name == "train" and (out / "checkpoints" / "latest").is_file():
        again = [*again, "--resume"]
    if name == "export":
        again = [*again, "--overwrite"]
    run(again)
    check(name, world, out)
    TABLE.append((name, point, f"{n}/{passes}", "pass"))


def test_every_command_passes_its_write_points(world):
    points = world["points"]
    # 5 records, 2 per file: each record pending at once (file + line), then 3 shards (file + lines)
    assert points["collect"]["file-write"] == 1 + 5 + 3 and points["collect"]["journal-line"] == 5 + 3
    assert points["train"]["folder-rename"] >= 3 and points["train"]["journal-line"] >= 2
    assert points["eval"]["journal-line"] >= 10 and points["export"]["bundle-rename"] == 1


@pytest.mark.parametrize("code, needle", [("ENOSPC", "no space left"), ("EROFS", "read-only"),
                                          ("EACCES", "permission denied")])
def test_disk_and_permission_faults_are_one_line_and_lose_nothing(world, tmp_path, code, needle):
    out = tmp_path / "t"
    command = world["commands"]["collect"](out)
    failed = run(command, {"LKV_FAULT": f"file-write:7:{code}"}, check=False)  # the second shard file
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert failed.returncode == 2 and "Traceback" not in failed.stderr
    assert len(errors) == 1 and needle in errors[0].lower() and "targets-00001.safetensors" in errors[0], errors
    kept = [json.loads(x)["id"] for x in (out / "records.jsonl").read_text().splitlines()]
    waiting = [json.loads(x)["id"] for x in (out / "pending.jsonl").read_text().splitlines()]
    assert kept == ["p0", "p1"] and waiting == ["p2", "p3"] and not list(out.rglob("*.tmp"))  # nothing lost
    if code == "ENOSPC":  # space freed: the same command completes the folder (the same for the others)
        run(command)
        assert same_files(out, world["root"] / "ref-collect")


def test_a_folder_replaced_mid_way_comes_back(tmp_path):
    """A crash between moving the old folder aside and renaming the new one in: the next run restores it."""
    from lkvcli.files import atomic_folder, remove_leftovers

    with atomic_folder(tmp_path / "adapter") as tmp:
        (tmp / "a.json").write_text("1")
    (tmp_path / "adapter").rename(tmp_path / ".adapter.old-123")  # as left by the crash
    remove_leftovers(tmp_path)
    assert (tmp_path / "adapter" / "a.json").read_text() == "1" and not list(tmp_path.glob(".*"))
    with atomic_folder(tmp_path / "adapter") as tmp:  # a normal replacement leaves nothing aside
        (tmp / "a.json").write_text("2")
    assert (tmp_path / "adapter" / "a.json").read_text() == "2" and not list(tmp_path.glob(".*"))
