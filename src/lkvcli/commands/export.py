"""``lkv export``: a training run's checkpoint -> a bundle folder (peft adapter + embeddings + model card),
optionally pushed to the Hugging Face Hub."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .common import STATE, console, handle_errors, out


def register(app: typer.Typer) -> None:
    app.command(
        "export",
        help=(
            "Write a training run's checkpoint as a bundle that standard tools read (peft adapter, lookahead "
            "embeddings, lkv.json, model card), verify it bit for bit, and optionally push it to the Hub. "
            "Give a bundle folder instead of a run to push it again."
        ),
    )(export_command)


@handle_errors
def export_command(
    source: Path = typer.Argument(..., metavar="RUN_DIR", help="Training run folder (the --out of `lkv train`), or "
                                  "a bundle folder to push.",
                                  show_default=False),
    out_dir: Optional[Path] = typer.Option(None, "--out", "-o", help="Bundle folder to write (required with a run)."),
    checkpoint: str = typer.Option("latest", "--checkpoint", "-c", help="step-N, N, or latest."),
    eval_dir: Optional[Path] = typer.Option(None, "--eval", help="Results folder of `lkv eval`: its tables and plots "
                                                                 "go into the model card."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing bundle folder."),
    base_model: Optional[str] = typer.Option(None, "--base-model", help="Hub id of the base model, when training used "
                                                                        "a local copy. (default: from the run)"),
    card_license: str = typer.Option("apache-2.0", "--license",
                                     help="License in the model card; use the base model's."),
    model_check: bool = typer.Option(True, "--model-check/--no-model-check", help="Also load the base model and "
                                     "attach the bundle to it (skip for very large models)."),
    device: str = typer.Option("auto", "--device", help="Device of the model check: auto, cpu or cuda."),
    push_to_hub: Optional[str] = typer.Option(None, "--push-to-hub", help="Upload the bundle to this Hub repo "
                                              "(ORG/NAME); token from HF_TOKEN or `hf auth login`, server from "
                                              "HF_ENDPOINT."),
    private: bool = typer.Option(False, "--private",
                                 help="Create the Hub repo private (an existing repo is kept as is)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to push to (created if needed). "
                                                                    "(default: main)"),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", help="Commit message of the push."),
):
    from ..bundle import export, is_bundle, read_bundle
    from ..errors import LkvError
    from ..hub import check_repo_id, push_folder

    if push_to_hub:
        check_repo_id(push_to_hub)
    if is_bundle(source):
        if not push_to_hub or out_dir is not None:
            raise LkvError(f"{source} is already a bundle; give a training run to export, or --push-to-hub REPO "
                           "(without --out) to push this bundle")
        bundle = read_bundle(source)
        summary = {"bundle": str(source), "checkpoint": bundle.meta["training"]["checkpoint"],
                   "bytes": sum(p.stat().st_size for p in source.rglob("*") if p.is_file())}
    else:
        if out_dir is None:
            raise LkvError("--out is required: the bundle folder to write (for example bundles/lookaheadkv-smollm2)")
        console.print(f"export: {source} ({checkpoint}) -> {out_dir}")
        summary = export(source, out_dir, checkpoint=checkpoint, eval_dir=eval_dir, overwrite=overwrite,
                         base_model=base_model, repo=push_to_hub, license_id=card_license, check_model=model_check,
                         device=device)
    if push_to_hub:
        console.print(f"push: {summary['bundle']} -> {push_to_hub}")
        summary["pushed"] = push_folder(summary["bundle"], push_to_hub, private=private, revision=revision,
                                        commit_message=commit_message)
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
