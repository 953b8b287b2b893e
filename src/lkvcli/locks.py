"""One writer per folder: ``lkv collect``, ``lkv train`` and ``lkv eval`` hold a lock on a file in the
folder they write (targets, run, results) for as long as they write it.

The lock is the kernel's (``flock``; NFSv4 maps it to a server-side lock): it dies with its process,
so a crash or SIGKILL never leaves a folder locked. A second process is refused with one line naming
the holder's pid and host, which the holder writes into the file. A clean exit empties the file; a
holder record still there when the lock is taken tells of a process that died holding it, and that
takeover is logged.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import LkvError

LOCK_FILE = ".lkv.lock"
log = logging.getLogger("lkvcli")


def _read(fd: int) -> dict:
    try:
        return json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:  # torn by a crash between truncate and write
        return {}


@contextmanager
def folder_lock(folder: str | Path, what: str):
    """Hold ``folder``'s lock inside the block (the folder is created if needed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            raise LkvError(f"{folder} is in use by {holder.get('what', 'another lkv job')}, pid {holder.get('pid', '?')} "
                           f"on {holder.get('host', '?')} since {holder.get('since', '?')}; wait for it to end or stop it "
                           f"before {what} writes there") from None
        left = _read(fd)
        if left.get("pid"):
            log.warning("took over the lock of %s left by %s, pid %s on %s (that process is gone)", folder,
                        left.get("what", "a job"), left["pid"], left.get("host"))
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "what": what,
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(mine).encode(), 0)
        os.fsync(fd)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # released cleanly: nothing to take over
    finally:
        os.close(fd)  # releases the lock
