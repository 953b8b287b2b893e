"""``lkv train``: fit the lookahead module to collected targets (library code: no printing).

Each step prefills every prompt alone without grad (adapter off; kept across epochs by
:class:`PrefillCache` within ``prefill_cache_mb``), left-pads them into one batch cache, runs the
N lookahead tokens over it with grad (adapter on) and minimises KL(target || prediction), averaged over
layers and KV heads (all-zero target rows skipped) and over examples. Data parallel through
``accelerate``: every process takes its share of the global batch and the gradients are
summed across processes, so the result does not depend on the number of processes.

Run folder (``out``)::

    config.json   resolved TrainConfig           run.json   model, targets, lkv version, validation ids
    metrics.jsonl one JSON object per log / eval  adapter/   the final adapter (LookaheadAdapter.save)
    checkpoints/step-000100/  adapter/, optimizer.{safetensors,json}, scheduler.json, rng.safetensors,
                              state.json (step, data position), config.json
    checkpoints/latest        name of the newest complete checkpoint (written atomically)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
import typing
from typing import Callable, Literal

import torch

from . import __version__
from .config import to_dict
from .context_mode import TrainingRecords
from .errors import LkvError
from .lookahead import LookaheadAdapter, LookaheadConfig, left_pad
from .models import DEFAULT_MODEL, LoadedModel, same_model
from .objective import ObjectiveConfig, kl_per_example, loss_per_example, record_target  # noqa: F401 (re-exported)
from .targets import TargetsReader, atomic_folder, save_tensors_atomic, write_bytes_atomic, write_json_atomic

RUN_FORMAT = "lkv-run"
# Fields that may differ when resuming (they do not change what has been computed so far).
RESUMABLE = {"out", "steps", "epochs", "eval_every", "checkpoint_every", "keep_checkpoints", "log_every", "resume",
             "log_with", "device", "prefill_cache_mb"}


@dataclass
class TrainConfig:
    """The ``train`` section of a recipe; every field can be overridden with KEY=VALUE."""

    model: str = DEFAULT_MODEL
    data: list[str] = field(default_factory=list)  # targets folders written by `lkv collect`
    out: str = "runs/lookahead"
    device: str = "auto"
    dtype: str = "auto"
    val_split: float = 0.1  # < 1: fraction of the records; >= 1: number of records (chosen by seeded hash of the id)
    lookahead: LookaheadConfig = field(default_factory=LookaheadConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    exclude_tasks: list[str] = field(default_factory=list)  # records of these built-in tasks are left out (held out)
    mode: Literal["whole", "context", "both"] = "whole"  # the lookahead tokens follow the prompt, the context, or either
    optimizer: Literal["adamw"] = "adamw"
    lr: float = 2e-3
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0  # 0 = no clipping
    schedule: Literal["constant", "cosine", "linear"] = "cosine"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0  # floor of the cosine / linear decay, relative to lr
    steps: int | None = None  # optimiser steps; when unset, `epochs` passes over the training records
    epochs: float = 1.0
    batch_size: int = 4  # examples per forward pass, per process
    grad_accum: int = 1  # forward passes per optimiser step; global batch = batch_size * grad_accum * processes
    seed: int = 0
    eval_every: int = 50  # steps between validation passes (0: only at start and end)
    checkpoint_every: int = 100  # steps between checkpoints (0: only at the end and on Ctrl-C)
    keep_checkpoints: int = 2
    log_every: int = 1
    log_with: str | None = None  # an accelerate tracker (tensorboard, wandb) when installed
    prefill_cache_mb: float = 4096.0  # per process: prompt prefills kept across epochs (CPU memory); 0 = off
    resume: bool = False

    def validate(self) -> None:
        if not self.data:
            raise LkvError("data: no targets folder given; set data in the recipe or pass --data FOLDER")
        for folder in self.data:
            if not Path(folder).is_dir():
                raise LkvError(f"data: targets folder {folder} not found; run `lkv collect --out {folder}` first")
        checks = [
            (self.lr > 0, "lr", "must be > 0"),
            (self.val_split >= 0, "val_split", "must be >= 0"),
            (self.steps is None or self.steps >= 1, "steps", "must be at least 1"),
            (self.epochs > 0, "epochs", "must be > 0"),
            (self.prefill_cache_mb >= 0, "prefill_cache_mb", "must be >= 0 (0: off)"),
            (self.batch_size >= 1, "batch_size", "must be at least 1"),
            (self.grad_accum >= 1, "grad_accum", "must be at least 1"),
            (self.warmup_steps >= 0, "warmup_steps", "must be >= 0"),
            (0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be in [0, 1]"),
            (len(self.betas) == 2, "betas", "must be two numbers"),
            (min(self.eval_every, self.checkpoint_every, self.log_every - 1, self.keep_checkpoints - 1) >= 0,
             "eval_every/checkpoint_every/log_every/keep_checkpoints", "out of range"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise LkvError(f"{name}: {why}")
        self.objective.validate()


# ---------------------------------------------------------------- data

def split_records(ids: list[str], val_split: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) indices; validation = the records whose seeded id hash is smallest."""
    count = int(val_split) if val_split >= 1 else round(val_split * len(ids))
    if count >= len(ids):
        raise LkvError(f"val_split: {val_split} leaves no training records out of {len(ids)}")
    rank = sorted(range(len(ids)), key=lambda i: hashlib.sha256(f"{seed}:{ids[i]}".encode()).digest())
    val = sorted(rank[:count])
    chosen = set(val)
    return [i for i in range(len(ids)) if i not in chosen], val


