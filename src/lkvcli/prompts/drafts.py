"""The task interface: a :class:`TaskContext` in, a :class:`Draft` out, and the haystack draft that
most tasks build on (real text with inserted paragraphs, their facts recorded as critical spans)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

from .corpus import insert_paragraphs, make_haystack, passage


@dataclass
class TaskContext:
    rng: random.Random
    target: int                      # token target for the whole user message
    count: Callable[[str], int]      # tokens in a text
    domain: str = "plays"            # text domain of the haystack (lkvcli.prompts.corpus.DOMAINS)

    def haystack(self):
        # 1.5 words per target token: enough for any tokenizer with >= 0.67 tokens per word.
        return make_haystack(self.rng, int(self.target * 1.5) + 50, self.domain)


@dataclass
class Draft:
    render: Callable[[int], tuple[str, str]]   # size -> (context, question)
    max_size: int
    min_size: int = 1
    answer: str | list[str] | None = None
    metric: str = "agreement"
    meta: dict = field(default_factory=dict)
    describe: Callable[[str], dict] | None = None   # final context -> extra meta (and "answer", when it depends on it)


Fact = tuple[str, str, str]  # (label, the inserted paragraph, the critical text inside it)


def fact_spans(context: str, facts: Sequence[Fact]) -> list[dict]:
    """``{"fact", "text", "chars": [start, end)}`` of each fact's critical text in ``context``."""
    out = []
    for label, paragraph, text in facts:
        start = context.index(paragraph) + paragraph.index(text)
        out.append({"fact": label, "text": text, "chars": [start, start + len(text)]})
    return out


def haystack_draft(ctx: TaskContext, question: str | Callable[[list[str]], str],
                    inserts: Sequence[tuple[float, str]] = (), facts: Sequence[Fact] = (), **kwargs) -> Draft:
    """A draft over a real-text haystack with ``inserts`` (depth, paragraph) placed into it;
    ``facts`` (inside those paragraphs) are recorded as ``critical_chars``."""
    hay = ctx.haystack()
    ordered = sorted(inserts, key=lambda item: item[0])

    def render(size: int) -> tuple[str, str]:
        lines = passage(hay.lines, size)
        q = question(lines) if callable(question) else question
        return insert_paragraphs(lines, ordered), q

    meta = {"haystack": hay.meta, **kwargs.pop("meta", {})}
    if facts:
        kwargs["describe"] = lambda context: {"critical_chars": fact_spans(context, facts)}
    return Draft(render, max_size=len(hay.lines), meta=meta, **kwargs)
