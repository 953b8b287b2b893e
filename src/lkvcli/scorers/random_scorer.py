"""Random eviction (a floor for every other method)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..shapes import num_kv_heads, num_layers
from .base import ScoreContext, Scorer, register


@register("random")
@dataclass
class Random(Scorer):
    """Uniform random scores from a seeded generator (the same seed gives the same kept sets)."""

    distribution = False
    seed: int = 0

    def raw_scores(self, ctx: ScoreContext):

        gen = torch.Generator().manual_seed(self.seed)
        shape = (ctx.batch, num_layers(ctx.model), num_kv_heads(ctx.model), ctx.prompt_len)
        return torch.rand(shape, generator=gen).to(ctx.device)
