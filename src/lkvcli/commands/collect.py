"""``lkv collect``: record ground-truth attention targets."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from ..collect import CollectConfig, collect, summary_dict
from ..config import load_config
from .common import OVERRIDES_HELP, RECIPE_HELP, STATE, ProgressView, console, handle_errors, out, split_recipe_args


def register(app: typer.Typer) -> None:
    app.command(
        "collect",
        help=(
            "Generate each prompt's greedy response and record, per layer and KV head, the response's attention "
            "over the prompt (the training target). Resumable: re-run the same command to continue."
        ),
    )(collect_command)


@handle_errors
def collect_command(
    recipe: Optional[str] = typer.Argument(None, help=RECIPE_HELP, show_default=False),
    overrides: Optional[list[str]] = typer.Argument(None, help=OVERRIDES_HELP, show_default=False),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Hub id, model folder, .gguf file, or built-in name. (default: smollm2-135m-instruct)"),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Prompts: .jsonl/.json/.parquet file, hf:NAME[:CONFIG][@SPLIT], a save_to_disk folder, or builtin:n=8,min_tokens=1000,max_tokens=2000,tasks=needle+summarise. (default: builtin:)"),
    out_dir: Optional[str] = typer.Option(None, "--out", "-o", help="Targets folder to write (created, or resumed). (default: targets)"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Longest response to generate. (default: 512)"),
    reduction: Optional[str] = typer.Option(None, "--reduction", help="How the query heads of a KV group are reduced: mean or max. (default: mean)"),
    storage: Optional[str] = typer.Option(None, "--storage", help="dense (layers x kv_heads x L values) or sparse (per head, the positions holding --sparse-mass of the attention). (default: dense)"),
    storage_dtype: Optional[str] = typer.Option(None, "--storage-dtype", help="float16, bfloat16 or float32. (default: float16)"),
    sparse_mass: Optional[float] = typer.Option(None, "--sparse-mass", help="Mass kept per head by --storage sparse. (default: 0.99)"),
    sparse_top_k: Optional[int] = typer.Option(None, "--sparse-top-k", help="With --storage sparse, keep at most K positions per head (the largest)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Use only the first N prompts."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for built-in prompts. (default: 0)"),
    num_shards: Optional[int] = typer.Option(None, "--num-shards", help="Split the prompts across N processes/machines (each writes OUT/shard-I-of-N; readers accept OUT). (default: 1)"),
    shard_index: Optional[int] = typer.Option(None, "--shard-index", help="Which of the --num-shards parts this process collects (0-based). (default: 0)"),
    strict: bool = typer.Option(False, "--strict", help="Fail on a prompt longer than the model's context instead of skipping it."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a targets folder collected for another model or with other settings."),
    repair: bool = typer.Option(False, "--repair", help="Check every shard file against its sha256, drop the records of damaged or missing ones, and collect exactly those again."),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda. (default: auto)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="auto, float32 or bfloat16. (default: auto)"),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow the model repository's own code to run."),
):
    recipe, extra = split_recipe_args([recipe, *(overrides or [])])
    cli = dict(model=model, data=data, out=out_dir, max_new_tokens=max_new_tokens, reduction=reduction, storage=storage,
               storage_dtype=storage_dtype, sparse_mass=sparse_mass, sparse_top_k=sparse_top_k, limit=limit, seed=seed, num_shards=num_shards,
               shard_index=shard_index, device=device, dtype=dtype)
    cli.update({k: True for k, v in dict(strict=strict, overwrite=overwrite, repair=repair, trust_remote_code=trust_remote_code).items() if v})
    config = load_config(CollectConfig, recipe, "collect", cli, extra)
    console.print(f"collect: model [bold]{config.model}[/], data [bold]{config.data}[/] -> {config.out_folder()}")

    with ProgressView() as view:
        summary = collect(config, on_event=view)
    _report(summary)


def _report(summary) -> None:
    data = summary_dict(summary)
    if STATE.json:
        out.print_json(json.dumps(data))
        return
    table = Table(title="lkv collect", show_header=False)
    for key in ("folder", "prompts", "written", "already_done", "repaired", "skipped_too_long", "skipped_empty",
                "prompt_tokens", "response_tokens"):
        table.add_row(key.replace("_", " "), str(data[key]))
    table.add_row("seconds", f"{summary.seconds:.1f}")
    out.print(table)
