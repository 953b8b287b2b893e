"""Files written atomically (aside, then renamed into place) and read with one clear error each.

Every on-disk format of lkv (targets, training runs, adapters, bundles, results) writes
through these helpers, so a crash at any moment leaves the old file or the new one, never a
torn one. Only safetensors, JSON and JSONL are read or written: nothing is unpickled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from . import faults
from .errors import LkvError


def write_json_atomic(path: Path, obj) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    """Give a temporary file normal permissions and rename it into place (atomic on POSIX)."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        faults.point("file-write", path)
        _publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextmanager
def atomic_folder(final: Path):
    """Yield a temporary sibling folder; when the block succeeds it replaces ``final`` by a rename."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        faults.point("folder-rename", final)
        old = final.with_name(f".{final.name}.old-{os.getpid()}") if final.exists() else None
        if old is not None:  # moved aside, not deleted: until the rename below, the old folder survives a crash
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def save_tensors_atomic(path: Path, tensors: dict, metadata: dict | None = None) -> None:
    """A safetensors file, serialised in memory and written like any other file (so a full disk is an
    ``OSError`` naming the file)."""
    write_bytes_atomic(Path(path), save({k: v.contiguous() for k, v in tensors.items()}, metadata=metadata))


def remove_leftovers(folder: Path) -> None:
    """Clear what an atomic write left behind when its process died (``*.tmp`` files, ``.NAME.tmp-*``
    folders; a ``.NAME.old-*`` folder moved aside goes back when NAME is missing), in ``folder`` and its
    sub-folders. Only the folder's lock holder calls it."""
    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file() and path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)
        elif path.is_dir() and path.name.startswith(".") and ".tmp-" in path.name:
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_dir() and path.name.startswith(".") and ".old-" in path.name:  # replaced mid-way
            final = path.with_name(path.name[1:].rsplit(".old-", 1)[0])
            if final.exists():
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.replace(path, final)  # the new one never arrived: the old one is back


def append_line(path: Path, line: str) -> None:
    """Append one journal line and make it durable before returning."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line if line.endswith("\n") else line + "\n")
        fh.flush()
        faults.point("journal-line", path)
        os.fsync(fh.fileno())


def read_jsonl(path: Path, repair: bool = False, fix: str = "delete that line") -> list[dict]:
    """The objects of a JSONL journal; ``repair`` cuts a partial last line (a crash mid-append).
    A malformed complete line fails with its line number and ``fix``."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    good_end = raw.rfind(b"\n") + 1
    if good_end < len(raw) and repair:
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
    rows = []
    for lineno, line in enumerate(raw[:good_end].decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise LkvError(f"{path} line {lineno}: malformed record ({exc.msg}); {fix}") from exc
    return rows


def read_tensors(path: Path, hint: str) -> dict[str, torch.Tensor]:
    """A safetensors file; a missing or unreadable one is an LkvError ending with ``hint``."""
    if not path.is_file():
        raise LkvError(f"{path} is missing; {hint}")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise LkvError(f"{path} is unreadable ({str(exc).splitlines()[0]}); {hint}") from None


def read_json(path: Path, hint: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LkvError(f"{path} is missing; {hint}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise LkvError(f"{path} is not valid JSON ({exc}); {hint}") from None


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
