"""The one progress-event type that every long command (collect, train, eval) reports through.

Library code never prints: it calls ``on_event(Event(...))``, and the command line turns the
events into a progress bar on a terminal and plain lines in logs (``lkvcli.commands.common``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal


@dataclass
class Event:
    """``start`` opens a phase of ``total`` units (``done`` already finished), ``advance`` reports
    ``done`` units finished, ``note`` is a line worth logging, ``done`` closes the command."""

    kind: Literal["start", "advance", "note", "done"]
    phase: str  # collect, train, prediction+answers, overhead, ...
    done: int = 0
    total: int | None = None
    info: str = ""  # one short status line
    log: bool = True  # whether a log (piped output) gets a line for it
    data: dict = field(default_factory=dict)  # the figures behind ``info``, by name


Listener = Callable[[Event], None]


def ignore(event: Event) -> None:
    """The listener when nobody listens."""
