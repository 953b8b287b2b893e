"""Prompt records from files (.jsonl, .json, .parquet) and Hugging Face ``datasets``."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .mapping import RowMapping
from .records import ACCEPTED_FIELDS, PromptRecord, PromptSourceError, record_from_row

_INSTALL_HINT = "pip install datasets (or pip install 'lkvcli[data]')"
_SAVED_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")
DEFAULT_SPLITS = ("test", "train")


def _no_records(name: str) -> PromptSourceError:
    return PromptSourceError(f"{name}: no records; add at least one record with {ACCEPTED_FIELDS}")


def _build(rows: Iterable[tuple[Any, str, str]], name: str, source: str,
           mapping: RowMapping | None = None) -> list[PromptRecord]:
    """rows: (raw row, default id, location label), mapped first when given. Checks for empty input and
    duplicate ids."""
    if mapping is not None:
        rows = mapping.rows(iter(rows))
    records: list[PromptRecord] = []
    seen: dict[str, str] = {}
    for row, default_id, where in rows:
        rec = record_from_row(row, default_id=default_id, where=where, source=source)
        if rec.id in seen:
            raise PromptSourceError(f"{where}: duplicate id {rec.id!r} (first used at {seen[rec.id]}); "
                                    "make the ids unique or drop the 'id' fields")
        seen[rec.id] = where
        records.append(rec)
    if not records:
        raise _no_records(name)
    return records


def _jsonl_rows(path: Path):
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptSourceError(f"{where}: not valid JSON ({exc}); fix or delete that line") from None
            yield row, f"{path.stem}-{lineno}", where


def _indexed_rows(rows: Iterable[Any], name: str, stem: str):
    for index, row in enumerate(rows):
        yield row, f"{stem}-{index}", f"{name} index {index}"


def _json_rows(path: Path) -> list:
    text = path.read_text(encoding="utf-8")
    if not text.strip():
        raise _no_records(path.name)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PromptSourceError(f"{path.name}: not valid JSON ({exc}); fix the file "
                                "(for one object per line name it .jsonl)") from None
    if isinstance(data, dict):
        for key in ("data", "records"):
            if isinstance(data.get(key), list):
                return data[key]
    if isinstance(data, list):
        return data
    raise PromptSourceError(f"{path.name}: expected a list of objects or an object with a list under "
                            f"\"data\" or \"records\", got {type(data).__name__}; restructure the file")


def _parquet_rows(path: Path) -> list:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PromptSourceError(f"{path.name}: reading .parquet files needs pyarrow; "
                                "pip install pyarrow (or pip install 'lkvcli[data]')") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types
        raise PromptSourceError(f"{path.name}: cannot read as parquet ({type(exc).__name__}: {exc}); "
                                "check that it is a valid .parquet file") from None


def load_file(path: Path, mapping: RowMapping | None = None) -> list[PromptRecord]:
    """Records from a .jsonl / .json / .parquet file."""
    suffix = path.suffix.lower()
    source = str(path)
    if suffix == ".jsonl":
        return _build(_jsonl_rows(path), path.name, source, mapping)
    if suffix == ".json":
        return _build(_indexed_rows(_json_rows(path), path.name, path.stem), path.name, source, mapping)
    if suffix == ".parquet":
        return _build(_indexed_rows(_parquet_rows(path), path.name, path.stem), path.name, source, mapping)
    raise PromptSourceError(f"{path}: unsupported file type {suffix or '(none)'!r}; use a .jsonl, .json or "
                            ".parquet file, a Dataset.save_to_disk folder, hf:NAME or builtin:")


def _import_datasets():
    try:
        import datasets
    except ImportError:
        raise PromptSourceError(f"loading Hugging Face datasets needs the 'datasets' package; {_INSTALL_HINT}") from None
    return datasets


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and any((path / marker).is_file() for marker in _SAVED_MARKERS)


def _pick_split(dsets, split: str | None, name: str):
    """A Dataset from a DatasetDict: the named split, else 'test', else 'train', else the only one."""
    splits = list(dsets.keys())
    if split is not None:
        if split not in dsets:
            raise PromptSourceError(f"{name}: no split {split!r}; available splits: {', '.join(splits)}")
        return dsets[split], split
    for candidate in DEFAULT_SPLITS:
        if candidate in dsets:
            return dsets[candidate], candidate
    if len(splits) == 1:
        return dsets[splits[0]], splits[0]
    raise PromptSourceError(f"{name}: no 'test' or 'train' split; choose one with @SPLIT from: {', '.join(splits)}")


def _dataset_records(ds, name: str, stem: str, source: str, limit: int | None,
                     mapping: RowMapping | None) -> list[PromptRecord]:
    if limit is not None and len(ds) > limit:
        ds = ds.select(range(limit))
    return _build(_indexed_rows(iter(ds), name, stem), name, source, mapping)


def load_saved_dataset(path: Path, split: str | None, limit: int | None,
                       mapping: RowMapping | None = None) -> list[PromptRecord]:
    """Records from a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``."""
    datasets = _import_datasets()
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as exc:  # noqa: BLE001
        raise PromptSourceError(f"{path}: cannot load the saved dataset ({type(exc).__name__}: {exc}); "
                                "re-create it with Dataset.save_to_disk") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded, split = _pick_split(loaded, split, str(path))
    elif split is not None:
        raise PromptSourceError(f"{path}@{split}: this folder holds a single Dataset, not splits; drop '@{split}'")
    source = f"{path}@{split}" if split else str(path)
    return _dataset_records(loaded, path.name, path.name, source, limit, mapping)


def load_hub_dataset(name: str, config: str | None, split: str | None, *, limit: int | None,
                     trust_remote_code: bool, mapping: RowMapping | None = None) -> list[PromptRecord]:
    """Records from ``datasets.load_dataset(name, config)`` (needs network or the local HF cache)."""
    datasets = _import_datasets()
    spec = f"hf:{name}" + (f":{config}" if config else "") + (f"@{split}" if split else "")
    kwargs: dict = {"split": split} if split else {}
    if trust_remote_code:
        kwargs["trust_remote_code"] = True
    try:
        loaded = datasets.load_dataset(name, config, **kwargs)
    except Exception as exc:  # noqa: BLE001 - network, auth, missing config...
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PromptSourceError(f"{spec}: could not load the dataset ({type(exc).__name__}: {msg[:200]}); check "
                                "the name/config/split and the network, or pass a Dataset.save_to_disk folder") from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded, split = _pick_split(loaded, split, spec)
    stem = name.rsplit("/", 1)[-1] + (f"-{config}" if config else "")
    source = f"hf:{name}" + (f":{config}" if config else "") + f"@{split}"
    return _dataset_records(loaded, spec, stem, source, limit, mapping)
