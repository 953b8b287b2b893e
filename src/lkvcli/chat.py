"""Chat formatting: a prompt's messages into the token ids the model is prefilled with."""

from __future__ import annotations


def chat_ids(tokenizer, messages: list[dict]) -> tuple[list[int], str]:
    """Token ids and text of the chat-formatted prompt (with the assistant turn opened)."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = "\n\n".join(m["content"] for m in messages)
        if getattr(tokenizer, "bos_token", None):
            text = tokenizer.bos_token + text
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return list(ids), text
