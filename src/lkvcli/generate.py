"""Prefill and decoding (greedy or sampled) with explicit positions: decoding continues after eviction
at position L, and a batch of different prompts continues each at its own."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .attention import key_padding
from .compat import cache_kwargs, output_cache
from .errors import LkvError


@dataclass
class Prefill:
    """The state right after prefill: the cache, the next-token logits, and the next position."""

    cache: object
    logits: torch.Tensor  # (batch, vocab), logits of the last prompt position
    next_position: int
    key_valid: dict | None = None  # layer -> (batch, slots) bool: real entries of rows padded to one length
    row_positions: list[int] | None = None  # per row, when the rows are different prompts


@dataclass(frozen=True)
class Sampling:
    """How each next token is chosen: the argmax (default), or drawn from the logits divided by
    ``temperature`` and cut to the ``top_k`` best and the smallest set holding ``top_p`` of the
    probability. With a ``seed`` every row draws from its own generator seeded with it, so a seeded
    run repeats exactly and a row draws as it would alone."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise LkvError(f"temperature={self.temperature!r}: must be > 0 (for greedy decoding use do_sample=False)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise LkvError(f"top_k={self.top_k!r}: must be a non-negative integer (0: no cut)")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise LkvError(f"top_p={self.top_p!r}: must be in (0, 1] (1: no cut)")

    def generators(self, rows: int, device) -> list:
        if not self.do_sample or self.seed is None:
            return [None] * rows
        return [torch.Generator(device=device).manual_seed(int(self.seed)) for _ in range(rows)]

    def pick(self, logits: torch.Tensor, generators: list) -> list[int]:
        """The next token of every row of ``logits`` (rows, vocab)."""
        if not self.do_sample:
            return logits.argmax(-1).tolist()
        scaled = logits.float() / self.temperature
        if self.top_k and self.top_k < scaled.shape[-1]:
            kth = scaled.topk(self.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.top_p < 1:
            ordered, order = scaled.sort(dim=-1, descending=True)
            probs = ordered.softmax(-1)
            beaten = probs.cumsum(-1) - probs >= self.top_p  # the better tokens already hold top_p
            scaled = scaled.masked_fill(torch.zeros_like(beaten).scatter(-1, order, beaten), float("-inf"))
        probs = scaled.softmax(-1)
        return [int(torch.multinomial(probs[j], 1, generator=g)) for j, g in enumerate(generators)]


GREEDY = Sampling()


def stop_token_ids(model, tokenizer=None) -> set[int]:
    """Token ids that end a response (generation config's EOS ids and the tokenizer's EOS)."""
    ids = set()
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if eos is None:
            continue
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return {int(i) for i in ids}


@torch.inference_mode()
def prefill(model, input_ids: torch.Tensor, **kwargs) -> Prefill:
    """Run the prompt through the model once, keeping the cache and only the last logits."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    out = model(input_ids=input_ids, **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1, **kwargs)
    return Prefill(cache=output_cache(out) or cache,
                   logits=out.logits[:, -1].float(), next_position=input_ids.shape[1])


@dataclass
class Decoded:
    """One row of a greedy decode: its tokens (without the stop token), why it stopped, and the
    margin between the two highest logits at each step (a margin near 0 is a near-tie)."""

    tokens: list[int]
    reason: str
    margins: list[float]


def fork_cache(cache):
    """A cheap copy whose layers can be extended without touching ``cache`` (tensors are shared;
    DynamicCache layers grow by concatenation, never in place)."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    return new


def stack_states(states: list[Prefill]) -> Prefill:
    """One batch state from batch-1 states: one prompt evicted in several ways, or several prompts
    (each row then continues at its own position, ``row_positions``). In a layer whose rows hold
    different numbers of entries, the shorter rows are padded at the end to the longest, and
    ``key_valid`` marks the real slots."""
    positions = [int(s.next_position) for s in states]
    layers = [[s.cache.layers[i] for s in states] for i in range(len(states[0].cache.layers))]
    lengths = {i: [r.keys.shape[-2] for r in rows] for i, rows in enumerate(layers) if rows[0].keys is not None}
    cache, valid = fork_cache(states[0].cache), {}
    for i, layer in enumerate(cache.layers):
        if i not in lengths:
            continue
        width = max(lengths[i])
        padded = min(lengths[i]) < width
        if padded or any(s.key_valid and i in s.key_valid for s in states):
            valid[i] = torch.cat([_row_valid(s, i, width) for s in states])
        for name in ("keys", "values"):
            parts = [getattr(r, name) for r in layers[i]]
            if padded:
                parts = [torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[-2])) for t in parts]
            setattr(layer, name, torch.cat(parts, dim=0) if len(parts) > 1 else parts[0])
    return Prefill(cache=cache, logits=torch.cat([s.logits for s in states], dim=0), next_position=max(positions),
                   key_valid=valid or None, row_positions=positions if len(set(positions)) > 1 else None)


