"""LookaheadKV as an NVIDIA kvpress press (``pip install 'lkvcli[kvpress]'``).

    from kvpress import pipeline  # registers "kv-press-text-generation"
    press = LookaheadKVPress.from_pretrained(".lkv-demo/bundle", compression_ratio=0.9)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    pipe(context, question=question, press=press)["answer"]

The press acts once a prefill has run through the whole model: it runs the bundle's lookahead
tokens over the complete cache (lkv's own scorer, nothing added to the cache), then keeps the
best entries of every full-attention layer and KV head in place, physically (lkv's eviction). So it
works in kvpress's pipeline (the context is compressed, the question fed after: lkv's
``--mode context``) and under ``with press(model): model.generate(...)`` (prompt and question
compressed together: lkv's whole mode). Entries kept per layer and KV head (uniform allocation,
as in every kvpress press that frees memory): ``max(1, int(L * (1 - ratio)))``, or a fixed ``budget``.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..api import LookaheadKV, resolve_bundle
from ..compat import cache_from_kwargs
from ..errors import LkvError
from ..evict import compress
from ..generate import Prefill
from ..scorers.base import ScoreContext

try:
    from kvpress import BasePress
except ImportError:  # the message names the extra; nothing else in lkv needs kvpress
    raise LkvError("LookaheadKVPress needs kvpress: pip install 'lkvcli[kvpress]'") from None


def kept_per_head(prompt_len: int, compression_ratio: float, budget: int | None) -> int:
    """Entries kept per layer and KV head: kvpress's count for a ratio, or lkv's fixed budget."""
    if budget is not None:
        return min(int(budget), prompt_len)
    return max(1, int(prompt_len * (1 - compression_ratio)))


@dataclass
class LookaheadKVPress(BasePress):
    """Keeps the entries a LookaheadKV bundle predicts the answer will attend to (see the module)."""

    bundle: str | Path | None = None
    compression_ratio: float = 0.0
    budget: int | None = None  # entries per layer and KV head; overrides compression_ratio
    revision: str | None = None
    allow_fingerprint_mismatch: bool = False
    last_scores: torch.Tensor | None = field(default=None, repr=False)  # (layers, kv_heads, L) of the last prefill

    def __post_init__(self):
        ratio = self.compression_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio < 1:
            raise LkvError(f"compression_ratio={ratio!r}: must be in [0, 1) (kvpress keeps int(L * (1 - ratio)) "
                           "entries per head); or pass budget=ENTRIES_PER_HEAD")
        if self.budget is not None and (isinstance(self.budget, bool) or not isinstance(self.budget, int)
                                        or self.budget < 1):
            raise LkvError(f"budget={self.budget!r}: must be a positive number of entries per layer and KV head")
        if self.bundle is None:
            raise LkvError("LookaheadKVPress needs a bundle: LookaheadKVPress.from_pretrained(FOLDER_OR_REPO_ID, ...)")
        self._kv, self._model, self._busy = None, None, False

    @classmethod
    def from_pretrained(cls, bundle: str | Path, compression_ratio: float = 0.0, *, budget: int | None = None,
                        revision: str | None = None, allow_fingerprint_mismatch: bool = False) -> LookaheadKVPress:
        """A press for an lkv bundle folder or Hub repo id; its model is the one the press is applied to."""
        folder = resolve_bundle(bundle, revision)
        return cls(bundle=folder, compression_ratio=compression_ratio, budget=budget, revision=revision,
                   allow_fingerprint_mismatch=allow_fingerprint_mismatch)

    def post_init_from_model(self, model):
        """Attach the bundle to ``model`` (once per model: :meth:`lkvcli.LookaheadKV.from_pretrained` returns
        the same object again); refused for a model it was not trained for."""
        if self._model is model:
            return
        kv = LookaheadKV.from_pretrained(self.bundle, model, revision=self.revision,
                                         allow_fingerprint_mismatch=self.allow_fingerprint_mismatch)
        # kvpress keeps one count per KV head (its head-adaptive presses only mask), so the bundle's
        # scores are cut with lkv's uniform allocation whatever the bundle's own allocation; the press sees
        # no prefill logits to draft from, so the lookahead scores are used without the model's own draft
        self._scorer = dataclasses.replace(kv.scorer, allocation="uniform", draft_tokens=0)
        self._kv, self._model = kv, model

    @contextmanager
    def __call__(self, model):
        self.post_init_from_model(model)
        decoder = model.get_decoder()
        handles = [decoder.register_forward_pre_hook(self._before, with_kwargs=True),
                   decoder.register_forward_hook(self._after, with_kwargs=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _before(self, module, args, kwargs):
        cache = cache_from_kwargs(kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        compressing = self.budget is not None or self.compression_ratio > 0
        self._prefill = (compressing and not self._busy and cache is not None and cache.get_seq_length() == 0
                         and ids is not None)
        self._ids = ids

    def _after(self, module, args, kwargs, output):
        if not self._prefill:
            return None
        self._prefill = False
        self._busy = True
        try:
            self.compress_cache(cache_from_kwargs(kwargs), self._ids)
        finally:
            self._busy = False
        return None

    @torch.no_grad()
    def compress_cache(self, cache, input_ids: torch.Tensor) -> None:
        """Score the prefilled ``cache`` of ``input_ids`` (1, L) with the lookahead tokens, then keep the
        best entries of every full-attention layer and KV head in place."""

        if input_ids.shape[0] != 1:
            raise LkvError(f"LookaheadKVPress compresses one prompt at a time, got a batch of {input_ids.shape[0]}")
        L = input_ids.shape[1]
        state = Prefill(cache=cache, logits=torch.zeros(1, 1), next_position=L)
        ctx = ScoreContext(model=self._kv.model, input_ids=input_ids, state=state, tokenizer=self._kv.tokenizer,
                           reduction=self._kv.reduction, resources={"adapter": self._kv.adapter})
        scores = self._scorer.score(ctx)
        self.last_scores = scores[0]
        evicted, _ = compress(self._scorer, scores, state, kept_per_head(L, self.compression_ratio, self.budget))
        for layer, kept in zip(cache.layers, evicted.cache.layers):
            layer.keys, layer.values = kept.keys, kept.values
