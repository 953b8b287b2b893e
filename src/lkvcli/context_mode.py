"""The ``context`` mode: where a record's context ends, and a record seen as its context alone.

In the ``whole`` mode (the paper's) the lookahead tokens follow the whole prompt, question
included. In the ``context`` mode they follow the context alone, before the question is known
(question-agnostic eviction): ``lkv eval --mode context`` evicts the context and then feeds the
question, and ``lkv train mode=context`` trains on :func:`context_view` of every record.
"""

from __future__ import annotations

import dataclasses

from .attention import normalise
from .errors import LkvError

def context_split(record, tokenizer) -> int:
    """Tokens of the prompt that form the context: everything before the question, or, without
    one, before the chat template's tail after the last message."""
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


def context_view(record, cut: int):
    """``record`` cut to its first ``cut`` prompt tokens: targets restricted to them and renormalised
    (the response's attention over the context alone); the id gains ``#context``."""
    return dataclasses.replace(
        record, id=f"{record.id}#context", prompt_ids=record.prompt_ids[:cut],
        target=normalise(record.target[..., :cut]),
        extras={name: normalise(t[..., :cut]) for name, t in record.extras.items()},
        meta={**record.meta, "prompt_len": cut, "context_of": record.id})


class TrainingRecords:
    """A targets reader as ``lkv train`` sees it under ``mode``: ``whole`` prompts, ``context``
    views, or ``both`` (every record twice: item ``2 i`` whole, ``2 i + 1`` its context)."""

    def __init__(self, reader, mode: str, tokenizer):
        self.reader, self.mode, self.tokenizer = reader, mode, tokenizer
        self._cuts: dict[int, int] = {}

    def items(self, indices: list[int]) -> list[int]:
        """The items of these record indices."""
        if self.mode == "both":
            return [2 * i + view for i in indices for view in (0, 1)]
        return list(indices)

    def _locate(self, item: int) -> tuple[int, bool]:
        if self.mode == "both":
            return item // 2, item % 2 == 1
        return item, self.mode == "context"

    def meta(self, item: int) -> dict:
        return self.reader.meta(self._locate(item)[0])

    def __getitem__(self, item: int):
        index, context = self._locate(item)
        record = self.reader[index]
        if not context:
            return record
        if index not in self._cuts:
            self._cuts[index] = context_split(record, self.tokenizer)
        return context_view(record, self._cuts[index])
