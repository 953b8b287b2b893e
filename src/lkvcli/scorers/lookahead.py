"""LookaheadKV: Ahn et al., "LookaheadKV: Fast and Accurate KV Cache Eviction by Glimpsing into the Future
without Generation" (ICLR 2026, arXiv 2603.10899)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from ..adapters import load_adapter
from ..attention import normalise
from ..errors import LkvError
from .base import ScoreContext, Scorer, register
from .draft import self_draft_scores


@register("lookahead")
@dataclass
class Lookahead(Scorer):
    """The trained lookahead module's score: N learned tokens run over the prompt's cache with
    the lookahead LoRA on; their attention over the prompt, per KV head, renormalised. The
    entries they add are removed again. In the ``context`` mode they follow the context.

    ``draft_tokens`` > 0 mixes in the attention of the first k tokens of the model's own greedy answer
    (over the full cache, as the ``draft`` scorer with the target drafting; combined over them as the
    lookahead queries are): the score is ``(1 - draft_weight) * lookahead + draft_weight * draft``
    (``draft_combine: sum``) or the larger of the two terms, renormalised (``max``), for k decode steps
    more (batch size 1). Weight 0.1 answered more than 0.25 and 0.5 on held-out folds (docs/training.md).

    The adapter comes from ``ctx.resources["adapter"]`` (a :class:`lkvcli.lookahead.LookaheadAdapter`)
    or is loaded from ``adapter`` (a training run folder or a bundle).
    """

    adapter: str | None = None
    query_reduction: Literal["mean", "max"] | None = None  # None: the adapter's own (lookahead.query_reduction)
    draft_tokens: int = 0
    draft_weight: float = 0.1
    draft_combine: Literal["sum", "max"] = "sum"

    def validate(self) -> None:
        super().validate()
        if self.draft_tokens < 0 or not 0.0 <= self.draft_weight <= 1.0:
            raise LkvError(f"{self.name}: draft_tokens must be >= 0 and draft_weight in [0, 1]")

    def _adapter(self, ctx: ScoreContext):
        found = ctx.resources.get("adapter")
        if found is None:
            if self.adapter is None:
                raise LkvError("the lookahead method needs an adapter: pass --adapter RUN_DIR_OR_BUNDLE")
            found = ctx.resources["adapter"] = load_adapter(self.adapter, ctx.model)[0]
        return found

    def raw_scores(self, ctx: ScoreContext):
        adapter = self._adapter(ctx)
        rows = self.query_reduction or adapter.config.query_reduction
        scores = adapter.score(ctx.state.cache, prompt_len=ctx.prompt_len, attention_mask=ctx.attention_mask,
                               query_reduction=rows)
        if self.draft_tokens == 0:
            return scores
        drafted = self_draft_scores(ctx, self.draft_tokens, rows=rows).to(scores.device)
        scores, drafted = (1.0 - self.draft_weight) * scores, self.draft_weight * drafted
        return scores + drafted if self.draft_combine == "sum" else normalise(torch.maximum(scores, drafted))
