"""Named write points, and a test-only hook that fails the process at one of them.

Every place where lkv makes something durable passes through :func:`point`: ``file-write`` (each
atomic file, just before its rename), ``folder-rename`` (a checkpoint or adapter folder, before its
rename), ``journal-line`` (a line appended to ``records.jsonl``, ``predictions.jsonl`` or
``metrics.jsonl``, before its fsync), ``bundle-rename`` (the exported bundle, before it moves into
place) and ``push`` (before the upload to the Hub).

``LKV_FAULT=NAME:N`` ends the process abruptly (``os._exit(86)``, no cleanup, as SIGKILL would) at
the N-th pass through point NAME; ``LKV_FAULT=NAME:N:ENOSPC`` (or ``EROFS``, ``EACCES``) raises that
``OSError`` there instead, at that pass and every later one, as a full disk, a read-only folder or a
permission error would.
``LKV_FAULT_TRACE=FILE`` appends the name of every point passed to FILE (to enumerate them).
Unset, a point costs one dictionary lookup.
"""

from __future__ import annotations

import errno
import os

FAULT_EXIT = 86
_passes: dict[str, int] = {}


def point(name: str, path=None) -> None:
    """Pass through write point ``name`` (about to make ``path`` durable)."""
    trace = os.environ.get("LKV_FAULT_TRACE")
    if trace:
        with open(trace, "a", encoding="utf-8") as fh:
            fh.write(name + "\n")
    spec = os.environ.get("LKV_FAULT")
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != name:
        return
    count, _, code = rest.partition(":")
    _passes[name] = _passes.get(name, 0) + 1
    if code and _passes[name] >= int(count or 1):  # a full disk stays full: every later pass fails too
        number = getattr(errno, code)
        raise OSError(number, os.strerror(number), str(path) if path is not None else None)
    if not code and _passes[name] == int(count or 1):
        os._exit(FAULT_EXIT)
