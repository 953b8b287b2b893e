"""The software and hardware a result was produced with, recorded next to it (``results.json``'s
``meta.environment``, ``run.json``'s ``environment``), so that two results that differ can be traced
to what produced them."""

from __future__ import annotations

import platform

import torch

from .version import __version__


def environment() -> dict:
    import transformers

    return {"lkv": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads()}
