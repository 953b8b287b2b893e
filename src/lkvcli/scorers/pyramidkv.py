"""PyramidKV: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling" (arXiv 2406.02069)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LkvError
from .base import register
from .snapkv import SnapKV


@register("pyramidkv")
@dataclass
class PyramidKV(SnapKV):
    """SnapKV scores with per-layer budgets that decrease linearly with depth, same total.

    As in the authors' code: above the protected window, the bottom layer gets
    ``2 * avg - avg / beta`` entries and the top one ``avg / beta`` (beta 20); a layer
    above the prompt length hands its excess to the others (a full budget keeps everything).
    Layers then hold different numbers of entries, so a question fed after eviction
    (``context`` mode) runs one token at a time (see :func:`lkvcli.evict.feed`).
    """

    beta: float = 20.0

    def validate(self) -> None:
        super().validate()
        if self.beta < 1:
            raise LkvError(f"{self.name}: beta must be >= 1")

    def layer_budgets(self, budget: int, num_layers: int, prompt_len: int) -> list[int]:
        budget = min(budget, prompt_len)
        protected = min(self.recent_window + self.sink_tokens, budget)
        spare = budget - protected
        if num_layers == 1 or spare == 0:
            return [budget] * num_layers
        low = spare / self.beta
        high = 2 * spare - low
        step = (high - low) / (num_layers - 1)
        raw = [high - i * step for i in range(num_layers)]
        out = [int(r) for r in raw]
        for i in sorted(range(num_layers), key=lambda i: out[i] - raw[i])[: spare * num_layers - sum(out)]:
            out[i] += 1  # largest remainders first: the total stays num_layers * budget
        return _cap([protected + o for o in out], prompt_len)


def _cap(budgets: list[int], limit: int) -> list[int]:
    """Cap every layer at the prompt length and hand the excess to the layers below the cap (same total)."""
    budgets = list(budgets)
    excess = sum(max(0, b - limit) for b in budgets)
    budgets = [min(b, limit) for b in budgets]
    while excess > 0 and any(b < limit for b in budgets):
        for i in sorted(range(len(budgets)), key=lambda i: -budgets[i]):
            if excess and budgets[i] < limit:
                budgets[i] += 1
                excess -= 1
    return budgets
