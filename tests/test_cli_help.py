"""Every command and every option of `lkv` documents itself in --help."""

import click
from typer.main import get_command
from typer.testing import CliRunner

from lkvcli.cli import app


def _commands(group: click.Group):
    for name, command in group.commands.items():
        yield name, command
        if isinstance(command, click.Group):
            yield from _commands(command)


def test_every_command_and_parameter_has_help():
    root = get_command(app)
    missing = []
    for name, command in [("lkv", root), *_commands(root)]:
        if not (command.help or "").strip():
            missing.append(f"{name}: no command help")
        for param in command.params:
            if not (getattr(param, "help", None) or "").strip():
                missing.append(f"{name}: {param.name}")
    assert not missing, missing


def test_help_runs_for_every_command():
    root = get_command(app)
    runner = CliRunner()
    for name, _ in _commands(root):
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, (name, result.output)
