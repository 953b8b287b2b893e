"""Tiny randomly initialised causal LMs for tests (no downloads, no tokenizer).

``tiny_model(arch, seed)`` returns a model already passed through ``lkvcli.models.prepare_model``
(frozen, eval mode, attention routed through lkv's capture). ``TinyTokenizer`` is a minimal stand-in
for code paths that need a tokenizer (fingerprints, chat templates).
"""

from __future__ import annotations

import torch

VOCAB = 128
ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3")
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def tiny_config(arch: str):
    """The transformers config of the tiny model for ``arch``."""
    import transformers as tf

    if arch == "llama":
        return tf.LlamaConfig(**_COMMON)
    if arch == "qwen2":
        return tf.Qwen2Config(**_COMMON)
    if arch == "qwen3":
        return tf.Qwen3Config(**_COMMON, head_dim=8)
    if arch == "mistral":
        return tf.MistralConfig(**_COMMON, sliding_window=None)
    if arch == "gemma3":
        # 3 layers: sliding, sliding, full (sliding_window_pattern 3 -> every 3rd layer is global)
        cfg = dict(_COMMON, num_hidden_layers=3, num_key_value_heads=1, head_dim=8)
        return tf.Gemma3TextConfig(**cfg, sliding_window=8,
                                   layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    raise ValueError(f"unknown tiny arch {arch!r}; use one of {', '.join(ARCHS)}")


def tiny_model(arch: str, seed: int = 0):
    """A randomly initialised tiny ``arch`` model (float32, CPU), prepared by ``lkvcli.models.prepare_model``."""
    import transformers as tf

    from lkvcli.models import prepare_model

    config = tiny_config(arch)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return prepare_model(model)


class TinyTokenizer:
    """Just enough of a tokenizer for fingerprints: a fixed vocabulary and no chat template."""

    chat_template = None
    eos_token_id = VOCAB - 1
    pad_token_id = 0

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(VOCAB)}


def tiny_fingerprint(model) -> dict:
    """``lkvcli.models.fingerprint`` of a tiny model with the tiny tokenizer."""
    from lkvcli.models import fingerprint

    return fingerprint(model, TinyTokenizer())
