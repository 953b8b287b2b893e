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

from .shapes import num_layers

ATTENTION_NAME = "lkv_sdpa"
GROUP_REDUCTIONS = ("mean", "max")
ROW_REDUCTIONS = ("mean", "max")
LOG2E = 1.4426950408889634  # 1 / ln 2
# The captures active now; several may be (one shared prefill serves every scorer's query rows).
_ACTIVE: contextvars.ContextVar[tuple[AttentionCapture, ...]] = contextvars.ContextVar("lkv_capture", default=())


class AttentionCapture:
    """Accumulate, per layer and KV head, the attention that query slots ``[query_start, query_end)``
    pay to key slots ``[0, key_len)``.

    Slots are indices in the sequence as the cache sees it (prefill slot 0 is the first
    token). The capture follows the slot of each layer's queries across successive
    forward calls (prefill, then decode steps), starting at ``past_len``.

    ``reduction`` reduces the query heads of a KV group (mean or max); ``rows`` reduces the
    captured queries: their mean (the default) or their max (what single queries rely on).
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
        rows: str = "mean",
    ):
        if reduction not in GROUP_REDUCTIONS:
            raise ValueError(f"group reduction must be one of {GROUP_REDUCTIONS}, not {reduction!r}")
        if rows not in ROW_REDUCTIONS:
            raise ValueError(f"row reduction must be one of {ROW_REDUCTIONS}, not {rows!r}")
        self.rows = rows
        self.key_len = key_len
        self.query_start = query_start
        self.query_end = query_end
        self.reduction = reduction
        self.max_chunk_elements = max_chunk_elements
        self.sums: list[torch.Tensor | None] = [None] * num_layers
        self.counts = [0] * num_layers
        self.seen = [past_len] * num_layers

    def observe(self, module, query, key, attention_mask, scaling, kwargs) -> None:
        batch, num_heads, q_len, _ = query.shape
        num_kv, k_len = key.shape[1], key.shape[2]
        span = self._span(module.layer_idx, q_len, k_len)
        if span is None:
            return
        first, lo, hi, key_first, k0, k1 = span
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
            part = self._reduce(probs)
            total = part if total is None else self._combine(total, part)
        self._add(module.layer_idx, total, key_first, k0, k1, hi - lo)

    def observe_probs(self, layer: int, weights: list[torch.Tensor], norm: torch.Tensor) -> None:
        """Like :meth:`observe`, from probabilities already computed (see :func:`split_attention`):
        ``weights * norm``, the weights given as pieces along the keys, each (batch, kv_heads, group,
        q_len, k_i) float32, ``norm`` (batch, kv_heads, group, q_len, 1)."""
        span = self._span(layer, norm.shape[3], sum(w.shape[-1] for w in weights))
        if span is None:
            return
        first, lo, hi, key_first, k0, k1 = span
        w = weights[0] if k1 <= weights[0].shape[-1] else torch.cat(weights, dim=-1)
        w, norm = w[..., lo:hi, k0:k1], norm[..., lo:hi, :]
        if self.reduction == "mean" and self.rows == "mean":  # sum over the group's rows of weights * norm: one matrix-vector product
            batch, num_kv, group = w.shape[:3]
            part = (norm.reshape(batch, num_kv, 1, -1) @ w.reshape(batch, num_kv, -1, k1 - k0)).squeeze(2) / group
        else:
            part = self._reduce(w * norm)
        self._add(layer, part, key_first, k0, k1, hi - lo)

    def _span(self, layer: int, q_len: int, k_len: int):
        """Book a forward call's ``q_len`` queries; (first, lo, hi, key_first, k0, k1) of the captured rows
        and keys, or None when it has none."""
        first = self.seen[layer]
        self.seen[layer] = first + q_len
        lo = max(self.query_start - first, 0)
        hi = q_len if self.query_end is None else min(q_len, self.query_end - first)
        if hi <= lo:
            return None
        key_first = first + q_len - k_len  # slot of key index 0 (sliding caches keep only recent keys)
        k0, k1 = max(0, -key_first), min(k_len, self.key_len - key_first)
        if k1 <= k0:
            self.counts[layer] += hi - lo
            return None
        return first, lo, hi, key_first, k0, k1

    def _reduce(self, probs: torch.Tensor) -> torch.Tensor:
        """(batch, kv, group, rows, keys) -> (batch, kv, keys): reduced over the group, then over rows."""
        reduced = probs.mean(2) if self.reduction == "mean" else probs.amax(2)
        return reduced.sum(2) if self.rows == "mean" else reduced.amax(2)

    def _combine(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b if self.rows == "mean" else torch.maximum(a, b)

    def _add(self, layer: int, total: torch.Tensor, key_first: int, k0: int, k1: int, rows: int) -> None:
        total = F.pad(total, (key_first + k0, self.key_len - (key_first + k1)))
        self.sums[layer] = total if self.sums[layer] is None else self._combine(self.sums[layer], total)
        self.counts[layer] += rows

    def scores(self, renormalise: bool = True) -> torch.Tensor:
        """(batch, layers, kv_heads, key_len): mean (or max) over the captured queries, renormalised over the keys."""
        missing = [i for i, s in enumerate(self.sums) if s is None]
        if missing:
            raise RuntimeError(f"no query was captured in layers {missing[:5]}...; check query_start/past_len")
        out = torch.stack([s / (max(c, 1) if self.rows == "mean" else 1) for s, c in zip(self.sums, self.counts)],
                          dim=1)
        return normalise(out) if renormalise else out


def normalise(scores: torch.Tensor) -> torch.Tensor:
    """Renormalise over the last dim; all-zero rows stay zero."""
    total = scores.sum(-1, keepdim=True)
    return scores / torch.where(total > 0, total, torch.ones_like(total))


def _apply_mask(scores, attention_mask, r0, r1, first, key_first, window):
    """Mask the chosen rows; without a mask (SDPA's causal fast path) build causal (+ sliding) from slots."""
    mask = _row_mask(attention_mask, r0, r1, first, key_first, scores.shape[-1], scores.shape[1], window, scores.device)
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask


def _row_mask(attention_mask, r0, r1, first, key_first, k_len, num_kv, window, device):
    """The mask of query rows [r0, r1) against scores (batch, kv, group, rows, k_len): bool (True: attend) or additive."""
    if attention_mask is not None:
        mask = attention_mask[..., r0:r1, :]
        mask = mask.unsqueeze(2) if mask.dim() == 4 else mask  # (b, 1|H, 1, m, k) against (b, kv, g, m, k)
        if mask.shape[1] not in (1, num_kv):
            mask = mask.reshape(mask.shape[0], num_kv, -1, *mask.shape[-2:])
        return mask if mask.dtype == torch.bool else mask.float()
    q_slots = torch.arange(first + r0, first + r1, device=device)[:, None]
    k_slots = torch.arange(key_first, key_first + k_len, device=device)[None, :]
    allowed = k_slots <= q_slots
    if window:
        allowed &= k_slots > q_slots - window
    return allowed


def lkv_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """SDPA attention; while a capture is active, it also records the chosen queries' probabilities."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    split = _SPLIT.get()
    if split is not None:
        past_key, past_value = split.past[module.layer_idx]
        k_len = past_key.shape[2] + key.shape[2]
    else:
        for capture in _ACTIVE.get():
            capture.observe(module, query, key, attention_mask, scaling, kwargs)
        k_len = key.shape[2]
    valid = (_KEY_VALID.get() or {}).get(module.layer_idx)
    if valid is not None:
        attention_mask = _mask_key_padding(attention_mask, valid, query.shape[1], query.shape[2], k_len)
    if split is not None:
        return split_attention(module, query, past_key, past_value, key, value, attention_mask, scaling,
                               masks=split.masks, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


class _Split:
    """What :func:`attend_over` holds: every layer's cached (keys, values), and masks memoised per block."""

    def __init__(self, cache):
        self.past = [(layer.keys, layer.values) for layer in cache.layers]
        self.masks: dict = {}


_SPLIT: contextvars.ContextVar[_Split | None] = contextvars.ContextVar("lkv_split", default=None)


@contextmanager
def attend_over(cache):
    """Inside the block, forward calls given ``cache`` attend over its entries and their own keys
    without adding anything to it: the cache is left untouched (no concatenation, nothing to undo),
    and every layer runs :func:`split_attention`. Only for forward calls that pass this ``cache``."""
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None:
            raise TypeError(f"attend_over needs a filled DynamicCache (got a {type(layer).__name__} layer)")
    if "update" in vars(cache):
        raise RuntimeError("attend_over blocks cannot nest on one cache")
    cache.update = _no_update
    token = _SPLIT.set(_Split(cache))
    try:
        yield
    finally:
        _SPLIT.reset(token)
        del cache.update


def _no_update(key_states, value_states, layer_idx, *args, **kwargs):
    return key_states, value_states


def split_attention(module, query, past_key, past_value, key, value, attention_mask=None, scaling=None, masks=None,
                    **kwargs):
    """Attention of ``query`` over ``past_key`` + ``key`` (never concatenated), in float32, with one
    joint softmax whose probabilities also feed every active capture: computed once, not twice.

    The output is normalised after the value product, as SDPA's flash kernels do. Mask semantics as
    :class:`AttentionCapture`'s (the given mask, else causal + sliding window from the slots);
    softcap supported. Returns transformers' ``(output (batch, q_len, heads, dim), None)``.
    """
    batch, num_heads, q_len, dim = query.shape
    num_kv, past_len = key.shape[1], past_key.shape[2]
    group = num_heads // num_kv
    scale = scaling if scaling is not None else dim ** -0.5
    # scores in base-2 units (scaled on the queries, no pass over the scores): exp2 is ~3x faster than exp on CPU
    q = query.float().reshape(batch, num_kv, group * q_len, dim) * (scale * LOG2E)
    shape = (batch, num_kv, group, q_len, -1)
    scores = [(q @ k.float().transpose(-1, -2)).view(shape) for k in (past_key, key)]
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = [torch.tanh(s / (softcap * LOG2E)) * (softcap * LOG2E) for s in scores]
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    for s, mask in zip(scores, _split_masks(attention_mask, {} if masks is None else masks, past_len, q_len, num_kv,
                                             window, query.device)):
        if mask is not None and mask.dtype == torch.bool:
            s.masked_fill_(mask, float("-inf"))
        elif mask is not None:
            s.add_(mask)
    top = torch.maximum(*[s.detach().amax(-1, keepdim=True) for s in scores])
    weights = [s.sub_(top).exp2_() for s in scores]
    norm = 1.0 / (weights[0].sum(-1, keepdim=True) + weights[1].sum(-1, keepdim=True))
    for capture in _ACTIVE.get():
        capture.observe_probs(module.layer_idx, weights, norm)
    flat = [w.view(batch, num_kv, group * q_len, -1) for w in weights]
    out = (flat[0] @ past_value.float() + flat[1] @ value.float()).view(shape) * norm
    return out.view(batch, num_heads, q_len, dim).transpose(1, 2).to(query.dtype).contiguous(), None


def _split_masks(attention_mask, memo: dict, past_len: int, q_len: int, num_kv: int, window, device):
    """:func:`split_attention`'s masks of the past and the new keys, as ``masked_fill_`` (bool, True:
    blocked) or ``add_`` (float, in base-2 units) operands; past is None where it blocks nothing. Memoised in ``memo``
    (layers share their mask; the entry holds the mask, so its id stays unique)."""
    key = (id(attention_mask), past_len, window)
    if key not in memo:
        mask = _row_mask(attention_mask, 0, q_len, past_len, 0, past_len + q_len, num_kv, window, device)
        blocked = ~mask if mask.dtype == torch.bool else mask * LOG2E
        past = blocked[..., :past_len]
        memo[key] = (attention_mask, past if bool(past.any()) else None, blocked[..., past_len:])
    return memo[key][1:]


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

    if model.config._attn_implementation != ATTENTION_NAME:
        raise RuntimeError(f"model must use attn_implementation={ATTENTION_NAME!r}; call lkvcli.models.prepare_model")
    capture = AttentionCapture(num_layers(model), key_len, query_start, **kwargs)
    token = _ACTIVE.set((*_ACTIVE.get(), capture))
    try:
        yield capture
    finally:
        _ACTIVE.reset(token)
