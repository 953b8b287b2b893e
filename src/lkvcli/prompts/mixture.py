"""A mixture of prompt sources: ``collect.data`` given as a list, each source with a count.

    data:
      - {data: "builtin:n=200,tasks=closed,seed=0"}
      - {data: prompts/chat.jsonl, count: 50}
      - {data: "hf:allenai/tulu-3-sft-mixture@train", count: 50}
      - {data: "hf:bigcode/the-stack-smol@train", count: 20, template: "{content}\n\nExplain this code."}

The list may also live in its own YAML file, given as the data spec (``recipes/data/paper-mixture.yaml``).
A file or dataset source may map its own columns onto lkv's fields (``columns``, ``extract``,
``template``, ``shots``: :mod:`lkvcli.prompts.mapping`). Each source loads as on its own (``count``: its first N records; unset: all of them); the records
are then shuffled into one stream, seeded, so that ``--limit`` and ``--num-shards`` see a mix.
Ids must be unique across sources (built-in sources with different ``seed`` never collide). Every
record's metadata names its source (``mixture_source``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Callable

import yaml

from .mapping import MAPPING_KEYS, RowMapping
from .records import PromptRecord, PromptSourceError

ENTRY_KEYS = {"data", "count", *MAPPING_KEYS}


def mixture_entries(value: list) -> list[tuple[str, int | None, RowMapping | None]]:
    """``[(spec, count, mapping)]`` of a mixture given as a list of specs or ``{data, count, ...}`` entries."""
    if not value:
        raise PromptSourceError("data: an empty mixture; list sources as {data: SPEC, count: N}")
    entries = []
    for i, item in enumerate(value):
        item = {"data": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("data"), str) or set(item) - ENTRY_KEYS:
            raise PromptSourceError(f"data[{i}]: {item!r:.120} is not a source; write {{data: SPEC, count: N}} "
                                    f"(optional: count, {', '.join(MAPPING_KEYS)})")
        count = item.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise PromptSourceError(f"data[{i}].count: {count!r} must be a positive integer (or unset: every record)")
        entries.append((item["data"], count, RowMapping.from_entry(item, f"data[{i}]")))
    return entries


def load_mixture(value: list, load: Callable[..., list[PromptRecord]], seed: int) -> list[PromptRecord]:
    """The mixture's records, shuffled with ``seed``; ``load(spec, limit=, mapping=)`` loads one source."""
    records, origin = [], {}
    for spec, count, mapping in mixture_entries(value):
        shots = mapping.shots if mapping else 0
        got = load(spec, limit=None if count is None else count + shots, mapping=mapping)[:count]
        if count is not None and len(got) < count:
            raise PromptSourceError(f"{spec}: {len(got)} records, fewer than its count {count}; lower the count")
        for record in got:
            if record.id in origin:
                raise PromptSourceError(f"record id {record.id!r} comes from two sources ({origin[record.id]} and "
                                        f"{spec}); give built-in sources different seeds or the files distinct ids")
            origin[record.id] = spec
            record.meta["mixture_source"] = spec
            records.append(record)
    random.Random(f"lkv-mixture:{seed}").shuffle(records)
    return records


MIXTURE_SUFFIXES = (".yaml", ".yml")


def is_mixture_file(spec) -> bool:
    return isinstance(spec, str) and Path(spec).suffix.lower() in MIXTURE_SUFFIXES


def read_mixture_file(spec: str) -> list:
    """The source list of a mixture kept in its own YAML file (a list of ``{data, count, ...}``)."""
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PromptSourceError(f"{spec}: no such mixture file; check the path (relative to where you run lkv)")
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise PromptSourceError(f"{path.name}{where}: not valid YAML; fix the mixture file") from None
    if not isinstance(value, list):
        raise PromptSourceError(f"{path.name}: a mixture file holds a YAML list of sources "
                                f"({{data: SPEC, count: N}}), got {type(value).__name__}")
    return value


def needs_tokenizer(spec) -> bool:
    """Whether a data spec (or mixture, or mixture file) holds a built-in source, sized in the model's tokens."""
    if is_mixture_file(spec):
        spec = read_mixture_file(spec)
    specs = [spec] if isinstance(spec, str) else [s for s, _, _ in mixture_entries(spec)]
    return any(s.strip().startswith("builtin") for s in specs)
