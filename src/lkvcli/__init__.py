"""lkv: distil and measure LookaheadKV adapters for causal language models."""

from .version import __version__
__all__ = ["LookaheadKV", "__version__"]


def __getattr__(name: str):
    """``from lkvcli import LookaheadKV`` imports torch and transformers only when asked for."""
    if name == "LookaheadKV":
        from .api import LookaheadKV

        return LookaheadKV
    raise AttributeError(f"module 'lkvcli' has no attribute {name!r}")
