"""Prefill and greedy decoding with explicit positions (decoding continues after eviction at position L)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Prefill:
    """The state right after prefill: the cache, the next-token logits, and the next position."""

    cache: object
    logits: torch.Tensor  # (batch, vocab), logits of the last prompt position
    next_position: int


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
    out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1, **kwargs)
    return Prefill(cache=out.cache if getattr(out, "cache", None) is not None else cache,
                   logits=out.logits[:, -1].float(), next_position=input_ids.shape[1])


@torch.inference_mode()
def greedy_decode(
    model,
    state: Prefill,
    max_new_tokens: int,
    stop_ids: set[int] | frozenset = frozenset(),
    feed_last: bool = False,
) -> tuple[list[int], str]:
    """Greedy decoding (batch 1) from a prefill state; returns (tokens without the stop token, stop reason).

    Positions continue from ``state.next_position`` whatever the cache length (so an
    evicted cache decodes with the original positions). With ``feed_last`` the last
    kept token is also run through the model, so every response token has had its
    query computed (what the ground-truth capture needs).
    """
    device = state.logits.device
    tokens: list[int] = []
    logits, position = state.logits, state.next_position
    for step in range(max_new_tokens):
        token = int(logits[0].argmax())
        if token in stop_ids:
            return tokens, "stop"
        tokens.append(token)
        if step == max_new_tokens - 1 and not feed_last:
            break
        out = model(
            input_ids=torch.tensor([[token]], device=device),
            position_ids=torch.tensor([[position]], device=device),
            cache=state.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits, position = out.logits[:, -1].float(), position + 1
    state.logits, state.next_position = logits, position
    return tokens, "length"
