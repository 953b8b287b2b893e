"""TOVA: Oren et al., "Transformers are Multi-State RNNs" (EMNLP 2024, arXiv 2401.06104)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import ScoreContext, Scorer, captured, register


@register("tova")
@dataclass
class TOVA(Scorer):
    """Attention of the last prompt query over the prompt (per KV head; the paper averages all heads)."""


    def capture_spec(self, prompt_len: int) -> dict:
        return {"query_start": prompt_len - 1}

    def raw_scores(self, ctx: ScoreContext):
        return captured(ctx)
