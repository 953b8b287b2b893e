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

import copy
from dataclasses import dataclass

import torch

from .attention import key_padding
from .errors import LkvError


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


def keep_indices(scores: torch.Tensor, budgets: list[int], *, sink_tokens: int = 0, recent_window: int = 0,
                 attention_mask: torch.Tensor | None = None) -> list[torch.Tensor | None]:
    """Per layer, the kept prompt positions ``(batch, kv_heads, C_l)`` in increasing order (None: keep all).

    ``scores`` is ``(batch, layers, kv_heads, L)``; ``budgets`` one entry count per layer.
    Protected positions rank above every scored one; padded positions (``attention_mask``
    0) are never kept.
    """
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
    lo, hi = s.amin(-1, keepdim=True), s.amax(-1, keepdim=True)
    ranked = (s - lo) / (hi - lo).clamp_min(1e-30) * 0.5 + priority[:, None, None, :]  # scores in [0, 0.5]
    out = []
    for layer, budget in enumerate(budgets):
        if budget >= L:
            out.append(None)
            continue
        idx = ranked[:, layer].topk(max(1, budget), dim=-1).indices
        out.append(idx.sort(dim=-1).values)
    return out


@dataclass
class Eviction:
    """An evicted cache and what it cost and saved."""

    cache: object
    kept: list  # per layer: (batch, kv, C) indices, or None when the layer was kept whole
    bytes_before: int
    bytes_after: int


def cache_bytes(cache) -> int:
    """Bytes held by the cache's key and value tensors."""
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def fork_cache(cache):
    """A cheap copy whose layers can be extended without touching ``cache`` (tensors are shared;
    DynamicCache layers grow by concatenation, never in place)."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    return new


def evict(cache, kept: list[torch.Tensor | None]) -> Eviction:
    """Gather the kept entries of every full-attention layer into a new, smaller cache."""
    before = cache_bytes(cache)
    new = fork_cache(cache)
    if len(kept) != len(new.layers):
        raise ValueError(f"kept sets for {len(kept)} layers, cache has {len(new.layers)}")
    out_kept = []
    for layer, idx in zip(new.layers, kept):
        if idx is None or getattr(layer, "is_sliding", False) or layer.keys is None:
            out_kept.append(None)
            continue
        if layer.keys.shape[-2] != idx.shape[-1] and int(idx.max()) >= layer.keys.shape[-2]:
            raise ValueError("kept positions beyond the cached entries")
        gather = idx.to(layer.keys.device).unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        layer.keys = layer.keys.gather(2, gather)
        layer.values = layer.values.gather(2, idx.to(layer.values.device).unsqueeze(-1).expand(
            -1, -1, -1, layer.values.shape[-1]))
        out_kept.append(idx)
    return Eviction(cache=new, kept=out_kept, bytes_before=before, bytes_after=cache_bytes(new))


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
            out = model(input_ids=input_ids[:, a:b], position_ids=positions, cache=state.cache, use_cache=True,
                        logits_to_keep=1)
    state.logits, state.next_position = out.logits[:, -1].float(), start + n
    return state


def compress(scorer, scores: torch.Tensor, state, budget: int | float, *, attention_mask=None):
    """Evict a prefill state's cache to ``budget`` with ``scorer``'s protection and per-layer budgets.

    Returns ``(Prefill over the evicted cache, Eviction)``; the input state is untouched.
    """
    from .generate import Prefill

    L, layers = scores.shape[-1], scores.shape[1]
    per_layer = scorer.layer_budgets(resolve_budget(budget, L), layers, L)
    kept = keep_indices(scores, per_layer, sink_tokens=scorer.sink_tokens, recent_window=scorer.recent_window,
                        attention_mask=attention_mask)
    ev = evict(state.cache, kept)
    return Prefill(cache=ev.cache, logits=state.logits.clone(), next_position=state.next_position), ev
