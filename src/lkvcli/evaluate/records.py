"""Which records ``lkv eval`` reads, and where each prompt's context ends (``context`` mode)."""

from __future__ import annotations

from ..context_mode import context_split
from ..errors import LkvError


def select_records(reader, split: str, validation_ids: list[str] | None, limit: int | None) -> list[int]:
    """Indices of the held-out records: the adapter run's validation ids (``auto`` when known), or all."""
    ids = reader.ids()
    if split == "validation" and validation_ids is None:
        raise LkvError("split=validation needs an adapter run that lists its validation records; use split=all")
    if split in ("auto", "validation") and validation_ids is not None:
        wanted = set(validation_ids)
        chosen = [i for i, rid in enumerate(ids) if rid in wanted]
        if not chosen:
            raise LkvError("none of the adapter run's validation records is in these targets; pass split=all or the "
                           "targets the adapter was trained on")
    else:
        chosen = list(range(len(ids)))
    return chosen[:limit] if limit else chosen


def split_ids(record, mode: str, tokenizer, device):
    """``(head, tail, cut)``: the scored part of the prompt (1, cut), the rest fed after eviction."""
    ids = record.prompt_ids[None].to(device)
    cut = ids.shape[1] if mode == "whole" else context_split(record, tokenizer)
    return ids[:, :cut], ids[:, cut:], cut
