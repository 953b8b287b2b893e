"""Importance scorers, one file per method, all returning (batch, layers, kv_heads, L).

``get_scorer(name, **options)`` builds one; ``available()`` lists the names. Every scorer
module registers itself (``@register``) when this package imports it below.
"""

from __future__ import annotations

from ..config import from_dict
from ..errors import LkvError
from . import draft, h2o, knorm, kvzip, lookahead, oracle, pyramidkv, random_scorer, snapkv, streamingllm, tova  # noqa: F401
from .base import _REGISTRY, ScoreContext, Scorer, prepare, register

__all__ = ["ScoreContext", "Scorer", "available", "get_scorer", "prepare", "register", "scorer_class"]


def available() -> list[str]:
    """Names of the registered scorers."""
    return sorted(_REGISTRY)


def scorer_class(name: str) -> type[Scorer]:
    if name not in _REGISTRY:
        raise LkvError(f"unknown method {name!r}; known methods: {', '.join(['full', *available()])}")
    return _REGISTRY[name]


def get_scorer(name: str, **options) -> Scorer:
    """Build a registered scorer from its options (validated; unknown options name the known ones)."""
    return from_dict(scorer_class(name), options, where=name)
