"""The ``lkv`` command: a thin typer app; each subcommand lives in ``lkvcli/commands/<name>.py``."""

from __future__ import annotations

import importlib

import typer

from .version import __version__
from .commands.common import STATE

app = typer.Typer(
    name="lkv",
    help="Distil and measure LookaheadKV adapters: collect -> train -> eval -> export.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

COMMANDS = ("collect", "train", "eval", "export", "pipeline")


def _version(value: bool):
    if value:
        typer.echo(f"lkv {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks on errors."),
    json_output: bool = typer.Option(False, "--json", help="Print machine-readable JSON summaries instead of tables."),
):
    """lkv: learned KV-cache eviction (LookaheadKV) for any causal language model."""
    STATE.debug = debug
    STATE.json = json_output


for _name in COMMANDS:
    try:
        _module = importlib.import_module(f"lkvcli.commands.{_name}")
    except ModuleNotFoundError as exc:  # a command not built yet
        if exc.name != f"lkvcli.commands.{_name}":
            raise
        continue
    _module.register(app)
