"""Shape facts of a model or its config (layers, KV heads, context length); multimodal configs read
through their text config. A leaf module: it imports nothing from lkv."""

from __future__ import annotations


def text_config(model_or_config):
    config = getattr(model_or_config, "config", model_or_config)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def num_layers(model) -> int:
    return text_config(model).num_hidden_layers


def num_kv_heads(model) -> int:
    config = text_config(model)
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def context_length(model) -> int | None:
    return getattr(text_config(model), "max_position_embeddings", None)
