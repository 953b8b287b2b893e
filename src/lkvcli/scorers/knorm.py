"""Knorm: Devoto et al., "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression" (EMNLP 2024, arXiv 2406.11430)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import ScoreContext, Scorer, register


@register("knorm")
@dataclass
class Knorm(Scorer):
    """Keep the keys with the smallest L2 norm (score = -norm), read from the prefill cache.

    Sliding-window layers hold only their last entries; positions they no longer hold
    score lowest (those layers are not evicted anyway, see :mod:`lkvcli.evict`).
    """

    distribution = False

    def raw_scores(self, ctx: ScoreContext):
        L = ctx.prompt_len
        rows = []
        for layer in ctx.state.cache.layers:
            norms = -layer.keys.float().norm(dim=-1)  # (b, kv, held)
            held = norms.shape[-1]
            if held < L:
                low = norms.amin() - 1 if held else torch.zeros((), device=norms.device)
                pad = low.expand(*norms.shape[:-1], L - held)
                norms = torch.cat([pad, norms], dim=-1)
            rows.append(norms[..., -L:])
        return torch.stack(rows, dim=1)
