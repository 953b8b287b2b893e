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
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.25)


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


def tiny_loaded(arch: str = "llama", seed: int = 0):
    """A :class:`lkvcli.models.LoadedModel` around ``tiny_model(arch, seed)`` with the tiny tokenizer."""
    from lkvcli.models import LoadedModel

    model = tiny_model(arch, seed)
    return LoadedModel(model=model, tokenizer=TinyTokenizer(), source=f"tiny-{arch}-{seed}",
                       fingerprint=tiny_fingerprint(model))


def write_tiny_targets(folder, model, n: int = 8, lengths: tuple[int, int] = (10, 24), response_len: int = 6,
                       seed: int = 0, source: str = "tiny", with_text: bool = False, with_max: bool = True,
                       tasks: tuple[str, ...] = ()):
    """A real targets folder: ground truth captured during greedy decoding of ``model`` on random prompts.
    ``with_text``: records carry the prompt as text for :func:`save_tiny_model`'s tokenizer, and its last
    third as the question (what the ``context`` mode splits on). ``with_max``: also the max targets (as collect);
    ``tasks``: record i gets task ``tasks[i % len(tasks)]``."""
    from lkvcli.collect import ground_truth_targets
    from lkvcli.shapes import num_kv_heads, num_layers
    from lkvcli.targets import TargetsWriter, new_manifest

    settings = {"max_new_tokens": response_len, "reduction": "mean", "storage": "dense",
                "storage_dtype": "float32", "chat_template": False}
    manifest = new_manifest(source, tiny_fingerprint(model), settings, num_layers(model), num_kv_heads(model))
    writer = TargetsWriter(folder, manifest, records_per_file=4)
    gen = torch.Generator().manual_seed(seed)
    for i in range(n):
        length = int(torch.randint(lengths[0], lengths[1] + 1, (1,), generator=gen))
        ids = torch.randint(1, VOCAB - 1, (1, length), generator=gen)
        response, found, _ = ground_truth_targets(model, ids, response_len, set(), extras=("max",) if with_max else ())
        meta = {"id": f"r{i:04d}"}
        if tasks:
            meta["task"] = tasks[i % len(tasks)]
        if with_text:
            words = [f"t{t}" for t in ids[0].tolist()]
            meta |= {"prompt_text": " ".join(words), "question": " ".join(words[2 * length // 3:])}
        writer.add(meta, ids[0], torch.tensor(response), found.pop("mean"), extras=found)
    writer.close()
    return folder


def save_tiny_model(arch: str, folder, seed: int = 0):
    """Save ``tiny_model(arch, seed)`` plus a word-level tokenizer over the tiny vocabulary, loadable by
    ``lkvcli.models.load_model(folder)`` with the same fingerprint as :func:`tiny_fingerprint`."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    model = tiny_model(arch, seed)
    model.save_pretrained(folder)
    vocab = TinyTokenizer().get_vocab()
    backend = Tokenizer(WordLevel(vocab, unk_token="t0"))
    backend.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="t0", pad_token="t0",
                            eos_token=f"t{VOCAB - 1}").save_pretrained(folder)
    return folder
