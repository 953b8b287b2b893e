"""The training-run folder written by ``lkv train`` (format ``lkv-run``): its one reader and writer.

    config.json    the resolved TrainConfig           run.json   RunInfo: model, targets, validation ids
    metrics.jsonl  one JSON object per log / eval     adapter/   the final adapter (an adapter folder)
    checkpoints/step-000100/  adapter/ (an adapter folder), optimizer.{safetensors,json}, scheduler.json,
                              rng.safetensors, state.json (step, data position), config.json
    checkpoints/latest        name of the newest complete checkpoint (written atomically)

Every file is written aside and renamed into place; a checkpoint folder is assembled aside and
renamed whole, then ``latest`` moves to it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .adapter_folder import AdapterFiles, is_adapter_folder, read_adapter, save_adapter
from .errors import LkvError
from .files import (append_line, atomic_folder, load_file, read_json, read_jsonl, save_tensors_atomic, write_bytes_atomic,
                    write_json_atomic)
from .version import __version__

RUN_FORMAT = "lkv-run"
RUN_INFO = "run.json"
CONFIG = "config.json"
METRICS = "metrics.jsonl"
FINAL_ADAPTER = "adapter"
CHECKPOINTS = "checkpoints"
LATEST = "latest"


@dataclass
class RunInfo:
    """``run.json``: what a run was trained for and on (written once training has set up)."""

    model: dict  # source, fingerprint
    targets: dict = field(default_factory=dict)  # folders, records, model_source, settings
    processes: int = 1
    global_batch: int = 0
    total_steps: int = 0
    train_records: int = 0
    val_ids: list[str] = field(default_factory=list)
    excluded_tasks: list[str] = field(default_factory=list)
    mode: str = "whole"
    trainable_parameters: int = 0
    environment: dict = field(default_factory=dict)  # lkv / torch / transformers versions, threads, device
    lkv_version: str = __version__
    format: str = RUN_FORMAT
    version: int = 1


def is_run(run: Path) -> bool:
    return (Path(run) / RUN_INFO).is_file()


def write_run_info(run: Path, info: RunInfo) -> None:
    write_json_atomic(Path(run) / RUN_INFO, dataclasses.asdict(info))


def read_run_info(run: Path) -> RunInfo:
    data = read_json(Path(run) / RUN_INFO, "the run folder is damaged; train into a new --out")
    known = {f.name for f in dataclasses.fields(RunInfo)}
    if data.get("format") != RUN_FORMAT or "model" not in data:
        raise LkvError(f"{Path(run) / RUN_INFO} is not an lkv training run file")
    return RunInfo(**{k: v for k, v in data.items() if k in known})


def write_config(run: Path, config: dict) -> None:
    write_json_atomic(Path(run) / CONFIG, config)


def read_config(run: Path) -> dict:
    """The run's resolved training settings (empty when the file is absent)."""
    path = Path(run) / CONFIG
    return read_json(path, "the run folder is damaged") if path.is_file() else {}


# ------------------------------------------------------------------ metrics.jsonl
def append_metrics(run: Path, record: dict) -> None:
    append_line(Path(run) / METRICS, json.dumps(record))


def trim_metrics(run: Path, step: int) -> None:
    """Drop metric lines past ``step`` (left by a run that crashed after its last checkpoint)."""
    path = Path(run) / METRICS
    if path.is_file():
        keep = [row for row in read_jsonl(path, repair=True) if row["step"] <= step]
        write_bytes_atomic(path, "".join(json.dumps(row) + "\n" for row in keep).encode())


def val_history(run: Path, up_to: int | None = None) -> dict[int, float]:
    """Validation KL by step (up to ``up_to``), from ``metrics.jsonl``."""
    rows = read_jsonl(Path(run) / METRICS, fix="the run's metrics.jsonl is damaged")
    return {row["step"]: row["val_kl"] for row in rows
            if row.get("val_kl") is not None and (up_to is None or row.get("step", 0) <= up_to)}


# ------------------------------------------------------------------ checkpoints
def checkpoint_names(run: Path) -> list[str]:
    return sorted(p.name for p in (Path(run) / CHECKPOINTS).glob("step-*") if (p / FINAL_ADAPTER).is_dir())


def latest_checkpoint(run: Path) -> Path | None:
    """The checkpoint ``latest`` names (else the newest complete one); None when there is none."""
    names = checkpoint_names(run)
    if not names:
        return None
    pointer = Path(run) / CHECKPOINTS / LATEST
    name = pointer.read_text().strip() if pointer.is_file() else ""
    return Path(run) / CHECKPOINTS / (name if name in names else names[-1])


