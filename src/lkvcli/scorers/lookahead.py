"""LookaheadKV: Ahn et al., "LookaheadKV: Fast and Accurate KV Cache Eviction by Glimpsing into the Future
without Generation" (ICLR 2026, arXiv 2603.10899)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..adapters import load_adapter
from ..errors import LkvError
from .base import ScoreContext, Scorer, register


@register("lookahead")
@dataclass
class Lookahead(Scorer):
    """The trained lookahead module's score: N learned tokens run over the prompt's cache with
    the lookahead LoRA on; their attention over the prompt, per KV head, renormalised. The
    entries they add are removed again. In the ``context`` mode they follow the context.

    The adapter comes from ``ctx.resources["adapter"]`` (a :class:`lkvcli.lookahead.LookaheadAdapter`)
    or is loaded from ``adapter`` (a training run folder or a bundle).
    """

    adapter: str | None = None
    query_reduction: Literal["mean", "max"] | None = None  # None: the adapter's own (lookahead.query_reduction)

    def _adapter(self, ctx: ScoreContext):
        found = ctx.resources.get("adapter")
        if found is None:
            if self.adapter is None:
                raise LkvError("the lookahead method needs an adapter: pass --adapter RUN_DIR_OR_BUNDLE")
            found = ctx.resources["adapter"] = load_adapter(self.adapter, ctx.model)[0]
        return found

    def raw_scores(self, ctx: ScoreContext):
        adapter = self._adapter(ctx)
        override = {"query_reduction": self.query_reduction} if self.query_reduction else {}
        return adapter.score(ctx.state.cache, prompt_len=ctx.prompt_len, attention_mask=ctx.attention_mask, **override)
