"""One attention-capture mechanism for every score lkv computes.

Ground truth (response queries), lookahead scores (lookahead queries) and query-based
baselines (SnapKV window, TOVA, draft queries, observed attention) all need the same
thing: the attention probabilities of a few chosen queries over the prompt keys, per
layer, reduced over the query heads of each KV head's group. Models run with the
``lkv_sdpa`` attention implementation, which is plain SDPA (outputs unchanged) plus, while
an :class:`AttentionCapture` is active, the probabilities of the chosen query rows only,
computed in chunks and reduced at once: memory stays linear in the prompt length.
"""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch
import torch.nn.functional as F

ATTENTION_NAME = "lkv_sdpa"
GROUP_REDUCTIONS = ("mean", "max")
# The captures active now; several may be (one shared prefill serves every scorer's query rows).
_ACTIVE: contextvars.ContextVar[tuple[AttentionCapture, ...]] = contextvars.ContextVar("lkv_capture", default=())


class AttentionCapture:
    """Accumulate, per layer and KV head, the attention that query slots ``[query_start, query_end)``
    pay to key slots ``[0, key_len)``.

    Slots are indices in the sequence as the cache sees it (prefill slot 0 is the first
    token). The capture follows the slot of each layer's queries across successive
    forward calls (prefill, then decode steps), starting at ``past_len``.
    """

    def __init__(
        self,
        num_layers: int,
        key_len: int,
        query_start: int,
        query_end: int | None = None,
        past_len: int = 0,
        reduction: str = "mean",
        max_chunk_elements: int = 1 << 25,
    ):
        if reduction not in GROUP_REDUCTIONS:
            raise ValueError(f"group reduction must be one of {GROUP_REDUCTIONS}, not {reduction!r}")
        self.key_len = key_len
        self.query_start = query_start
        self.query_end = query_end
        self.reduction = reduction
        self.max_chunk_elements = max_chunk_elements
        self.sums: list[torch.Tensor | None] = [None] * num_layers
        self.counts = [0] * num_layers
        self.seen = [past_len] * num_layers

    def observe(self, module, query, key, attention_mask, scaling, kwargs) -> None:
        layer = module.layer_idx
        batch, num_heads, q_len, _ = query.shape
        num_kv, k_len = key.shape[1], key.shape[2]
        first = self.seen[layer]
        self.seen[layer] = first + q_len
        lo = max(self.query_start - first, 0)
        hi = q_len if self.query_end is None else min(q_len, self.query_end - first)
        if hi <= lo:
            return
        key_first = first + q_len - k_len  # slot of key index 0 (sliding caches keep only recent keys)
        k0, k1 = max(0, -key_first), min(k_len, self.key_len - key_first)
        if k1 <= k0:
            self.counts[layer] += hi - lo
            return
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        softcap = kwargs.get("softcap")
        window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
        keys = key.float().transpose(-1, -2)
        group = num_heads // num_kv
        rows = max(1, self.max_chunk_elements // max(1, batch * num_heads * k_len))
        total = None
        for r0 in range(lo, hi, rows):
            r1 = min(hi, r0 + rows)
            m = r1 - r0
            q = query[:, :, r0:r1].float().reshape(batch, num_kv, group * m, -1)
            scores = (q @ keys).view(batch, num_kv, group, m, k_len) * scale
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            scores = _apply_mask(scores, attention_mask, r0, r1, first, key_first, window)
            probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)[..., k0:k1]
            reduced = probs.mean(2) if self.reduction == "mean" else probs.amax(2)
            part = reduced.sum(2)
            total = part if total is None else total + part
        total = F.pad(total, (key_first + k0, self.key_len - (key_first + k1)))
        self.sums[layer] = total if self.sums[layer] is None else self.sums[layer] + total
        self.counts[layer] += hi - lo

    def scores(self, renormalise: bool = True) -> torch.Tensor:
        """(batch, layers, kv_heads, key_len): mean over the captured queries, renormalised over the keys."""
        missing = [i for i, s in enumerate(self.sums) if s is None]
        if missing:
            raise RuntimeError(f"no query was captured in layers {missing[:5]}...; check query_start/past_len")
        out = torch.stack([s / max(c, 1) for s, c in zip(self.sums, self.counts)], dim=1)
        return normalise(out) if renormalise else out


