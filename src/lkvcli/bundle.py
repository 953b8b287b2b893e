"""The bundle (format ``lkv-bundle`` v1): a trained lookahead module as standard Hugging Face files.

    adapter_config.json, adapter_model.safetensors   the lookahead LoRA as a plain peft adapter
    lookahead_embeddings.safetensors                 ``embeddings``: the N soft tokens, (N, hidden) float32
    lkv.json                                         format, base model + fingerprint, settings, training summary
    README.md                                        model card (YAML front matter for the Hub)
    plots/*.png                                      evaluation plots (with ``--eval``)

The tensor files are a checkpoint's adapter folder (:mod:`lkvcli.adapter_folder`) copied as they
are; :func:`read_bundle` checks every file against its checksum in ``lkv.json``. Writing one from a
training run is :func:`lkvcli.export.export`. See docs/bundle.md.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .adapter_folder import EMBEDDINGS, EMBEDDINGS_FORMAT, PEFT_CONFIG, PEFT_WEIGHTS, AdapterFiles, write_peft_config
from .errors import LkvError
from .files import read_json, read_tensors, save_tensors_atomic, sha256, write_json_atomic
from .lookahead import LookaheadConfig

BUNDLE_FORMAT = "lkv-bundle"
BUNDLE_VERSION = 1
LKV_JSON = "lkv.json"
CHECKED_FILES = (PEFT_CONFIG, PEFT_WEIGHTS, EMBEDDINGS)  # what lkv or peft reads: listed in lkv.json with sha256
# Data only: a bundle holding anything else (code, pickles, other weights) is refused. The model card and
# plots are documentation, never parsed by lkv, so they may be edited (on the Hub) without a new checksum.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".md", ".png")


def write_bundle(folder: Path, adapter: AdapterFiles, meta: dict, base_model_id: str | None) -> dict:
    """Copy ``adapter``'s tensor files into the (empty) ``folder``, write its peft config naming
    ``base_model_id`` and ``lkv.json`` (``meta`` plus the files' checksums); returns lkv.json's content."""
    write_peft_config(folder, adapter.config, base_model_id)
    tensors = {PEFT_WEIGHTS: (adapter.lora, {"format": "pt"}),
               EMBEDDINGS: ({"embeddings": adapter.embeddings}, {"format": EMBEDDINGS_FORMAT})}
    for name, (data, metadata) in tensors.items():
        if (adapter.folder / name).is_file():
            shutil.copyfile(adapter.folder / name, folder / name)
        else:  # an adapter folder of lkv before the peft layout
            save_tensors_atomic(folder / name, data, metadata)
    meta = {**meta, "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
            "files": {n: {"sha256": sha256(folder / n), "bytes": (folder / n).stat().st_size} for n in CHECKED_FILES}}
    write_json_atomic(folder / LKV_JSON, meta)
    return meta


@dataclass
class Bundle:
    """A bundle read back from disk."""

    folder: Path
    meta: dict
    lora: dict
    embeddings: torch.Tensor

    @property
    def adapter(self) -> AdapterFiles:
        """The bundle as an adapter folder (its settings from ``lkv.json``)."""
        return AdapterFiles(folder=self.folder, config=LookaheadConfig(**self.meta["lookahead"]), lora=self.lora,
                            embeddings=self.embeddings, meta={"model": self.meta["base_model"]})


def is_bundle(folder: str | Path) -> bool:
    return (Path(folder) / LKV_JSON).is_file()


def check_files(folder: Path, meta: dict, hint: str) -> None:
    """Every file is data (safetensors, JSON, Markdown, PNG), and every file ``lkv.json`` lists is there with
    its sha256: checked before anything is loaded."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder)
        if any(part.startswith(".") for part in relative.parts):  # .gitattributes of a Hub repo, caches
            continue
        if path.suffix not in ALLOWED_SUFFIXES:
            raise LkvError(f"{path} is not a safetensors, JSON, Markdown or PNG file; an lkv bundle holds no code, "
                           "pickles or other weights, so this folder is refused")
    for name, want in meta.get("files", {}).items():
        if not (folder / name).is_file():
            raise LkvError(f"{folder / name} is missing (listed in {LKV_JSON}); {hint}")
        if sha256(folder / name) != want["sha256"]:
            raise LkvError(f"{folder / name} does not match its checksum in {LKV_JSON} (damaged or edited); {hint}")


def read_bundle(folder: str | Path) -> Bundle:
    """Read and check a bundle: format, version, file types and checksums, tensor shapes."""
    folder = Path(folder)
    hint = "export it again with `lkv export RUN_DIR --out FOLDER --overwrite`"
    meta = read_json(folder / LKV_JSON, f"{folder} is not an lkv bundle; {hint}")
    if meta.get("format") != BUNDLE_FORMAT:
        raise LkvError(f"{folder / LKV_JSON} is not an lkv bundle file (format {meta.get('format')!r})")
    if meta.get("version", 0) > BUNDLE_VERSION:
        raise LkvError(f"{folder} is bundle format v{meta['version']}; this lkv reads up to v{BUNDLE_VERSION}: "
                       "upgrade lkvcli")
    check_files(folder, meta, hint)
    read_json(folder / PEFT_CONFIG, hint)
    lora = read_tensors(folder / PEFT_WEIGHTS, hint)
    embeddings = read_tensors(folder / EMBEDDINGS, hint).get("embeddings")
    if embeddings is None or tuple(embeddings.shape) != (meta["num_tokens"], meta["hidden_size"]):
        raise LkvError(f"{folder / EMBEDDINGS} does not hold ({meta['num_tokens']}, hidden) embeddings; {hint}")
    return Bundle(folder=folder, meta=meta, lora=lora, embeddings=embeddings)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN-safe, -0.0 != 0.0)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().cpu().contiguous().view(torch.uint8), b.detach().cpu().contiguous().view(torch.uint8))


def check_parts(where: str, lora: dict, embeddings: torch.Tensor, ckpt: AdapterFiles) -> None:
    """Every LoRA tensor and the embeddings equal the checkpoint's, bit for bit."""
    bad = sorted(set(lora) ^ set(ckpt.lora)) or [k for k in sorted(lora) if not same_bits(lora[k], ckpt.lora[k])]
    if bad or not same_bits(embeddings, ckpt.embeddings):
        raise LkvError(f"verification failed: {where} differs from checkpoint {ckpt.folder.parent.name} "
                       f"({bad[0] if bad else 'embeddings'}); nothing was written")
