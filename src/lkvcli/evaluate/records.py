"""Which records ``lkv eval`` reads, and where each prompt's context ends (``context`` mode)."""

from __future__ import annotations

from ..errors import LkvError


def context_split(record, tokenizer) -> int:
    """Tokens of the prompt that form the context (``context`` mode): everything before the
    question, or, without one, before the chat template's tail after the last message."""
    meta = record.meta
    text = meta.get("prompt_text")
    if not text or tokenizer is None:
        raise LkvError(f"record {record.id!r} has no prompt_text; the context mode needs records from `lkv collect`")
    question = meta.get("question")
    if question and text.rfind(question) >= 0:
        cut = text.rfind(question)
    else:
        last = (meta.get("messages") or [{}])[-1].get("content") or ""
        cut = text.rfind(last) + len(last) if last and text.rfind(last) >= 0 else len(text)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc.input_ids) != record.prompt_ids.tolist():
        raise LkvError(f"record {record.id!r}: the tokenizer does not reproduce its prompt ids; use the model it was "
                       "collected with")
    starts = [s for s, _ in enc.offset_mapping]
    split = sum(1 for s in starts if s < cut)
    return max(1, min(split, record.prompt_len))


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