def normalise(scores: torch.Tensor) -> torch.Tensor:
    """Renormalise over the last dim; all-zero rows stay zero."""
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total > 0, total, torch.ones_like(total))


def _apply_mask(scores, attention_mask, r0, r1, first, key_first, window):
    """Mask the chosen rows; without a mask (SDPA's causal fast path) build causal (+ sliding) from slots."""
    if attention_mask is not None:
        mask = attention_mask[..., r0:r1, :]
        mask = mask.unsqueeze(2) if mask.dim() == 4 else mask  # (b, 1|H, 1, m, k) against (b, kv, g, m, k)
        if mask.shape[1] not in (1, scores.shape[1]):
            mask = mask.reshape(mask.shape[0], scores.shape[1], -1, *mask.shape[-2:])
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask.float()
    q_slots = torch.arange(first + r0, first + r1, device=scores.device)[:, None]
    k_slots = torch.arange(key_first, key_first + scores.shape[-1], device=scores.device)[None, :]
    allowed = k_slots <= q_slots
    if window:
        allowed &= k_slots > q_slots - window
    return scores.masked_fill(~allowed, float("-inf"))


def lkv_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA attention; while a capture is active, it also records the chosen queries' probabilities."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    for capture in _ACTIVE.get():
        capture.observe(module, query, key, attention_mask, scaling, kwargs)
    valid = (_KEY_VALID.get() or {}).get(module.layer_idx)
    if valid is not None:
        attention_mask = _mask_key_padding(attention_mask, valid, query.shape[1], query.shape[2], key.shape[2])
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


# Per layer, which cache slots of each batch row (and KV head) hold real entries (rows or heads
# evicted to different sizes, padded to one length); slots past a mask's length (tokens decoded
# since) are real.
_KEY_VALID: contextvars.ContextVar[dict[int, torch.Tensor] | None] = contextvars.ContextVar("lkv_key_valid",
                                                                                         default=None)


@contextmanager
def key_padding(valid: dict[int, torch.Tensor] | None):
    """Inside the block, layer ``i`` attends only to the slots where ``valid[i]`` (batch, slots) is True."""
    token = _KEY_VALID.set(valid)
    try:
        yield
    finally:
        _KEY_VALID.reset(token)


def _mask_key_padding(attention_mask, valid: torch.Tensor, heads: int, q_len: int, k_len: int) -> torch.Tensor:
    """``attention_mask`` (None: causal) with the padded key slots masked out, as a bool mask.
    ``valid`` is (batch, slots) or, when KV heads keep different counts, (batch, kv_heads, slots)."""
    device = valid.device
    valid = valid if valid.dim() == 3 else valid[:, None]
    keys = torch.ones(*valid.shape[:2], k_len, dtype=torch.bool, device=device)
    keys[..., : valid.shape[-1]] = valid[..., :k_len]
    if keys.shape[1] > 1:  # per KV head: repeat over the query heads of each group
        keys = keys.repeat_interleave(heads // keys.shape[1], dim=1)
    mask = keys[:, :, None, :]
    if attention_mask is None or attention_mask.shape[-1] < k_len:  # none, or built for a longer layer 0
        q_slots = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        return mask & (torch.arange(k_len, device=device)[None, :] <= q_slots)
    given = attention_mask[..., :k_len]
    if given.dtype != torch.bool:
        given = given == 0
    return given & mask


_REGISTERED = False


def register_attention() -> None:
    """Register ``lkv_sdpa`` (and SDPA's mask builder under the same name) with transformers."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, lkv_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _REGISTERED = True


@contextmanager
def capture_attention(model, key_len: int, query_start: int, **kwargs):
    """Activate an :class:`AttentionCapture` for the model's forward calls inside the block (nested
    blocks stack: every active capture observes the same forward calls)."""
    from .models import num_layers

    if model.config._attn_implementation != ATTENTION_NAME:
        raise RuntimeError(f"model must use attn_implementation={ATTENTION_NAME!r}; call lkvcli.models.prepare_model")
    capture = AttentionCapture(num_layers(model), key_len, query_start, **kwargs)
    token = _ACTIVE.set((*_ACTIVE.get(), capture))
    try:
        yield capture
    finally:
        _ACTIVE.reset(token)