def usable_split(reader: TargetsReader, config: TrainConfig) -> tuple[list[int], list[int]]:
    """(train, validation) record indices, leaving out ``exclude_tasks``; checks the objective's targets exist."""
    excluded = set(config.exclude_tasks)
    tasks = {reader.meta(i).get("task") for i in range(len(reader))}
    unknown = sorted(excluded - tasks)
    if unknown:
        raise LkvError(f"exclude_tasks: no record has task {unknown[0]!r}; tasks in these targets: "
                       f"{', '.join(sorted(map(str, tasks)))}")
    usable = [i for i in range(len(reader)) if reader.meta(i).get("task") not in excluded]
    if not usable:
        raise LkvError("exclude_tasks leaves no record to train on")
    if config.objective.needs_max and any("max" not in reader.meta(i).get("extra_targets", []) for i in usable):
        raise LkvError(f"objective.target={config.objective.target} needs max targets, which {reader.folders[0]} "
                       "lacks; re-collect with extra_targets=max (collect's default) or use objective.target=mean")
    train, val = split_records([reader.ids()[i] for i in usable], config.val_split, config.seed)
    return [usable[i] for i in train], [usable[i] for i in val]


def data_order(train: list[int], seed: int, start: int, count: int) -> list[int]:
    """Positions ``start..start+count`` of the endless stream of seeded per-epoch permutations."""
    n, perms = len(train), {}
    for epoch in range(start // n, (start + count - 1) // n + 1):
        perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return [train[perms[pos // n][pos % n]] for pos in range(start, start + count)]


class PrefillCache:
    """Each prompt prefilled alone (keys and values per layer), kept in CPU memory for later epochs:
    first come, first kept while the tensor bytes fit in ``budget_mb`` (never evicted); per process.

    Prompts are prefilled one by one, cached or not, and only then left-padded into a batch: a
    prompt's cache then does not depend on what it is batched with, so caching changes nothing.
    """

    def __init__(self, budget_mb: float = 0.0):
        self.budget, self.used, self.hits, self.misses = int(budget_mb * 2**20), 0, 0, 0
        self.kept: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def prompt(self, adapter: LookaheadAdapter, record) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) of every layer, each (1, kv_heads, length, head_dim), of ``record``'s prompt alone."""
        if record.id in self.kept:
            self.hits += 1
            return self.kept[record.id]
        self.misses += 1
        layers = [(layer.keys, layer.values) for layer in adapter.prefill(record.prompt_ids.view(1, -1)).layers]
        size = sum(t.numel() * t.element_size() for pair in layers for t in pair)
        if self.used + size <= self.budget and not torch.is_inference_mode_enabled():  # unusable under grad
            self.kept[record.id] = layers = [(k.cpu(), v.cpu()) for k, v in layers]
            self.used += size
        return layers

    def batch(self, adapter: LookaheadAdapter, records):
        """The records' prompts left-padded into one ``DynamicCache`` (pad entries zero)."""
        from transformers import DynamicCache

        prompts = [self.prompt(adapter, r) for r in records]
        cache = DynamicCache(config=adapter.base_model.config)
        for i, layer in enumerate(cache.layers):
            keys, values = (_right_align([p[i][j] for p in prompts], adapter.device) for j in (0, 1))
            layer.update(keys, values)
            if hasattr(layer, "cumulative_length"):  # sliding window: it holds fewer keys than it has seen
                layer.cumulative_length = max(r.prompt_len for r in records)
        return cache

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "prompts": len(self.kept), "mb": self.used / 2**20,
                "budget_mb": self.budget / 2**20}


def _right_align(parts: list[torch.Tensor], device) -> torch.Tensor:
    """(1, H, l_b, D) tensors into one (B, H, max l_b, D), each at the right end, zeros before it."""
    width = max(t.shape[-2] for t in parts)
    out = parts[0].new_zeros((len(parts), parts[0].shape[1], width, parts[0].shape[-1]), device=device)
    for row, t in enumerate(parts):
        out[row, :, width - t.shape[-2]:] = t[0]
    return out


def batch_loss(adapter: LookaheadAdapter, records, prefills: PrefillCache | None = None,
               objective: ObjectiveConfig | None = None) -> torch.Tensor:
    """(B,) loss of each record's prediction under ``objective`` (None: KL against the mean target,
    the validation metric); the records are left-padded into one batch."""
    mask = left_pad([r.prompt_ids for r in records])[1]
    if bool(mask.all()):
        mask = None
    cache = (prefills if prefills is not None else PrefillCache()).batch(adapter, records)
    pred = adapter.score(cache, attention_mask=mask)
    target = torch.zeros_like(pred)
    for row, record in enumerate(records):
        target[row, ..., target.shape[-1] - record.prompt_len:] = (record_target(record, objective) if objective
                                                                    else record.target)
    return loss_per_example(target, pred, objective)


def batch_kl(adapter: LookaheadAdapter, records, prefills: PrefillCache | None = None) -> torch.Tensor:
    """(B,) KL(mean target || prediction) of each record."""
    return batch_loss(adapter, records, prefills)


# ---------------------------------------------------------------- optimiser, schedule, checkpoints

def lr_lambda(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """Multiplier of ``lr`` at a step: linear warmup, then constant / cosine / linear decay to min_lr_ratio."""
    warm, floor = config.warmup_steps, config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        decay = 0.5 * (1 + math.cos(math.pi * progress)) if config.schedule == "cosine" else 1 - progress
        return floor + (1 - floor) * decay

    return factor


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
    tensors: dict = {}
    data = _split_tensors(state, name, tensors)
    if tensors:
        save_tensors_atomic(folder / f"{name}.safetensors", tensors)
    write_json_atomic(folder / f"{name}.json", data)


def load_state(folder: Path, name: str) -> dict:
    from safetensors.torch import load_file

    path = folder / f"{name}.safetensors"
    tensors = load_file(str(path)) if path.is_file() else {}
    return _join_tensors(json.loads((folder / f"{name}.json").read_text()), tensors)


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def latest_checkpoint(run: Path) -> Path | None:
    pointer = run / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = run / "checkpoints" / pointer.read_text().strip()
    return path if path.is_dir() else None


def save_checkpoint(run: Path, step: int, adapter, optimizer, scheduler, config: TrainConfig, position: int,
                    keep: int) -> Path:
    """Write ``checkpoints/step-XXXXXX`` aside, rename it into place, then move the ``latest`` pointer."""
    root = run / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step-{step:06d}"
    final = root / name
    with atomic_folder(final) as tmp:
        adapter.save(tmp / "adapter")
        save_state(tmp, "optimizer", optimizer.state_dict())
        save_state(tmp, "scheduler", scheduler.state_dict())
        save_state(tmp, "rng", _rng_state())
        write_json_atomic(tmp / "state.json", {"step": step, "data_position": position, "seed": config.seed})
        write_json_atomic(tmp / "config.json", to_dict(config))
    write_bytes_atomic(root / "latest", f"{name}\n".encode())
    for old in sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path, adapter, optimizer, scheduler) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "adapter" / "adapter.safetensors"))
    adapter.load_parts({k[5:]: v for k, v in tensors.items() if k.startswith("lora.")}, tensors["embeddings"])
    optimizer.load_state_dict(load_state(path, "optimizer"))
    scheduler.load_state_dict(load_state(path, "scheduler"))
    rng = load_state(path, "rng")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((path / "state.json").read_text())


