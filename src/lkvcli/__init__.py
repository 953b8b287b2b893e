"""lkv: distil and measure LookaheadKV adapters for causal language models."""

__version__ = "0.1.0"
