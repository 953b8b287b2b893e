"""The adapter folder: one trained lookahead module in peft's layout, written by training (every
checkpoint and the run's final ``adapter/``) and copied as it is into an exported bundle.

    adapter_config.json               the LoRA's peft ``LoraConfig``
    adapter_model.safetensors         the LoRA weights, named as peft names them
    lookahead_embeddings.safetensors  ``embeddings``: the N soft tokens, (N, hidden) float32
    lookahead.json                    format, the lookahead settings, the model trained for, the step

Folders written by lkv before this layout (one ``adapter.safetensors`` holding ``lora.*`` and
``embeddings``) are still read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .errors import LkvError
from .files import read_json, read_tensors, save_tensors_atomic, write_json_atomic
from .lookahead import LookaheadAdapter, LookaheadConfig, lora_config

ADAPTER_FORMAT = "lkv-lookahead"
ADAPTER_VERSION = 2
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
EMBEDDINGS = "lookahead_embeddings.safetensors"
ADAPTER_META = "lookahead.json"
EMBEDDINGS_FORMAT = "lkv-bundle"  # the embeddings file's safetensors metadata (bundles carry it unchanged)
LEGACY_TENSORS = "adapter.safetensors"  # version 1: lora.* and embeddings in one file


@dataclass
class AdapterFiles:
    """An adapter folder read back: its settings, LoRA state (peft names) and embeddings."""

    folder: Path
    config: LookaheadConfig
    lora: dict[str, torch.Tensor]
    embeddings: torch.Tensor
    meta: dict = field(default_factory=dict)  # lookahead.json: model (source, fingerprint), step, ...


def is_adapter_folder(folder: Path) -> bool:
    return (Path(folder) / ADAPTER_META).is_file()


def write_peft_config(folder: Path, config: LookaheadConfig, base_model_id: str | None = None) -> None:
    """``adapter_config.json`` as peft writes it (``PeftModel.from_pretrained`` reads it)."""
    lora_config(config, base_model_name_or_path=base_model_id, inference_mode=True).save_pretrained(str(folder))


def save_adapter(adapter: LookaheadAdapter, folder: str | Path, metadata: dict | None = None) -> Path:
    """Write ``adapter`` into ``folder`` (each file atomically; ``lookahead.json`` last)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lora, embeddings = adapter.state_dict_parts()
    write_peft_config(folder, adapter.config)
    save_tensors_atomic(folder / PEFT_WEIGHTS, {k: v.cpu() for k, v in lora.items()}, metadata={"format": "pt"})
    save_tensors_atomic(folder / EMBEDDINGS, {"embeddings": embeddings.cpu()}, metadata={"format": EMBEDDINGS_FORMAT})
    write_json_atomic(folder / ADAPTER_META, {"format": ADAPTER_FORMAT, "version": ADAPTER_VERSION,
                                              "config": asdict(adapter.config), **(metadata or {})})
    return folder


def read_adapter(folder: str | Path, hint: str = "train it again or give another adapter") -> AdapterFiles:
    """An adapter folder (either layout); a missing or damaged file is one LkvError ending with ``hint``."""
    folder = Path(folder)
    meta = read_json(folder / ADAPTER_META, hint)
    if "config" not in meta:
        raise LkvError(f"{folder / ADAPTER_META} holds no lookahead settings; {hint}")
    config = LookaheadConfig(**meta["config"])
    if (folder / PEFT_WEIGHTS).is_file() or not (folder / LEGACY_TENSORS).is_file():
        lora = read_tensors(folder / PEFT_WEIGHTS, hint)
        embeddings = read_tensors(folder / EMBEDDINGS, hint).get("embeddings")
    else:
        tensors = read_tensors(folder / LEGACY_TENSORS, hint)
        lora = {k[len("lora."):]: v for k, v in tensors.items() if k.startswith("lora.")}
        embeddings = tensors.get("embeddings")
    if embeddings is None or embeddings.shape[0] != config.num_tokens:
        raise LkvError(f"{folder} holds no ({config.num_tokens}, hidden) lookahead embeddings; {hint}")
    return AdapterFiles(folder=folder, config=config, lora=lora, embeddings=embeddings, meta=meta)