# ---------------------------------------------------------------- the run

class _StopFlag:
    """First Ctrl-C asks for a clean stop at the next step boundary (checkpoint, then KeyboardInterrupt);
    a second one interrupts at once."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _prepare_run(config: TrainConfig, run: Path) -> Path | None:
    """Check the run folder against ``resume``; returns the checkpoint to resume from."""
    latest = latest_checkpoint(run)
    if not config.resume:
        if latest is not None or (run / "config.json").exists():
            raise LkvError(f"{run} already holds a training run; pass --resume to continue it or choose another --out")
        return None
    if latest is None:
        raise LkvError(f"--resume: no checkpoint in {run / 'checkpoints'}; run without --resume to start")
    saved = json.loads((latest / "config.json").read_text())
    now = to_dict(config)
    changed = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE and saved.get(k) != now.get(k))
    if changed:
        raise LkvError(f"--resume: {changed[0]} differs from the checkpoint's ({saved.get(changed[0])!r} vs "
                       f"{now.get(changed[0])!r}); resume with the same settings or use another --out")
    return latest


def _check_targets(reader: TargetsReader, loaded: LoadedModel, config: TrainConfig) -> None:
    manifest = reader.manifest
    if not same_model(reader.fingerprint, loaded.fingerprint):
        differ = [k for k in ("config", "tokenizer", "weights") if reader.fingerprint.get(k) != loaded.fingerprint.get(k)]
        raise LkvError(f"data: targets in {reader.folders[0]} were collected for model {manifest['model']['source']!r}, "
                       f"not for the loaded {loaded.source!r} (fingerprints differ: {', '.join(differ)}); train with "
                       "that model or collect targets with this one")
    reduction = manifest.get("settings", {}).get("reduction", config.lookahead.reduction)
    if reduction != config.lookahead.reduction:
        raise LkvError(f"lookahead.reduction: {config.lookahead.reduction!r} differs from the targets' {reduction!r}; "
                       f"set lookahead.reduction={reduction}")
    if len(reader) == 0:
        raise LkvError(f"data: {reader.folders[0]} holds no records yet")


def evaluate(adapter: LookaheadAdapter, records, indices: list[int], batch_size: int,
             accelerator=None, prefills: PrefillCache | None = None) -> float | None:
    """Mean per-example KL(target || lookahead) over the ``indices`` of ``records`` (a targets reader or
    :class:`lkvcli.context_mode.TrainingRecords`), split across processes."""
    if not indices:
        return None
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = indices[rank::world]
    total = torch.zeros(2, dtype=torch.float64, device=adapter.device)
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            kl = batch_kl(adapter, [records[j] for j in mine[i:i + batch_size]], prefills)
            total[0] += kl.sum().double()
            total[1] += kl.numel()
    if world > 1:
        total = accelerator.reduce(total, "sum")
    return float(total[0] / total[1])


def train(config: TrainConfig, on_event: Callable[[dict], None] | None = None,
          loaded: LoadedModel | None = None) -> dict:
    """Train a lookahead adapter; returns the summary. ``on_event`` gets dicts (start, eval, step,
    checkpoint, done) on the main process. ``loaded`` skips loading ``config.model`` (tests)."""
    from accelerate import Accelerator

    from .models import load_model, resolve_device

    if config.log_with and importlib.util.find_spec(config.log_with) is None:
        raise LkvError(f"log_with: tracker {config.log_with!r} is not installed; `pip install {config.log_with}` "
                       "or drop log_with")
    on_cpu = config.device == "cpu" or (config.device == "auto" and resolve_device("auto").type == "cpu")
    accelerator = Accelerator(cpu=on_cpu, log_with=config.log_with or None, project_dir=config.out)  # cpu: gloo
    rank, world, main = accelerator.process_index, accelerator.num_processes, accelerator.is_main_process
    emit = on_event if (on_event and main) else (lambda event: None)
    run = Path(config.out)
    resume_from = _prepare_run(config, run)
    accelerator.wait_for_everyone()  # every process has checked the run folder before the main one writes to it
    reader = TargetsReader(config.data)
    if loaded is None:
        device = accelerator.device if config.device == "auto" or world > 1 else resolve_device(config.device)
        loaded = load_model(config.model, device=str(device), dtype=config.dtype)
    _check_targets(reader, loaded, config)
    train_records, val_records = usable_split(reader, config)
    records = TrainingRecords(reader, config.mode, loaded.tokenizer)
    train_idx, val_idx = records.items(train_records), records.items(val_records)
    per_step = config.batch_size * config.grad_accum * world
    total = config.steps or max(1, math.ceil(config.epochs * len(train_idx) / per_step))

    adapter = LookaheadAdapter.attach(loaded.model, config.lookahead, seed=config.seed)
    params = [p for _, p in adapter.named_parameters()]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=tuple(config.betas), weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config, total))
    start = 0
    if resume_from is not None:
        start = load_checkpoint(resume_from, adapter, optimizer, scheduler)["step"]
    if main:
        run.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run / "config.json", to_dict(config))
        write_json_atomic(run / "run.json", {
            "format": RUN_FORMAT, "version": 1, "lkv_version": __version__,
            "model": {"source": loaded.source, "fingerprint": loaded.fingerprint},
            "targets": {"folders": [str(f) for f in reader.folders], "records": len(reader),
                        "model_source": reader.manifest["model"]["source"],
                        "settings": reader.manifest.get("settings", {})},
            "processes": world, "global_batch": per_step, "total_steps": total, "train_records": len(train_idx),
            "val_ids": [reader.ids()[i] for i in val_records], "excluded_tasks": sorted(config.exclude_tasks), "mode": config.mode,
            "trainable_parameters": adapter.num_parameters(),
        })
        _trim_metrics(run / "metrics.jsonl", start)
    if config.log_with:
        accelerator.init_trackers("lkv-train", config=_flat(to_dict(config)))

    def log(record: dict) -> None:
        if main:
            with open(run / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(record) + "\n")
        if config.log_with:
            accelerator.log({k: v for k, v in record.items() if k != "step" and v is not None}, step=record["step"])

    def checkpoint(step: int) -> None:
        if main and not (run / "checkpoints" / f"step-{step:06d}").is_dir():
            path = save_checkpoint(run, step, adapter, optimizer, scheduler, config, step * per_step,
                                   config.keep_checkpoints)
            emit({"event": "checkpoint", "step": step, "path": str(path)})
        accelerator.wait_for_everyone()

    emit({"event": "start", "start_step": start, "total_steps": total, "train_records": len(train_idx),
          "val_records": len(val_idx), "global_batch": per_step, "processes": world,
          "trainable_parameters": adapter.num_parameters(), "run": str(run)})
    t0 = time.perf_counter()
    prefills = PrefillCache(config.prefill_cache_mb)
    val_kl = first_val = evaluate(adapter, records, val_idx, config.batch_size, accelerator, prefills)
    if start == 0:
        log({"step": 0, "val_kl": val_kl})
    emit({"event": "eval", "step": start, "val_kl": val_kl})
    shares = config.batch_size * config.grad_accum

    def update(step: int, stop_requested: bool) -> tuple[float, bool]:
        """One optimiser step over this process's share of global batch ``step``; (loss, stop asked anywhere)."""
        torch.manual_seed(config.seed * 1_000_003 + step * 101 + rank)  # dropout: resumable, per process
        mine = data_order(train_idx, config.seed, step * per_step, per_step)[rank * shares:(rank + 1) * shares]
        mine.sort(key=lambda i: records.meta(i)["prompt_len"])  # similar lengths share a micro-batch
        loss_sum = torch.zeros((), device=adapter.device)
        for a in range(config.grad_accum):
            part = batch_loss(adapter, [records[i] for i in mine[a * config.batch_size:(a + 1) * config.batch_size]],
                              prefills, config.objective)
            part = part.sum() / per_step
            part.backward()
            loss_sum += part.detach()
        # one collective: every gradient (the last layer's v/o/MLP LoRA gets none), the loss, the stop flag
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                         + [loss_sum.reshape(1), torch.tensor([float(stop_requested)], device=loss_sum.device)])
        if world > 1:
            flat = accelerator.reduce(flat, "sum")
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        if config.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return float(flat[-2]), float(flat[-1]) > 0

    step, loss, train_s, updating = start, None, 0.0, False
    adapter.train(True)
    try:
        with _StopFlag() as stop:
            while step < total:
                tic, updating = time.perf_counter(), True  # a hard interrupt inside leaves no consistent state
                loss, stop_now = update(step, stop.requested)
                step, updating = step + 1, False
                train_s += time.perf_counter() - tic
                rate = (step - start) / train_s
                if config.eval_every and step % config.eval_every == 0 and step < total:
                    adapter.train(False)
                    val_kl = evaluate(adapter, records, val_idx, config.batch_size, accelerator, prefills)
                    adapter.train(True)
                    log({"step": step, "val_kl": val_kl})
                    emit({"event": "eval", "step": step, "val_kl": val_kl})
                if step % config.log_every == 0 or step == total:
                    log({"step": step, "loss": loss, "lr": scheduler.get_last_lr()[0], "steps_per_s": rate,
                         "time_s": time.perf_counter() - t0})
                if config.checkpoint_every and step % config.checkpoint_every == 0 and step < total:
                    checkpoint(step)
                if stop_now:
                    raise KeyboardInterrupt
                emit({"event": "step", "step": step, "total_steps": total, "loss": loss, "val_kl": val_kl,
                      "lr": scheduler.get_last_lr()[0], "steps_per_s": rate, "eta_s": (total - step) / rate,
                      "log": step % config.log_every == 0})
    except KeyboardInterrupt:
        if step > start and not updating:
            optimizer.zero_grad(set_to_none=True)
            checkpoint(step)
        raise
    finally:
        adapter.train(False)
    checkpoint(step)
    val_kl = evaluate(adapter, records, val_idx, config.batch_size, accelerator, prefills)
    log({"step": step, "val_kl": val_kl})
    if main:
        final = run / "adapter"
        tmp = run / ".adapter.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        adapter.save(tmp, {"model": {"source": loaded.source, "fingerprint": loaded.fingerprint}, "step": step})
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    summary = {"run": str(run), "adapter": str(run / "adapter"), "steps": step, "loss": loss,
               "start_step": start, "val_kl_start": first_val, "val_kl": val_kl,
               "wall_s": time.perf_counter() - t0, "processes": world, "main": main,
               "prefill_cache": prefills.stats()}
    emit({"event": "done", **summary})
    if config.log_with:
        accelerator.end_training()
    accelerator.wait_for_everyone()
    return summary


def _trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines past ``step`` (left by a run that crashed after its last checkpoint)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
    write_bytes_atomic(path, "".join(line + "\n" for line in keep).encode())


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


def config_fields(cls=TrainConfig, prefix: str = "") -> list[str]:
    """``name=default`` for every (nested) field: the KEY=VALUE reference shown by ``lkv train --help``."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += config_fields(hints[f.name], f"{prefix}{f.name}.")
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append(f"{prefix}{f.name}={default}")
    return out
