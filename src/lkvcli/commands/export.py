"""``lkv export``: a training run's checkpoint -> a bundle folder (peft adapter + embeddings + model card),
optionally pushed to the Hugging Face Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from ..bundle import is_bundle, read_bundle
from ..config import load_config, read_recipe
from ..errors import LkvError
from ..evaluate import EvalConfig
from ..export import ExportConfig, export
from ..hub import push_folder
from ..train import TrainConfig
from .common import STATE, console, handle_errors, out


def register(app: typer.Typer) -> None:
    app.command(
        "export",
        help=HELP,
    )(export_command)


HELP = """Write a training run's checkpoint as a bundle that standard tools read (peft adapter, lookahead
embeddings, lkv.json, model card), verify it bit for bit, and optionally push it to the Hub.

RECIPE is a YAML file (its `export:` section; the run defaults to its `train.out`, the results
to its `eval.out`). Give a bundle folder instead of a run to push it again.
"""


def _split_args(args: list[str]) -> tuple[str | None, str | None, list[str]]:
    """``[RECIPE] [RUN_DIR] [KEY=VALUE]...`` -> (recipe, run or bundle, overrides)."""
    recipe, overrides, sources = None, [], []
    for arg in args:
        path = Path(arg)
        if path.is_file() and path.suffix in (".yaml", ".yml"):
            if recipe:
                raise LkvError(f"give at most one recipe (got {recipe}, {arg})")
            recipe = arg
        elif "=" in arg and not path.exists():
            overrides.append(arg)
        else:
            sources.append(arg)
    if len(sources) > 1:
        raise LkvError(f"give one training run (got {', '.join(sources)}); overrides look like key=value")
    return recipe, (sources[0] if sources else None), overrides


def load_export_config(recipe: str | None, cli_values: dict, overrides: list[str]) -> ExportConfig:
    """The export section; the run and the results default to the recipe's train.out and eval.out."""
    config = load_config(ExportConfig, recipe, "export", cli_values, overrides)
    sections = read_recipe(recipe)
    if config.run is None and "train" in sections:
        config.run = load_config(TrainConfig, recipe, "train", {}, []).out
    if config.eval is None and "eval" in sections:
        results = Path(load_config(EvalConfig, recipe, "eval", {}, []).out)
        config.eval = str(results) if (results / "results.json").is_file() else None
    return config


@handle_errors
def export_command(
    args: Optional[List[str]] = typer.Argument(None, metavar="[RECIPE] [RUN_DIR] [KEY=VALUE]...",
                                               help="Recipe YAML, the training run folder (the --out of `lkv train`) "
                                                    "or a bundle folder to push, and KEY=VALUE overrides."),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Bundle folder to write (required with a run)."),
    checkpoint: Optional[str] = typer.Option(None, "--checkpoint", "-c", help="step-N, N, or latest. [default: latest]"),
    eval_dir: Optional[Path] = typer.Option(None, "--eval", help="Results folder of `lkv eval`: its tables and plots "
                                                                 "go into the model card."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing bundle folder."),
    base_model: Optional[str] = typer.Option(None, "--base-model", help="Hub id of the base model, when training used "
                                                                        "a local copy. (default: from the run)"),
    card_license: Optional[str] = typer.Option(None, "--license",
                                               help="License in the model card; use the base model's. "
                                                    "[default: apache-2.0]"),
    model_check: Optional[bool] = typer.Option(None, "--model-check/--no-model-check", help="Also load the base "
                                               "model and attach the bundle to it (skip for very large models). "
                                               "[default: model-check]"),
    device: Optional[str] = typer.Option(None, "--device", help="Device of the model check: auto, cpu or cuda."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", help="Upload the bundle to this Hub repo "
                                              "(ORG/NAME); token from HF_TOKEN or `hf auth login`, server from "
                                              "HF_ENDPOINT."),
    private: bool = typer.Option(False, "--private",
                                 help="Create the Hub repo private (an existing repo is kept as is)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to push to (created if needed). "
                                                                    "(default: main)"),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", help="Commit message of the push."),
):
    recipe, source, overrides = _split_args(list(args or []))
    cli_values = {"run": source, "out": str(out_dir) if out_dir else None, "checkpoint": checkpoint,
                  "eval": str(eval_dir) if eval_dir else None, "overwrite": True if overwrite else None,
                  "base_model": base_model, "license": card_license, "model_check": model_check, "device": device,
                  "push_to_hub": push_to_hub, "private": True if private else None, "revision": revision,
                  "commit_message": commit_message}
    config = load_export_config(recipe, cli_values, overrides)
    if config.run is None:
        raise LkvError("give the training run folder (lkv export RUN_DIR --out BUNDLE), or a recipe with a train "
                       "section")
    run = Path(config.run)
    if is_bundle(run):
        if not config.push_to_hub or config.out is not None:
            raise LkvError(f"{run} is already a bundle; give a training run to export, or --push-to-hub REPO "
                           "(without --out) to push this bundle")
        bundle = read_bundle(run)
        summary = {"bundle": str(run), "checkpoint": bundle.meta["training"]["checkpoint"],
                   "bytes": sum(p.stat().st_size for p in run.rglob("*") if p.is_file())}
    else:
        if config.out is None:
            raise LkvError("--out is required: the bundle folder to write (for example bundles/lookaheadkv-smollm2)")
        console.print(f"export: {run} ({config.checkpoint}) -> {config.out}")
        summary = export(run, config.out, checkpoint=config.checkpoint, eval_dir=config.eval,
                         overwrite=config.overwrite, base_model=config.base_model, repo=config.push_to_hub,
                         license_id=config.license, check_model=config.model_check, device=config.device)
    if config.push_to_hub:
        console.print(f"push: {summary['bundle']} -> {config.push_to_hub}")
        summary["pushed"] = push_folder(summary["bundle"], config.push_to_hub, private=config.private,
                                        revision=config.revision, commit_message=config.commit_message)
    _report(summary)


def _report(summary: dict) -> None:
    if STATE.json:
        out.print_json(json.dumps(summary))
        return
    table = Table(title="lkv export", show_header=False)
    for key in ("bundle", "checkpoint", "base_model", "num_tokens", "val_kl", "bytes", "verified_on_model", "pushed"):
        if key in summary:
            table.add_row(key.replace("_", " "), str(summary[key]))
    out.print(table)