class _ReservedLayer:
    """Wraps a full-attention ``DynamicLayer`` with room for ``room`` more tokens: appending writes in
    place instead of concatenating (which copies the whole cache at every step of a decode)."""

    @staticmethod
    def reserve(layer, room: int) -> None:
        from transformers.cache_utils import DynamicLayer

        if type(layer) is not DynamicLayer or not isinstance(layer.keys, torch.Tensor) or room < 1:
            return
        n = layer.keys.shape[-2]
        for name in ("keys", "values"):
            t = getattr(layer, name)
            buffer = t.new_empty(*t.shape[:-2], n + room, t.shape[-1])
            buffer[..., :n, :] = t
            setattr(layer, name, buffer[..., :n, :])
            setattr(layer, f"_lkv_{name}", buffer)
        layer.update = _ReservedLayer.update.__get__(layer)

    @staticmethod
    def update(layer, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        n, q = layer.keys.shape[-2], key_states.shape[-2]
        if n + q > layer._lkv_keys.shape[-2] or layer._lkv_keys.shape[0] != key_states.shape[0]:
            del layer.update  # out of room: back to DynamicLayer's concatenation
            return layer.update(key_states, value_states, *args, **kwargs)
        for name, new in (("keys", key_states), ("values", value_states)):
            buffer = getattr(layer, f"_lkv_{name}")
            buffer[..., n : n + q, :] = new
            setattr(layer, name, buffer[..., : n + q, :])
        return layer.keys, layer.values


def _row_valid(state: Prefill, layer: int, width: int) -> torch.Tensor:
    """(batch, kv_heads, width): the real slots of one state's layer, padded with False to ``width``."""
    keys = state.cache.layers[layer].keys
    own = (state.key_valid or {}).get(layer)
    if own is None:
        own = torch.ones(*keys.shape[:2], keys.shape[-2], dtype=torch.bool, device=keys.device)
    elif own.dim() == 2:
        own = own[:, None].expand(-1, keys.shape[1], -1)
    return torch.nn.functional.pad(own, (0, width - own.shape[-1]), value=False)


def _keep_rows(state: Prefill, rows: torch.Tensor) -> None:
    """Drop finished rows from every layer of a batch cache and from its padding masks (in place)."""
    for layer in state.cache.layers:
        reserved = "update" in layer.__dict__
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor):
                if reserved:
                    buffer = getattr(layer, f"_lkv_{name}").index_select(0, rows)
                    setattr(layer, f"_lkv_{name}", buffer)
                    setattr(layer, name, buffer[..., : t.shape[-2], :])
                else:
                    setattr(layer, name, t.index_select(0, rows))
    if state.key_valid:
        state.key_valid = {i: v.index_select(0, rows) for i, v in state.key_valid.items()}


@torch.inference_mode()
def decode_batch(
    model,
    state: Prefill,
    max_new_tokens: int,
    stop_ids: set[int] | frozenset = frozenset(),
    feed_last: bool = False,
    sampling: Sampling = GREEDY,
    stop: Callable[[list[int]], bool] | None = None,
) -> list[Decoded]:
    """Decode a batch whose rows continue at ``state.next_position`` (or each at its ``row_positions``).

    Every row stops on its own (a stop token, ``stop(tokens)`` turning true: reason ``"stop_string"``,
    or ``max_new_tokens``); finished rows leave the batch, so the others decode exactly as they would
    alone up to float rounding of the batched matmuls (see ``margins``). Positions continue from the
    prompt's length whatever the cache length, so an evicted cache decodes with the original
    positions. With ``feed_last`` the last kept token is also run through the model, so every
    response token has had its query computed (what the ground-truth capture needs). The state is
    updated in place while no row has left.
    """
    device = state.logits.device
    batch = state.logits.shape[0]
    rows = [Decoded([], "length", []) for _ in range(batch)]
    active = list(range(batch))
    positions = list(state.row_positions or [int(state.next_position)] * batch)
    generators = sampling.generators(batch, device)
    logits = state.logits
    for layer in state.cache.layers:
        _ReservedLayer.reserve(layer, max_new_tokens)
    for step in range(max_new_tokens):
        top = logits.topk(min(2, logits.shape[-1]), dim=-1).values
        choice = sampling.pick(logits, generators)
        still = []
        for j, row in enumerate(active):
            rows[row].margins.append(float(top[j, 0] - top[j, -1]))
            if choice[j] in stop_ids:
                rows[row].reason = "stop"
                continue
            rows[row].tokens.append(choice[j])
            if stop is not None and stop(rows[row].tokens):
                rows[row].reason = "stop_string"
            else:
                still.append(j)
        if not still or (step == max_new_tokens - 1 and not feed_last):
            break
        if len(still) < len(active):
            _keep_rows(state, torch.tensor(still, device=device))
            active, positions = [active[j] for j in still], [positions[j] for j in still]
            generators = [generators[j] for j in still]
        with key_padding(state.key_valid):
            out = model(
                input_ids=torch.tensor([[choice[j]] for j in still], device=device),
                position_ids=torch.tensor(positions, device=device)[:, None],
                **cache_kwargs(model, state.cache),
                use_cache=True,
                logits_to_keep=1,
            )
        logits, positions = out.logits[:, -1].float(), [p + 1 for p in positions]
    if len(active) == batch and all(r.reason == "length" for r in rows):
        state.logits, state.next_position = logits, max(positions)
        state.row_positions = positions if state.row_positions else None
    return rows


def greedy_decode(model, state: Prefill, max_new_tokens: int, stop_ids: set[int] | frozenset = frozenset(),
                  feed_last: bool = False) -> tuple[list[int], str]:
    """Greedy decoding (batch 1) from a prefill state; returns (tokens without the stop token, stop reason).
    See :func:`decode_batch`."""
    row = decode_batch(model, state, max_new_tokens, stop_ids, feed_last)[0]
    return row.tokens, row.reason
