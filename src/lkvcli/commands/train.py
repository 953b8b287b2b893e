"""``lkv train``: parse options, load the recipe, call :func:`lkvcli.train.train`, render progress."""

from __future__ import annotations

import json
from typing import List, Optional

import torch.distributed as dist
import typer

from ..config import load_config
from ..train import TrainConfig, config_fields, train
from .common import STATE, ProgressView, console, exit_code, handle_errors, out, split_recipe_args, stop_reason

HELP = """Train a lookahead adapter on targets folders written by `lkv collect`.

RECIPE is a YAML file (its `train:` section); explicit options win over it and KEY=VALUE
overrides (dotted keys for nested fields, e.g. lookahead.num_tokens=16) win over both.
Multi-GPU / multi-node: `accelerate launch --multi_gpu --num_processes 8 $(which lkv) train ...`
(see docs/training.md). Ctrl-C writes a checkpoint; --resume continues exactly.
"""


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _end_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def register(app: typer.Typer) -> None:
    epilog = "KEY=VALUE fields (defaults): " + ", ".join(config_fields())

    @app.command("train", help=HELP, epilog=epilog)
    @handle_errors
    def train_command(
        args: Optional[List[str]] = typer.Argument(None, metavar="[RECIPE] [KEY=VALUE]...",
                                                    help="Recipe YAML and/or KEY=VALUE overrides."),
        model: Optional[str] = typer.Option(None, "--model", help="Model: built-in name, folder, .gguf or hub id."),
        data: Optional[List[str]] = typer.Option(None, "--data", help="Targets folder (repeatable)."),
        out_dir: Optional[str] = typer.Option(None, "--out", help="Run folder."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Optimiser steps (instead of epochs)."),
        lr: Optional[float] = typer.Option(None, "--lr", help="Peak learning rate."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Examples per forward pass per process."),
        device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the run folder's latest checkpoint."),
    ):
        recipe, overrides = split_recipe_args(list(args or []))
        cli_values = {"model": model, "data": data or None, "out": out_dir, "steps": steps, "lr": lr,
                      "batch_size": batch_size, "device": device, "resume": True if resume else None}
        config = load_config(TrainConfig, recipe, "train", cli_values, overrides)
        view = ProgressView()
        try:
            with view:
                summary = train(config, on_event=view)
        except KeyboardInterrupt as exc:
            _end_distributed()
            where = f"checkpoint at step {view.last_checkpoint} kept" if view.last_checkpoint else "no checkpoint"
            console.print(f"{stop_reason(exc)}: {where}; continue with `lkv train ... --out {config.out} --resume`",
                          soft_wrap=True)
            raise typer.Exit(exit_code(exc)) from None
        _end_distributed()
        if not summary["main"]:
            return
        if STATE.json:
            out.print_json(json.dumps(summary))
        else:
            console.print(f"val KL {_fmt(summary['val_kl_start'])} at step {summary['start_step']} -> "
                          f"{_fmt(summary['val_kl'])} at step {summary['steps']} ({summary['wall_s']:.0f} s); "
                          f"adapter in {summary['adapter']}", soft_wrap=True)
