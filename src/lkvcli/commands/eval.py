"""``lkv eval``: compare eviction methods on held-out collected records."""

from __future__ import annotations

import json
from typing import Optional

import typer

from ..config import load_config
from ..evaluate import EvalConfig, config_dict, evaluate, setup
from ..report import rich_tables, write_results
from .common import OVERRIDES_HELP, RECIPE_HELP, STATE, ProgressView, console, handle_errors, out, split_recipe_args


def register(app: typer.Typer) -> None:
    app.command(
        "eval",
        help=(
            "Compare eviction methods (lookahead, snapkv, pyramidkv, streamingllm, tova, h2o, kvzip, knorm, random, draft, "
            "oracle) on held-out collected records: prediction accuracy, answers with the evicted cache, overhead."
        ),
    )(eval_command)


def _csv(values: Optional[list[str]]) -> Optional[list[str]]:
    if not values:
        return None
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


@handle_errors
def eval_command(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP, show_default=False),
    overrides: Optional[list[str]] = typer.Argument(None, help=OVERRIDES_HELP + " Method options: scorers.snapkv.window=64.",
                                                    show_default=False),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model (default: the one the targets were collected with)."),
    targets: Optional[list[str]] = typer.Option(None, "--targets", "-t", help="Targets folder(s) from `lkv collect` (repeat or comma-separate)."),
    adapter: Optional[str] = typer.Option(None, "--adapter", "-a", help="Training run folder (lkv train --out), adapter folder, checkpoint or bundle."),
    methods: Optional[list[str]] = typer.Option(None, "--methods", help="Comma-separated methods. (default: all; lookahead only with --adapter)"),
    budgets: Optional[list[str]] = typer.Option(None, "--budgets", "-b", help="Entries kept per KV head (128) or ratios of the prompt (0.1). (default: 64,128,256,512)"),
    parts: Optional[list[str]] = typer.Option(None, "--parts", help="prediction, answers, overhead. (default: all three)"),
    out_dir: Optional[str] = typer.Option(None, "--out", "-o", help="Results folder. (default: results)"),
    mode: Optional[str] = typer.Option(None, "--mode", help="whole: prefill+evict the whole prompt (paper); context: evict the context, then feed the question. (default: whole)"),
    split: Optional[str] = typer.Option(None, "--split", help="auto (the adapter run's validation records if known), validation, or all. (default: auto)"),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N held-out records."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest answer (default: each record's collected response length)."),
    overhead_prompts: Optional[int] = typer.Option(None, "--overhead-prompts", help="Prompts timed by the overhead part. (default: 2)"),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Interleaved repeats of the overhead timings. (default: 3)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of the timing order. (default: 0)"),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda. (default: auto)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="auto, float32 or bfloat16. (default: auto)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow the model repository's own code to run."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a results folder written with other settings (the same settings resume)."),
):
    recipe, extra = split_recipe_args([recipe, *(overrides or [])])
    cli = dict(model=model, targets=_csv(targets), adapter=adapter, methods=_csv(methods), budgets=_csv(budgets),
               parts=_csv(parts), out=out_dir, mode=mode, split=split, limit=limit, max_new_tokens=max_new_tokens,
               overhead_prompts=overhead_prompts, overhead_repeats=repeats, seed=seed, device=device, dtype=dtype,
               trust_remote_code=True if trust_remote_code else None, overwrite=True if overwrite else None)
    config = load_config(EvalConfig, recipe, "eval", cli, extra)
    run = setup(config)
    console.print(f"eval: {len(run.record_indices)} records, methods {', '.join(run.methods)}, budgets "
                  f"{', '.join(config.budgets)}, parts {', '.join(config.parts)} -> {config.out}")
    with ProgressView() as view:
        results = evaluate(run, on_event=view)
    written = write_results(config.out, {"eval": config_dict(config), "scorers": results["scorers"]}, results)
    if STATE.json:
        out.print_json(json.dumps({"results": results, **written}))
        return
    for table in rich_tables(results):
        out.print(table)
    out.print(throughput_line(results["throughput"]))
    out.print(f"report: {written['report']}")


def throughput_line(tp: dict) -> str:
    """``eval: 8 records (8 computed) in 95 s; prediction 12.3 records/min, answers 5.1 records/min``."""
    parts = ", ".join(f"{name} {p['records_per_min']:.1f} records/min" for name, p in tp["parts"].items()
                      if p["records_per_min"])
    return (f"eval: {tp['records']} records ({tp['records_computed']} computed now) in {tp['wall_s']:.0f} s"
            + (f"; {parts}" if parts else ""))
