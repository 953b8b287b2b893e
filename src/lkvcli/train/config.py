"""The ``train`` section of a recipe: :class:`TrainConfig`, validated when built."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ..config import Validated
from ..errors import LkvError
from ..lookahead import LookaheadConfig
from ..models import DEFAULT_MODEL
from ..objective import ObjectiveConfig

# Fields that may differ when resuming (they do not change what has been computed so far).
RESUMABLE = {"out", "steps", "epochs", "eval_every", "checkpoint_every", "keep_checkpoints", "log_every", "resume",
             "log_with", "device", "prefill_cache_mb"}


@dataclass
class TrainConfig(Validated):
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
    train_records: int | None = None  # train on this many of the training records (nested subsets: a learning curve)
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
        checks = [
            (self.lr > 0, "lr", "must be > 0"),
            (self.val_split >= 0, "val_split", "must be >= 0"),
            (self.steps is None or self.steps >= 1, "steps", "must be at least 1"),
            (self.train_records is None or self.train_records >= 1, "train_records", "must be at least 1"),
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

    def check_data(self) -> None:
        """The targets folders are given and exist (checked when training starts)."""
        if not self.data:
            raise LkvError("data: no targets folder given; set data in the recipe or pass --data FOLDER")
        for folder in self.data:
            if not Path(folder).is_dir():
                raise LkvError(f"data: targets folder {folder} not found; run `lkv collect --out {folder}` first")


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
