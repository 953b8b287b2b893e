"""``predictions.jsonl`` as the journal of an eval: one line per (record, method, budget, part),
appended and fsynced as each is computed. Re-running the same command skips what is there.

``journal.json`` beside it holds the settings that decide the rows' values (model, targets,
adapter, mode, answer length, dtype, every method's options). A folder written with other
settings is refused, or wiped with ``overwrite``; budgets, methods, parts and ``limit`` may
change between runs (new rows are added, aggregates use only the selected ones).
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import LkvError
from ..files import append_line, read_jsonl, remove_leftovers, write_json_atomic

PREDICTIONS = "predictions.jsonl"
SETTINGS = "journal.json"
JOURNAL_FORMAT = "lkv-eval-journal"
OUTPUTS = (PREDICTIONS, SETTINGS, "results.json", "report.md", "config.json")


def row_key(row: dict) -> tuple:
    return (row["id"], row["method"], row["budget"], row["part"])


def _difference(old: dict, new: dict) -> str | None:
    """The first setting that differs (methods present in only one run may differ freely)."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key == "scorers":
            for name in sorted(set(a or {}) & set(b or {})):
                if a[name] != b[name]:
                    return f"options of {name}: {a[name]} vs {b[name]}"
        elif a != b:
            return f"{key}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"
    return None


class Journal:
    """The rows already computed in ``folder`` and a durable way to add more."""

    def __init__(self, folder: str | Path, settings: dict, overwrite: bool = False):
        self.folder = Path(folder)
        remove_leftovers(self.folder)
        self.path = self.folder / PREDICTIONS
        settings = {"format": JOURNAL_FORMAT, "version": 1, **settings}
        old = self._old_settings()
        why = None if old is None else _difference(old, settings)
        if why is None and old is None and self.path.is_file() and self.path.stat().st_size:
            why = "it has no journal.json (written by an older lkv)"
        if why is not None:
            if not overwrite:
                raise LkvError(f"results folder {self.folder} was written with other settings ({why}); "
                               "use another --out, or --overwrite to replace it")
            for name in OUTPUTS:
                (self.folder / name).unlink(missing_ok=True)
            old = None
        if old is not None:
            settings["scorers"] = {**old.get("scorers", {}), **settings.get("scorers", {})}
        write_json_atomic(self.folder / SETTINGS, settings)
        self.rows = read_jsonl(self.path, repair=True, fix="delete that line to recompute it, or use --overwrite")
        self.done = {row_key(r) for r in self.rows}
        self.resumed = len(self.rows)

    def _old_settings(self) -> dict | None:
        path = self.folder / SETTINGS
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            return {"format": "unreadable"}

    def has(self, *key) -> bool:
        return tuple(key) in self.done

    def write(self, row: dict) -> None:
        """Append one row and make it durable before returning."""
        key = row_key(row)
        if key in self.done:
            return
        append_line(self.path, json.dumps(row, ensure_ascii=False))
        self.rows.append(row)
        self.done.add(key)
