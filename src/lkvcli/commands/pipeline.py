"""``lkv pipeline``: collect -> train -> eval -> export from one recipe, resuming each step."""

from __future__ import annotations

from pathlib import Path

import typer
from typer.main import get_command

from ..config import load_config, read_recipe
from ..errors import LkvError
from ..evaluate import EvalConfig
from ..files import read_json
from ..report import rich_table, summary_rows
from ..runs import latest_checkpoint
from ..train import TrainConfig
from .common import console, handle_errors, out
from .export import load_export_config

STEPS = ("collect", "train", "eval", "export")


def register(app: typer.Typer) -> None:
    app.command(
        "pipeline",
        help=(
            "Run collect -> train -> eval -> export from one recipe (sections collect, train, eval, export). "
            "Re-running resumes: collection continues, training resumes from its last checkpoint, a finished "
            "eval is kept (delete its folder to redo it), and the bundle is rewritten."
        ),
    )(_make_command(app))


def _steps(recipe: dict, path: str) -> list[tuple[str, list[str]]]:
    """The subcommand argument lists for each step of the recipe (every section read by its own loader)."""
    missing = [s for s in ("collect", "train") if s not in recipe]
    if missing:
        raise LkvError(f"recipe {path} has no {missing[0]!r} section; a pipeline recipe needs collect and train")
    run = Path(load_config(TrainConfig, path, "train", {}, []).out)
    steps = [("collect", ["collect", path])]
    steps.append(("train", ["train", path, *(["resume=true"] if latest_checkpoint(run) else [])]))
    if "eval" in recipe:
        results = Path(load_config(EvalConfig, path, "eval", {}, []).out)
        if (results / "results.json").is_file():
            console.print(f"eval: {results}/results.json exists, kept (delete the folder to evaluate again)")
        else:
            steps.append(("eval", ["eval", path]))
    if load_export_config(path, {}, []).out:
        steps.append(("export", ["export", path, "--overwrite"]))
    return steps


def _make_command(app: typer.Typer):
    @handle_errors
    def pipeline_command(
        recipe: str = typer.Argument(..., help="Recipe YAML with collect, train and optionally eval and export sections."),
    ):
        data = read_recipe(recipe)
        command = get_command(app)
        for name, args in _steps(data, recipe):
            console.rule(f"lkv {name}")
            code = command.main(args=args, prog_name="lkv", standalone_mode=False)
            if code not in (None, 0):
                raise typer.Exit(code)
        console.rule("done")
        _print_summary(data, recipe)

    return pipeline_command


def _print_summary(recipe: dict, path: str) -> None:
    """The method-by-budget table and where the report, plots and bundle are."""
    results_dir = Path(load_config(EvalConfig, path, "eval", {}, []).out) if "eval" in recipe else None
    if results_dir and (results_dir / "results.json").is_file():
        results = read_json(results_dir / "results.json", "run lkv eval again")
        out.print(rich_table(f"Summary on {len(results['meta']['records'])} held-out prompts",
                             *summary_rows(results)))
        legend = "recall: share of the answer's attention kept; agree: answer agreement with the full cache"
        out.print(legend + ("; overhead: added time to first token" if "overhead" in results
                            else "\neviction overhead: `make bench` (benchmarks/run_all.py) measures it"))
        out.print(f"report: {results_dir / 'report.md'}")
        if (results_dir / "plots").is_dir():
            out.print(f"plots:  {results_dir / 'plots'}")
    bundle = load_export_config(path, {}, []).out
    if bundle and Path(bundle).is_dir():
        out.print(f"bundle: {bundle}")
