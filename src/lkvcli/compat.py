"""Names that differ between the transformers releases lkv runs on (5.2.x, which kvpress pins, and
current): a model's forward takes its KV cache as ``cache`` in current releases and as
``past_key_values`` in 5.2, and returns it under the same name."""

from __future__ import annotations

import inspect
from functools import lru_cache


@lru_cache(maxsize=None)
def _cache_keyword(module_type: type) -> str:
    parameters = inspect.signature(module_type.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_kwargs(module, cache) -> dict:
    """``{keyword: cache}`` for ``module``'s forward, whichever name this transformers uses."""
    return {_cache_keyword(type(module)): cache}


def cache_from_kwargs(kwargs: dict):
    """The KV cache passed to a forward call, whichever keyword carried it (None without one)."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


def output_cache(output):
    """The KV cache a forward returned (``output.cache`` or ``output.past_key_values``), or None."""
    for name in ("cache", "past_key_values"):
        value = getattr(output, name, None)
        if value is not None:
            return value
    return None
