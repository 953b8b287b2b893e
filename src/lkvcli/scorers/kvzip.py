"""KVzip: Kim et al., "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction",
NeurIPS 2025 (arXiv 2505.23416)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from ..attention import attend_over, capture_attention
from ..compat import cache_kwargs
from ..errors import LkvError
from .base import ScoreContext, Scorer, position_ids, register


@register("kvzip")
@dataclass
class KVzip(Scorer):
    """The model re-reads the prompt over its own cache after an instruction to repeat it; each
    entry scores by the largest attention any re-reading query pays it (max over the queries and
    over the query heads of its KV group). Question-agnostic: it never looks past the scored part.

    Prompts longer than ``chunk_size`` are re-read chunk by chunk, each after a "repeat the part
    starting with" instruction quoting the previous chunk's last ``overlap`` tokens; a chunk's
    queries score only that chunk's entries. The re-reading adds nothing to the cache
    (:func:`lkvcli.attention.attend_over`). Cost: about one more prefill of the prompt, over a
    cache twice as long. The paper keeps one global top over every layer and head
    (``allocation: global``) and always keeps 4 sinks. Batch size 1 only. Without a tokenizer
    (tests) the prompt is re-read with no instruction.
    """

    distribution: ClassVar[bool] = False  # peak attention, not a distribution

    sink_tokens: int = 4
    allocation: Literal["uniform", "heads", "global"] = "global"
    instruction: str = "\n\nRepeat the previous context exactly."
    continuation: str = "\n\nRepeat the part of the previous context exactly, starting with"
    chunk_size: int = 2048
    overlap: int = 8

    def validate(self) -> None:
        super().validate()
        if self.chunk_size < 1 or self.overlap < 0:
            raise LkvError(f"{self.name}: chunk_size must be >= 1 and overlap >= 0")

    def raw_scores(self, ctx: ScoreContext) -> torch.Tensor:
        if ctx.batch != 1 or position_ids(ctx.attention_mask, ctx.prompt_len, ctx.device) is not None:
            raise LkvError("the kvzip scorer supports batch size 1 only")
        L, ids = ctx.prompt_len, ctx.input_ids
        suffix = self._encode(ctx, _assistant_suffix(ctx.tokenizer))
        scores = None
        for start in range(0, L, self.chunk_size):
            end = min(L, start + self.chunk_size)
            if start == 0:
                lead = self._encode(ctx, self.instruction)
            else:
                lead = torch.cat([self._encode(ctx, self.continuation), ids[:, max(0, start - self.overlap):start]], 1)
            feed = torch.cat([lead, suffix, ids[:, start:end]], dim=1)
            part = self._reread(ctx, feed, first_query=lead.shape[1] + suffix.shape[1])
            if scores is None:
                scores = torch.zeros_like(part)
            scores[..., start:end] = part[..., start:end]
        return scores

    def _reread(self, ctx: ScoreContext, feed: torch.Tensor, first_query: int) -> torch.Tensor:
        """Peak attention over the L prompt keys of ``feed``'s queries from ``first_query`` on."""
        L = ctx.prompt_len
        positions = torch.arange(L, L + feed.shape[1], device=ctx.device)[None]
        capture = capture_attention(ctx.model, key_len=L, query_start=L + first_query, past_len=L,
                                    reduction="max", rows="max")
        with torch.inference_mode(), attend_over(ctx.state.cache), capture as cap:
            decoder = ctx.model.get_decoder()
            decoder(input_ids=feed, position_ids=positions, **cache_kwargs(decoder, ctx.state.cache), use_cache=True)
        return cap.scores(renormalise=False)

    @staticmethod
    def _encode(ctx: ScoreContext, text: str) -> torch.Tensor:
        if ctx.tokenizer is None or not text:
            return torch.zeros((1, 0), dtype=torch.long, device=ctx.device)
        ids = ctx.tokenizer(text, add_special_tokens=False).input_ids
        return torch.tensor([ids], dtype=torch.long, device=ctx.device)


def _assistant_suffix(tokenizer) -> str:
    """What the chat template puts between a user message and the assistant's reply ("" without one)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return ""
    marker = "\x00LKV\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                         tokenize=False)
    return text.split(marker, 1)[1] if marker in text else ""
