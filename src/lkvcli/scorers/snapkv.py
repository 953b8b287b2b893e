"""SnapKV: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024 (arXiv 2404.14469)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LkvError
from .base import ScoreContext, Scorer, captured, register


@register("snapkv")
@dataclass
class SnapKV(Scorer):
    """Attention of the last ``window`` prompt queries over the prompt, captured during prefill.

    The paper keeps the whole window and smooths with 1-D pooling (kernel 7; kvpress: avg,
    kernel 5). Our defaults measured better on ground-truth recall (docs/eval.md): no
    pooling, and only the last ``window // 2`` positions protected (``recent_window=None``);
    protecting the whole window leaves nothing to choose at budgets up to the window. In the
    ``context`` mode the window is the end of the context.
    """

    window: int = 32
    recent_window: int | None = None  # None: window // 2

    def __post_init__(self):
        if self.recent_window is None:
            self.recent_window = self.window // 2
        super().__post_init__()

    def validate(self) -> None:
        super().validate()
        if self.window < 1:
            raise LkvError(f"{self.name}: window must be >= 1")

    def capture_spec(self, prompt_len: int) -> dict:
        return {"query_start": max(0, prompt_len - self.window)}

    def raw_scores(self, ctx: ScoreContext):
        return captured(ctx)
