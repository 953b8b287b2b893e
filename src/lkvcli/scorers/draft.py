"""Draft-based scoring in the style of SpecKV (Galim et al., "Draft-based Approximate Inference for LLMs",
arXiv 2506.08373) and Lookahead Q-Cache (Wang et al., EMNLP 2025, arXiv 2505.20334)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import capture_attention
from ..compat import cache_kwargs
from ..errors import LkvError
from ..evict import evict, keep_indices
from ..generate import Prefill, fork_cache, greedy_decode, prefill
from ..models import load_model
from .base import ScoreContext, Scorer, register


def self_draft_scores(ctx: ScoreContext, tokens: int, rows: str = "mean") -> torch.Tensor:
    """The attention over the prompt of the first ``tokens`` tokens the model itself answers (greedy,
    over a fork of the prompt's full cache, which stays as it was), combined over those queries by
    ``rows`` (mean or max): (1, layers, kv_heads, L). Batch size 1."""
    if ctx.batch != 1:
        raise LkvError("scoring with the model's own draft supports batch size 1 only")
    L, state = ctx.prompt_len, ctx.state
    fork = Prefill(cache=fork_cache(state.cache), logits=state.logits, next_position=state.next_position)
    with capture_attention(ctx.model, key_len=L, query_start=L, past_len=L, reduction=ctx.reduction, rows=rows) as cap:
        greedy_decode(ctx.model, fork, tokens, feed_last=True)
    return cap.scores()


@register("draft")
@dataclass
class Draft(Scorer):
    """A draft model greedily generates ``tokens`` tokens after the prompt; their queries in the
    TARGET model, run over (a fork of) the prompt's cache, score the prompt.

    ``draft_model``: None uses the target model itself (its drafting then runs over the
    target's own cache, so the draft tokens' queries are captured while generating);
    otherwise a model id/folder sharing the target's tokenizer. ``compress_budget`` (target
    as draft only): draft from a SnapKV-compressed copy of the cache, as Lookahead Q-Cache
    does, then re-score the full prompt. The draft does not stop at EOS (always ``tokens``
    queries). In the ``context`` mode the draft continues the context. Batch size 1 only.
    """

    tokens: int = 16
    draft_model: str | None = None
    compress_budget: int | None = None
    snapkv_window: int = 32

    def validate(self) -> None:
        super().validate()
        if self.tokens < 1:
            raise LkvError(f"{self.name}: tokens must be >= 1")
        if self.compress_budget is not None and (self.compress_budget < 1 or self.draft_model is not None):
            raise LkvError(f"{self.name}: compress_budget must be >= 1 and needs draft_model unset (the target drafts)")

    def capture_spec(self, prompt_len: int) -> dict | None:
        if self.compress_budget is None:
            return None
        return {"query_start": max(0, prompt_len - self.snapkv_window)}

    def raw_scores(self, ctx: ScoreContext) -> torch.Tensor:
        if ctx.batch != 1:
            raise LkvError("the draft scorer supports batch size 1 only")
        L, state = ctx.prompt_len, ctx.state
        if self.draft_model is None and self.compress_budget is None:
            return self_draft_scores(ctx, self.tokens)
        if self.draft_model is None:  # Lookahead Q-Cache: draft over a SnapKV-compressed cache
            keep = keep_indices(ctx.capture.scores(), [self.compress_budget] * len(state.cache.layers),
                                recent_window=self.snapkv_window // 2)
            small = evict(state.cache, keep).cache
            tokens, _ = greedy_decode(ctx.model, Prefill(small, state.logits, state.next_position), self.tokens)
        else:
            tokens = self._draft_tokens(ctx)
        ids = torch.tensor([tokens], device=ctx.device)
        positions = torch.arange(L, L + ids.shape[1], device=ctx.device)[None]
        with capture_attention(ctx.model, key_len=L, query_start=L, past_len=L, reduction=ctx.reduction) as cap:
            with torch.inference_mode():
                ctx.model(input_ids=ids, position_ids=positions, **cache_kwargs(ctx.model, fork_cache(state.cache)), use_cache=True,
                          logits_to_keep=1)
        return cap.scores()

    def _draft_tokens(self, ctx: ScoreContext) -> list[int]:
        drafts = ctx.resources.setdefault("draft_models", {})
        if self.draft_model not in drafts:
            loaded = load_model(self.draft_model, device=str(ctx.device))
            vocab = getattr(ctx.tokenizer, "get_vocab", lambda: None)()
            if vocab is not None and loaded.tokenizer.get_vocab() != vocab:
                raise LkvError(f"draft model {self.draft_model!r} has another tokenizer than the target model")
            drafts[self.draft_model] = loaded.model
        draft = drafts[self.draft_model]
        tokens, _ = greedy_decode(draft, prefill(draft, ctx.input_ids), self.tokens)
        return tokens
