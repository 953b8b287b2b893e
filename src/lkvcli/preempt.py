"""Stopping cleanly when a scheduler preempts a job.

SIGTERM (sent by SLURM, Kubernetes and most schedulers before they kill a job) and SIGUSR1 (what
SLURM sends ahead of time with ``--signal=USR1@SECONDS``) ask ``lkv collect``, ``lkv train`` and
``lkv eval`` to stop at the end of the unit under way (a record, a training step), write what it
produced (the targets shard, a checkpoint, the journal row) and exit with :data:`EXIT_PREEMPTED`.
When the unit does not end within the grace period (``LKV_GRACE_S``, default 20 seconds) it is
dropped: the job stops at once and keeps only what was complete. SIGINT keeps its own meaning
(Ctrl-C: training stops at the next step, collect and eval at once; a second Ctrl-C interrupts).
"""

from __future__ import annotations

import os
import signal
import threading

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later"; requeue the job and it resumes
DEFAULT_GRACE_S = 20.0
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(KeyboardInterrupt):
    """A stop asked for by a signal (a KeyboardInterrupt, so every interrupt path handles it);
    ``dropped``: the unit under way was cut short when the grace period ran out."""

    def __init__(self, signum: int, dropped: bool = False):
        super().__init__(signal.Signals(signum).name)
        self.signum, self.dropped = signum, dropped

    @property
    def preempted(self) -> bool:
        return self.signum != signal.SIGINT


def grace_seconds() -> float:
    value = os.environ.get("LKV_GRACE_S", "")
    try:
        return max(0.0, float(value)) if value else DEFAULT_GRACE_S
    except ValueError:
        return DEFAULT_GRACE_S


class StopRequest:
    """Inside the block, the preemption signals (and, with ``sigint``, Ctrl-C) set :attr:`signum`; the job
    calls :meth:`check` at each unit boundary. After the grace period the stop interrupts the unit
    under way; a second Ctrl-C interrupts at once. Outside the main thread it installs nothing."""

    def __init__(self, sigint: bool = False, grace_s: float | None = None):
        self.signals = (*PREEMPT_SIGNALS, signal.SIGINT) if sigint else PREEMPT_SIGNALS
        self.grace_s = grace_seconds() if grace_s is None else grace_s
        self.signum: int | None = None
        self._old: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.signals}
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise Stopped(signum, dropped=True)
            return
        self.signum = signum
        if signum == signal.SIGINT:
            return  # Ctrl-C: wait for the unit, however long
        if self.grace_s <= 0:
            raise Stopped(signum, dropped=True)
        self._old.setdefault(signal.SIGALRM, signal.signal(signal.SIGALRM, self._expire))
        signal.setitimer(signal.ITIMER_REAL, self.grace_s)

    def _expire(self, signum, frame) -> None:
        raise Stopped(self.signum, dropped=True)

    def check(self) -> None:
        """At a unit boundary: stop when asked to."""
        if self.signum is not None:
            raise Stopped(self.signum)

    def __exit__(self, *exc) -> None:
        if self._old:
            signal.setitimer(signal.ITIMER_REAL, 0)
            for s, handler in self._old.items():
                signal.signal(s, handler)