def find_checkpoint(run: Path, which: str = "latest") -> Path:
    """``latest``, ``step-N`` or ``N``: the checkpoint folder, or one LkvError saying what is there."""
    run = Path(run)
    if not is_run(run):
        raise LkvError(f"{run} is not a training run folder (no {RUN_INFO}); give the --out folder of `lkv train`")
    names = checkpoint_names(run)
    if not names:
        raise LkvError(f"{run} has no checkpoint yet (checkpoints/step-N); train it first, or wait for its first "
                       "checkpoint (train.checkpoint_every)")
    if which == "latest":
        return latest_checkpoint(run)
    name = which if which.startswith("step-") else f"step-{int(which):06d}" if which.isdigit() else which
    if name not in names:
        raise LkvError(f"--checkpoint {which}: not in {run / CHECKPOINTS}; available: {', '.join(names)} or latest")
    return run / CHECKPOINTS / name


def checkpoint_step(path: Path) -> int:
    return int(Path(path).name.split("-")[-1])


def read_checkpoint_adapter(run: Path, which: str = "latest") -> AdapterFiles:
    """The adapter of one checkpoint; a damaged one names the others to try."""
    path = find_checkpoint(run, which)
    others = [n for n in checkpoint_names(run) if n != path.name]
    hint = f"the checkpoint is damaged: export another one with --checkpoint ({', '.join(others) or 'none left'})"
    return read_adapter(path / FINAL_ADAPTER, hint)


def _split_tensors(obj, prefix: str, tensors: dict):
    """A state dict as JSON-able data, its tensors moved into ``tensors`` (never pickle)."""
    if isinstance(obj, torch.Tensor):
        tensors[prefix] = obj.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(obj, dict):
        if all(isinstance(k, str) for k in obj):
            return {k: _split_tensors(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
        return {"__items__": [[k, _split_tensors(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return [_split_tensors(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    return obj


def _join_tensors(obj, tensors: dict):
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__items__" in obj:
            return {k: _join_tensors(v, tensors) for k, v in obj["__items__"]}
        return {k: _join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_join_tensors(v, tensors) for v in obj]
    return obj


def save_state(folder: Path, name: str, state: dict) -> None:
    """A state dict (optimizer, scheduler, RNG) as ``name.json`` plus its tensors in ``name.safetensors``."""
    tensors: dict = {}
    data = _split_tensors(state, name, tensors)
    if tensors:
        save_tensors_atomic(folder / f"{name}.safetensors", tensors)
    write_json_atomic(folder / f"{name}.json", data)


def load_state(folder: Path, name: str) -> dict:
    path = folder / f"{name}.safetensors"
    tensors = load_file(str(path)) if path.is_file() else {}
    return _join_tensors(json.loads((folder / f"{name}.json").read_text()), tensors)


def save_checkpoint(run: Path, step: int, *, adapter, states: dict[str, dict], position: int, seed: int,
                    config: dict, keep: int) -> Path:
    """Write ``checkpoints/step-XXXXXX`` aside, rename it into place, move ``latest``, drop all but ``keep``."""
    root = Path(run) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    with atomic_folder(final) as tmp:
        save_adapter(adapter, tmp / FINAL_ADAPTER, {"step": step})
        for name, state in states.items():
            save_state(tmp, name, state)
        write_json_atomic(tmp / "state.json", {"step": step, "data_position": position, "seed": seed})
        write_json_atomic(tmp / CONFIG, config)
    write_bytes_atomic(root / LATEST, f"{final.name}\n".encode())
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, adapter, names: list[str]) -> tuple[dict, dict[str, dict]]:
    """Load a checkpoint's adapter weights into ``adapter``; returns (state.json, the named states)."""
    files = read_adapter(path / FINAL_ADAPTER, "resume from another checkpoint or start a new --out")
    adapter.load_parts(files.lora, files.embeddings)
    return json.loads((path / "state.json").read_text()), {name: load_state(path, name) for name in names}


def checkpoint_config(path: Path) -> dict:
    return json.loads((Path(path) / CONFIG).read_text())


def save_final_adapter(run: Path, adapter, metadata: dict) -> Path:
    """The run's ``adapter/``, replaced whole."""
    with atomic_folder(Path(run) / FINAL_ADAPTER) as tmp:
        save_adapter(adapter, tmp, metadata)
    return Path(run) / FINAL_ADAPTER


# ------------------------------------------------------------------ from an adapter path back to its run
def adapter_folder(path: Path) -> Path:
    """The adapter folder meant by ``path``: itself, a run's ``adapter/``, or its latest checkpoint's."""
    path = Path(path)
    latest = latest_checkpoint(path) if (path / CHECKPOINTS).is_dir() else None
    for folder in [path, path / FINAL_ADAPTER] + ([latest / FINAL_ADAPTER] if latest else []):
        if is_adapter_folder(folder):
            return folder
    raise LkvError(f"{path} holds no lookahead adapter; give a training run folder (lkv train --out), its adapter/ "
                   "folder, a checkpoint, or an exported bundle")


def run_of(folder: Path) -> Path | None:
    """The run folder at or above an adapter folder (run/, run/adapter, run/checkpoints/step-N/adapter)."""
    for parent in [Path(folder), *list(Path(folder).parents)[:3]]:
        if is_run(parent):
            return parent
    return None
