"""H2O: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs" (NeurIPS 2023, arXiv 2306.14048)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import ScoreContext, Scorer, captured, register


@register("h2o")
@dataclass
class H2O(Scorer):
    """Observed attention: the attention each prompt key received from all prompt queries during
    prefill (the capture averages over queries, which ranks keys like H2O's sum). Costs
    O(L^2) extra work in chunks, no extra memory."""


    def capture_spec(self, prompt_len: int) -> dict:
        return {"query_start": 0}

    def raw_scores(self, ctx: ScoreContext):
        return captured(ctx)
