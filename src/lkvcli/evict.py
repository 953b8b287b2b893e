"""Eviction runtime: budgets, kept sets per layer and KV head, the physical cache gather, and
feeding tokens over an evicted cache with the original positions.

Every method goes through :func:`keep_indices` and :func:`evict`; only the scores differ.

* Budgets are entries kept per layer and KV head: an integer (``128``) or a ratio of the
  prompt (``0.1``). A budget at or above the prompt length keeps everything.
* Protected positions: the first ``sink_tokens`` and the last ``recent_window`` prompt
  positions are kept before any other; when they alone exceed the budget, sinks win, then
  the most recent.
* The cache physically shrinks: each evicted layer's keys and values become
  ``(batch, kv_heads, C, head_dim)`` gathered per head. :func:`evict` returns a NEW cache
  (the prefill cache is untouched, so several budgets can be evicted from one prefill).
* Sliding-window layers (Gemma 3) are never evicted: their memory is already bounded by the
  window, and transformers applies the window on cache slots, so an evicted sliding layer
  would let queries see entries outside their window.
* Decoding continues at the original positions (``Prefill.next_position`` = L): RoPE is
  applied per token from explicit ``position_ids``, and the causal mask over the cache is
  built on cache slots, which stays correct after eviction because every kept entry
  precedes every new token. With equal lengths in all evicted layers, a multi-token feed
  (the question in the ``context`` mode) runs in one forward; with per-layer budgets
  (PyramidKV) one mask cannot fit all layers, so :func:`feed` runs one token at a time.
* Batches with left padding: padded positions are never kept, and the budget must not
  exceed the shortest row, so the evicted cache holds no padding and decoding needs no
  attention mask (each row then continues at its own position).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import key_padding
from .compat import cache_kwargs
from .errors import LkvError
from .generate import Prefill, fork_cache


DEFAULT_BUDGETS = ["64", "128", "256", "512"]  # entries per KV head that `lkv eval` measures by default


def parse_budget(value) -> int | float:
    """``"128"`` -> 128 entries; ``"0.1"`` -> 10% of the prompt. Zero or negative budgets fail."""
    text = str(value).strip()
    try:
        number = float(text)
    except ValueError:
        raise LkvError(f"budget {text!r} is not a number; give entries per head (128) or a ratio of the prompt (0.1)") from None
    if number <= 0:
        raise LkvError(f"budget {text} must be positive: entries per head (128) or a ratio of the prompt in (0, 1]")
    if number < 1 or (number == 1 and "." in text):
        return number
    if not number.is_integer():
        raise LkvError(f"budget {text}: above 1 it counts entries per head and must be a whole number")
    return int(number)


def resolve_budget(budget: int | float, prompt_len: int) -> int:
    """Entries per head for a prompt of ``prompt_len`` tokens (at least 1, at most the prompt)."""
    budget = parse_budget(budget) if isinstance(budget, str) else budget
    if budget <= 0:
        raise LkvError(f"budget {budget} must be positive")
    entries = round(budget * prompt_len) if isinstance(budget, float) and budget <= 1 else int(budget)
    return max(1, min(entries, prompt_len))


def budget_label(budget: int | float) -> str:
    return f"{budget:g}" if isinstance(budget, float) else str(budget)


ALLOCATIONS = ("uniform", "heads", "global")


def keep_indices(scores: torch.Tensor, budgets: list[int], *, sink_tokens: int = 0, recent_window: int = 0,
                 attention_mask: torch.Tensor | None = None, allocation: str = "uniform",
                 pooled_layers: list[int] | None = None) -> list[torch.Tensor | None]:
    """Per layer, the kept prompt positions ``(batch, kv_heads, C_l)`` in increasing order (None: keep all).

    ``scores`` is ``(batch, layers, kv_heads, L)``; ``budgets`` one entry count per layer and KV
    head. Protected positions rank above every scored one; padded positions (``attention_mask``
    0) are never kept. ``allocation``: ``uniform`` keeps C_l in every head; ``heads`` keeps the
    top C_l x kv_heads of a layer across its heads (AdaKV-style), ``global`` the top of all
    ``pooled_layers`` (default: all) together, sum of their budgets (KVzip-style). Then heads
    keep different counts: each keeps at least its best position, rows are padded to the
    layer's longest head with -1 (see :func:`evict`).
    """
    if allocation not in ALLOCATIONS:
        raise LkvError(f"allocation {allocation!r} is not one of {', '.join(ALLOCATIONS)}")
    b, layers, kv, L = scores.shape
    if len(budgets) != layers:
        raise ValueError(f"{len(budgets)} budgets for {layers} layers")
    device = scores.device
    pos = torch.arange(L, device=device)
    if attention_mask is not None:
        valid = attention_mask.to(device).bool()
        first = (~valid).sum(-1, keepdim=True)  # left padding: first real position per row
        real = valid.sum(-1)
        short = int(real.min())
        if any(short < c < L for c in budgets):
            raise LkvError(f"budget {max(c for c in budgets if c < L)} exceeds the shortest prompt in the batch "
                           f"({short} tokens); lower the budget or batch prompts of similar length")
    else:
        valid = torch.ones(b, L, dtype=torch.bool, device=device)
        first = torch.zeros(b, 1, dtype=torch.long, device=device)
    priority = torch.zeros(b, L, device=device)
    priority = torch.where(pos >= L - recent_window, 1.0 + (pos - L + recent_window + 1) / (L + 1), priority)
    priority = torch.where((pos >= first) & (pos < first + sink_tokens), 4.0, priority)
    priority = torch.where(valid, priority, -8.0)
    s = scores.float().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    # scores in [0, 0.5] per head; under heads/global allocation on one scale across heads (and layers)
    span = {"uniform": (-1,), "heads": (-2, -1), "global": (1, 2, 3)}[allocation]
    lo, hi = s.amin(span, keepdim=True), s.amax(span, keepdim=True)
    ranked = (s - lo) / (hi - lo).clamp_min(1e-30) * 0.5 + priority[:, None, None, :]
    if allocation != "uniform":  # every head keeps at least its best position
        ranked = ranked.scatter_add(-1, ranked.argmax(-1, keepdim=True), torch.full_like(ranked[..., :1], 2.0))
        return _pooled_keep(ranked, budgets, allocation, pooled_layers)
    out = []
    for layer, budget in enumerate(budgets):
        if budget >= L:
            out.append(None)
            continue
        idx = ranked[:, layer].topk(max(1, budget), dim=-1).indices
        out.append(idx.sort(dim=-1).values)
    return out


def _pooled_keep(ranked: torch.Tensor, budgets: list[int], allocation: str, pooled_layers) -> list:
    """``heads``/``global`` allocation: one top over a layer's heads, or over every pooled layer's."""
    b, layers, kv, L = ranked.shape
    evicted = [layer for layer in (range(layers) if pooled_layers is None else pooled_layers) if budgets[layer] < L]
    groups = [[layer] for layer in evicted] if allocation == "heads" else [evicted] if evicted else []
    chosen = torch.zeros(b, layers, kv, L, dtype=torch.bool, device=ranked.device)
    for group in groups:
        flat = ranked[:, group].reshape(b, -1)
        total = min(flat.shape[-1], sum(max(1, budgets[layer]) * kv for layer in group))
        chosen[:, group] = torch.zeros_like(flat, dtype=torch.bool).scatter_(
            -1, flat.topk(total, dim=-1).indices, True).view(b, len(group), kv, L)
    out = []
    pos = torch.arange(L, device=ranked.device)
    for layer in range(layers):
        if layer not in evicted:  # a budget covering the prompt, or a layer left out (sliding window)
            out.append(None)
            continue
        keep = chosen[:, layer]
        width = int(keep.sum(-1).max())
        idx = torch.where(keep, pos, L).sort(dim=-1).values[..., :width]
        out.append(torch.where(idx < L, idx, -1))
    return out


@dataclass
class Eviction:
    """An evicted cache and what it cost and saved."""

    cache: object
    kept: list  # per layer: (batch, kv, C) indices (-1: padding), or None when the layer was kept whole
    bytes_before: int
    bytes_after: int  # what the evicted cache holds, padding included
    padding_bytes: int = 0  # padded slots of heads that keep fewer entries than their layer's longest
    key_valid: dict | None = None  # layer -> (batch, kv, C) bool, where some heads are padded


def cache_bytes(cache) -> int:
    """Bytes held by the cache's key and value tensors."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def evict(cache, kept: list[torch.Tensor | None]) -> Eviction:
    """Gather the kept entries of every full-attention layer into a new, smaller cache. Index -1
    (heads keeping fewer entries than their layer's longest) becomes a zero slot masked out by
    ``Eviction.key_valid``."""
    before = cache_bytes(cache)
    new = fork_cache(cache)
    if len(kept) != len(new.layers):
        raise ValueError(f"kept sets for {len(kept)} layers, cache has {len(new.layers)}")
    out_kept, valid, padding = [], {}, 0
    for i, (layer, idx) in enumerate(zip(new.layers, kept)):
        if idx is None or getattr(layer, "is_sliding", False) or layer.keys is None:
            out_kept.append(None)
            continue
        if layer.keys.shape[-2] != idx.shape[-1] and int(idx.max()) >= layer.keys.shape[-2]:
            raise ValueError("kept positions beyond the cached entries")
        real = idx.to(layer.keys.device) >= 0
        gather = idx.to(layer.keys.device).clamp_min(0).unsqueeze(-1)
        for name in ("keys", "values"):
            t = getattr(layer, name)
            picked = t.gather(2, gather.expand(-1, -1, -1, t.shape[-1]))
            if not bool(real.all()):
                picked = picked * real.unsqueeze(-1)
                padding += int((~real).sum()) * t.shape[-1] * t.element_size()
            setattr(layer, name, picked)
        if not bool(real.all()):
            valid[i] = real
        out_kept.append(idx)
    return Eviction(cache=new, kept=out_kept, bytes_before=before, bytes_after=cache_bytes(new),
                    padding_bytes=padding, key_valid=valid or None)


