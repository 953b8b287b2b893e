"""What every subcommand shares: error handling, consoles, progress bars."""

from __future__ import annotations

import errno
import functools
import os
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..errors import LkvError
from ..preempt import EXIT_PREEMPTED, Stopped
from ..progress import Event


@dataclass
class _State:
    debug: bool = False
    json: bool = False


STATE = _State()
# Piped or logged output (CI, `| tee`) gets wide tables instead of rich's 80-column default.
_PIPED_WIDTH = None if "COLUMNS" in os.environ else 160
console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else _PIPED_WIDTH)
out = Console(highlight=False, width=None if sys.stdout.isatty() else _PIPED_WIDTH)

RECIPE_HELP = "Recipe YAML (see recipes/); explicit options and KEY=VALUE overrides win over it."
OVERRIDES_HELP = "Overrides as KEY=VALUE (dotted keys for nested fields), applied last."


def split_recipe_args(args: list[str | None]) -> tuple[str | None, list[str]]:
    """``[RECIPE] [KEY=VALUE ...]`` -> (recipe, overrides); an existing file is a recipe even with '=' in its name."""
    args = [a for a in args if a is not None]
    overrides = [a for a in args if "=" in a and not Path(a).is_file()]
    recipes = [a for a in args if a not in overrides]
    if len(recipes) > 1:
        raise LkvError(f"give at most one recipe (got {', '.join(recipes)}); overrides look like key=value")
    return (recipes[0] if recipes else None), overrides


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


DISK_ERRORS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EPERM: "permission denied"}
DISK_FIX = ("everything complete so far is kept: free space or fix the permissions (or choose another --out), then "
            "re-run the same command to resume")


def stop_reason(exc: KeyboardInterrupt) -> str:
    if isinstance(exc, Stopped) and exc.preempted:
        return f"preempted ({signal.Signals(exc.signum).name}{', the record or step under way dropped' if exc.dropped else ''})"
    return "interrupted"


def exit_code(exc: KeyboardInterrupt) -> int:
    """130 for Ctrl-C, :data:`lkvcli.preempt.EXIT_PREEMPTED` (75) for a scheduler's SIGTERM / SIGUSR1."""
    return EXIT_PREEMPTED if isinstance(exc, Stopped) and exc.preempted else 130


def handle_errors(fn):
    """Turn user errors into one clear line and a non-zero exit; tracebacks only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt as exc:
            console.print(f"{stop_reason(exc)}: everything written so far is kept; re-run the same command to resume")
            raise typer.Exit(exit_code(exc))
        except LkvError as exc:
            if STATE.debug or os.environ.get("LKV_DEBUG"):
                traceback.print_exc()
            fail(str(exc))
        except Exception as exc:  # noqa: BLE001
            if STATE.debug or os.environ.get("LKV_DEBUG"):
                raise
            if isinstance(exc, OSError) and exc.errno in DISK_ERRORS:  # full disk, read-only, permissions
                fail(f"{DISK_ERRORS[exc.errno]} writing {exc.filename or 'an output file'}; {DISK_FIX}")
            fail(f"{type(exc).__name__}: {exc} (re-run with --debug for the traceback)", code=1)

    return wrapper


def progress(**extra_columns) -> Progress:
    """A rich progress bar on a terminal; plain periodic lines when output is piped."""
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    return Progress(*columns, console=console, disable=not console.is_terminal, transient=False)


class ProgressView:
    """Progress events of any command -> a rich bar per phase on a terminal, plain lines when piped.
    Use it as a context manager (the bar stops on the way out, whatever happens)."""

    def __init__(self):
        self.bar = progress()
        self.tasks: dict[str, int] = {}
        self.last_checkpoint = None

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc):
        self.bar.stop()

    def __call__(self, event: Event) -> None:
        if event.kind == "start":
            self.tasks[event.phase] = self.bar.add_task(event.phase, total=event.total, completed=event.done, info="")
            plain_line(f"{event.phase}: {event.info}")
        elif event.kind == "advance":
            task = self.tasks[event.phase]
            self.bar.update(task, completed=event.done, info=event.info)
            if event.log:
                elapsed = self.bar.tasks[task].elapsed or 0.0
                plain_line(f"{event.phase}: {event.done}/{event.total} {event.info}, {elapsed:.0f}s elapsed")
        elif event.kind == "note":
            self.last_checkpoint = event.data.get("checkpoint", self.last_checkpoint)
            plain_line(f"{event.phase}: {event.info}")


def plain_line(message: str) -> None:
    """A progress line for pipes and logs (rich bars are shown only on terminals)."""
    if not console.is_terminal:
        print(message, file=sys.stderr, flush=True)
