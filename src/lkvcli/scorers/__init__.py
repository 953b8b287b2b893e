"""Importance scorers, one file per method, all returning (batch, layers, kv_heads, L).

``get_scorer(name, **options)`` builds one; ``available()`` lists the names.
"""

from .base import NEEDS, ScoreContext, Scorer, available, get_scorer, prepare, register, scorer_class

__all__ = ["NEEDS", "ScoreContext", "Scorer", "available", "get_scorer", "prepare", "register", "scorer_class"]
