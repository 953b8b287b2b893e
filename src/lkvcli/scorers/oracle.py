"""Oracle: the collected ground truth itself (the upper bound for any scorer; method.md)."""

from __future__ import annotations

from dataclasses import dataclass

from ..attention import normalise
from .base import ScoreContext, Scorer, register


@register("oracle")
@dataclass
class Oracle(Scorer):
    """The record's target (the response's own attention). In the ``context`` mode, its
    restriction to the context, renormalised. Needs a targets record (batch 1)."""


    def raw_scores(self, ctx: ScoreContext):
        if ctx.record is None:
            raise RuntimeError("the oracle scorer needs the collected record (ScoreContext.record)")
        target = ctx.record.target[..., : ctx.prompt_len].to(ctx.device)
        return normalise(target).unsqueeze(0).expand(ctx.batch, *target.shape)
