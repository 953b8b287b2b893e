"""A mixture of prompt sources: ``collect.data`` given as a list, each source with a count.

    data:
      - {data: "builtin:n=200,tasks=closed,seed=0"}
      - {data: prompts/chat.jsonl, count: 50}

Each source loads as on its own (``count``: its first N records; unset: all of them); the records
are then shuffled into one stream, seeded, so that ``--limit`` and ``--num-shards`` see a mix.
Ids must be unique across sources (built-in sources with different ``seed`` never collide). Every
record's metadata names its source (``mixture_source``).
"""

from __future__ import annotations

import random
from typing import Callable

from .records import PromptRecord, PromptSourceError


def mixture_entries(value: list) -> list[tuple[str, int | None]]:
    """``[(spec, count)]`` of a mixture given as a list of specs or ``{data, count}`` mappings."""
    if not value:
        raise PromptSourceError("data: an empty mixture; list sources as {data: SPEC, count: N}")
    entries = []
    for i, item in enumerate(value):
        item = {"data": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or not isinstance(item.get("data"), str) or set(item) - {"data", "count"}:
            raise PromptSourceError(f"data[{i}]: {item!r} is not a source; write {{data: SPEC, count: N}} "
                                    "(count optional)")
        count = item.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
            raise PromptSourceError(f"data[{i}].count: {count!r} must be a positive integer (or unset: every record)")
        entries.append((item["data"], count))
    return entries


def load_mixture(value: list, load: Callable[..., list[PromptRecord]], seed: int) -> list[PromptRecord]:
    """The mixture's records, shuffled with ``seed``; ``load(spec, limit=)`` loads one source."""
    records, origin = [], {}
    for spec, count in mixture_entries(value):
        got = load(spec, limit=count)
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


def needs_tokenizer(spec) -> bool:
    """Whether a data spec (or mixture) holds a built-in source, sized in the model's tokens."""
    specs = [spec] if isinstance(spec, str) else [s for s, _ in mixture_entries(spec)]
    return any(s.strip().startswith("builtin") for s in specs)