def uniform_length(cache) -> bool:
    """Whether all full-attention layers hold the same number of entries (one mask fits them all)."""
    lengths = {layer.keys.shape[-2] for layer in cache.layers
               if not getattr(layer, "is_sliding", False) and getattr(layer, "keys", None) is not None}
    return len(lengths) <= 1


@torch.inference_mode()
def feed(model, state, input_ids: torch.Tensor):
    """Run ``input_ids`` over ``state.cache`` at positions ``state.next_position``... (every row of a
    batch continues at the same position); updates ``state`` (cache, last logits, next position)
    in place and returns it."""
    n = input_ids.shape[1]
    if n == 0:
        return state
    start = int(state.next_position)
    chunks = [(0, n)] if uniform_length(state.cache) else [(i, i + 1) for i in range(n)]
    for a, b in chunks:
        positions = torch.arange(start + a, start + b, device=input_ids.device).expand(input_ids.shape[0], -1)
        with key_padding(getattr(state, "key_valid", None)):
            out = model(input_ids=input_ids[:, a:b], position_ids=positions, **cache_kwargs(model, state.cache), use_cache=True,
                        logits_to_keep=1)
    state.logits, state.next_position = out.logits[:, -1].float(), start + n
    return state


def compress(scorer, scores: torch.Tensor, state, budget: int | float, *, attention_mask=None):
    """Evict a prefill state's cache to ``budget`` with ``scorer``'s protection and per-layer budgets.

    Returns ``(Prefill over the evicted cache, Eviction)``; the input state is untouched.
    """
    L, layers = scores.shape[-1], scores.shape[1]
    per_layer = scorer.layer_budgets(resolve_budget(budget, L), layers, L)
    kept = keep_indices(scores, per_layer, sink_tokens=scorer.sink_tokens, recent_window=scorer.recent_window,
                        attention_mask=attention_mask, allocation=scorer.allocation,
                        pooled_layers=full_attention_layers(state.cache))
    ev = evict(state.cache, kept)
    return Prefill(cache=ev.cache, logits=state.logits.clone(), next_position=state.next_position,
                   key_valid=ev.key_valid), ev


def full_attention_layers(cache) -> list[int]:
    """The layers eviction acts on (sliding-window layers are kept whole)."""
    return [i for i, layer in enumerate(cache.layers) if not getattr(layer, "is_sliding", False)]
