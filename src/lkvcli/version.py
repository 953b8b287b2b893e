"""The lkv version (a leaf module: every format that records the version imports it from here)."""

__version__ = "0.1.0"
