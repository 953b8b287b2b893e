"""``lkv train``: parse options, load the recipe, call :func:`lkvcli.train.train`, render progress."""

from __future__ import annotations

import json
from typing import List, Optional

import typer

from .common import STATE, console, handle_errors, out, plain_line, progress, split_recipe_args

HELP = """Train a lookahead adapter on targets folders written by `lkv collect`.

RECIPE is a YAML file (its `train:` section); explicit options win over it and KEY=VALUE
overrides (dotted keys for nested fields, e.g. lookahead.num_tokens=16) win over both.
Multi-GPU / multi-node: `accelerate launch --multi_gpu --num_processes 8 $(which lkv) train ...`
(see docs/training.md). Ctrl-C writes a checkpoint; --resume continues exactly.
"""


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


class Renderer:
    """Training events -> a rich progress bar on a terminal, plain lines when piped."""

    def __init__(self):
        self.bar = progress()
        self.task = None
        self.last_checkpoint = None

    def __call__(self, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            self.bar.start()
            self.task = self.bar.add_task("train", total=event["total_steps"], completed=event["start_step"], info="")
            plain_line(f"train: {event['train_records']} records ({event['val_records']} held out), "
                       f"{event['total_steps']} steps of {event['global_batch']} examples on {event['processes']} "
                       f"process(es), {event['trainable_parameters']:,} trainable parameters -> {event['run']}")
        elif kind == "eval":
            plain_line(f"step {event['step']}: val KL {_fmt(event['val_kl'])}")
        elif kind == "step":
            info = (f"loss {_fmt(event['loss'])} val {_fmt(event['val_kl'])} {event['steps_per_s']:.2f} steps/s")
            self.bar.update(self.task, completed=event["step"], info=info)
            if event["log"] or event["step"] == event["total_steps"]:
                plain_line(f"step {event['step']}/{event['total_steps']}: {info}, lr {event['lr']:.2e}, "
                           f"eta {event['eta_s']:.0f} s")
        elif kind == "checkpoint":
            self.last_checkpoint = event["step"]
            plain_line(f"checkpoint {event['path']}")
        elif kind == "done":
            self.stop()

    def stop(self) -> None:
        self.bar.stop()


def _end_distributed() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def register(app: typer.Typer) -> None:
    from ..train import config_fields

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
        from ..config import load_config
        from ..train import TrainConfig, train

        recipe, overrides = split_recipe_args(list(args or []))
        cli_values = {"model": model, "data": data or None, "out": out_dir, "steps": steps, "lr": lr,
                      "batch_size": batch_size, "device": device, "resume": True if resume else None}
        config = load_config(TrainConfig, recipe, "train", cli_values, overrides)
        renderer = Renderer()
        try:
            summary = train(config, on_event=renderer)
        except KeyboardInterrupt:
            renderer.stop()
            _end_distributed()
            where = f"checkpoint at step {renderer.last_checkpoint} kept" if renderer.last_checkpoint else "no checkpoint"
            console.print(f"interrupted: {where}; continue with `lkv train ... --out {config.out} --resume`",
                          soft_wrap=True)
            raise typer.Exit(130) from None
        finally:
            renderer.stop()
        _end_distributed()
        if not summary["main"]:
            return
        if STATE.json:
            out.print_json(json.dumps(summary))
        else:
            console.print(f"val KL {_fmt(summary['val_kl_start'])} at step {summary['start_step']} -> "
                          f"{_fmt(summary['val_kl'])} at step {summary['steps']} ({summary['wall_s']:.0f} s); "
                          f"adapter in {summary['adapter']}", soft_wrap=True)
