"""StreamingLLM: Xiao et al., "Efficient Streaming Language Models with Attention Sinks" (ICLR 2024, arXiv 2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..shapes import num_kv_heads, num_layers
from .base import ScoreContext, Scorer, register


@register("streamingllm")
@dataclass
class StreamingLLM(Scorer):
    """The first ``sink_tokens`` positions plus the most recent ones (score = position)."""

    distribution = False
    sink_tokens: int = 4

    def raw_scores(self, ctx: ScoreContext):

        L = ctx.prompt_len
        pos = torch.arange(L, device=ctx.device, dtype=torch.float32)
        return pos.expand(ctx.batch, num_layers(ctx.model), num_kv_heads(ctx.model), L)
