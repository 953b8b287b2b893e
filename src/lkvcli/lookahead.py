"""The lookahead module: N learned soft tokens after the prompt, plus a LoRA active only at their positions.

It runs in two stages, and this is the one scoring implementation used by training, by
``lkv eval`` and at inference:

1. :meth:`LookaheadAdapter.prefill` runs the prompt through the frozen base model with the
   adapter switched off (no grad) into a ``DynamicCache``;
2. :meth:`LookaheadAdapter.score` runs the N lookahead embeddings over that cache (positions
   L..L+N-1) with the adapter switched on, inside :func:`lkvcli.attention.capture_attention`,
   and returns their attention over the L prompt keys, reduced per KV head, averaged (or, with
   ``query_reduction: max``, maxed) over the N
   queries and renormalised. The pass adds nothing to the cache (:func:`lkvcli.attention.attend_over`:
   every layer attends over the cached keys and the N new ones without concatenating them, and
   one softmax gives both the attention output and the scores).

Every position of stage 2 is a lookahead position, so a plain LoRA switched on only for that
pass is exactly peft's activated LoRA (aLoRA) applied to prompt + lookahead in one pass; the
prompt's hidden states, logits and cache are bit-identical to the base model's. The adapter's
LoRA layers are *off* except inside :meth:`score`, so :attr:`base_model` can be used as the
plain frozen model anywhere (decoding, baselines).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import nn

from .attention import GROUP_REDUCTIONS, ROW_REDUCTIONS, attend_over, capture_attention
from .compat import cache_kwargs
from .config import Validated
from .errors import LkvError

INITS = ("mean_embed", "random")


@dataclass
class LookaheadConfig(Validated):
    """Lookahead tokens and their LoRA (recipe section ``train.lookahead``)."""

    num_tokens: int = 32
    init: str = "mean_embed"  # mean_embed: mean real-token embedding + noise; random: noise at the embeddings' scale
    init_noise: float = 0.02  # noise std, relative to the std of the embedding table
    lora_rank: int = 8
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: list[str] | str = "all-linear"  # all-linear: every linear layer of attention and MLP
    reduction: str = "mean"  # how the query heads of a KV group are reduced (same as the targets')
    query_reduction: str = "max"  # how the N lookahead queries combine: their max (measured best) or their mean (the paper's)

    def validate(self) -> None:
        checks = [
            (self.num_tokens >= 1, "num_tokens", "must be at least 1"),
            (self.init in INITS, "init", f"must be one of {', '.join(INITS)}"),
            (self.init_noise >= 0, "init_noise", "must be >= 0"),
            (self.lora_rank >= 1, "lora_rank", "must be at least 1"),
            (0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)"),
            (self.reduction in GROUP_REDUCTIONS, "reduction", f"must be one of {', '.join(GROUP_REDUCTIONS)}"),
            (self.query_reduction in ROW_REDUCTIONS, "query_reduction", f"must be one of {', '.join(ROW_REDUCTIONS)}"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise LkvError(f"lookahead.{name}: {getattr(self, name)!r} {why}")


def resolve_target_modules(model: nn.Module, target_modules: list[str] | str) -> list[str]:
    """Module names for the LoRA; ``all-linear`` is every ``nn.Linear`` inside the decoder layers."""
    items = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    names = [n.strip() for item in items for n in item.split(",") if n.strip()]
    linear = {name: name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    if names == ["all-linear"]:
        names = sorted({leaf for full, leaf in linear.items() if ".layers." in f".{full}"})
    missing = sorted(set(names) - set(linear.values()))
    if missing or not names:
        known = ", ".join(sorted(set(linear.values())))
        raise LkvError(f"lookahead.target_modules: {', '.join(missing) or '(empty)'} not linear layers of this model; "
                       f"it has: {known}")
    return names


def initial_embeddings(model: nn.Module, config: LookaheadConfig, seed: int = 0) -> torch.Tensor:
    """(N, hidden) float32 start values, in the units the decoder sees (Gemma's embedding scale included)."""
    embed = model.get_input_embeddings()
    weight = embed.weight.detach().float()
    scale = float(getattr(embed, "embed_scale", 1.0))
    std = float(weight.std()) * scale
    noise = torch.randn(config.num_tokens, weight.shape[1], generator=torch.Generator().manual_seed(seed))
    if config.init == "random":
        return noise * std
    return (weight.mean(0) * scale).cpu() + noise * std * config.init_noise


def left_pad(sequences: list[torch.Tensor], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad 1-D id tensors into (input_ids, attention_mask), both (batch, max_len)."""
    width = max(int(s.numel()) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq.numel():
            ids[row, -seq.numel():] = seq.reshape(-1)
            mask[row, -seq.numel():] = 1
    return ids, mask


def prompt_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: the i-th real token is at position i (pads at 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def unpad_scores(scores: torch.Tensor, attention_mask: torch.Tensor | None) -> list[torch.Tensor]:
    """Per example, the (layers, kv_heads, L_b) scores without the pad columns."""
    if attention_mask is None:
        return list(scores)
    return [s[..., m.bool()] for s, m in zip(scores, attention_mask.to(scores.device))]


class LookaheadAdapter:
    """A peft-wrapped model plus N trainable lookahead embeddings; see the module docstring."""

    def __init__(self, peft_model, embeddings: nn.Parameter, config: LookaheadConfig):
        from peft.tuners.tuners_utils import BaseTunerLayer

        self.peft_model = peft_model
        self._lora_layers = [m for m in peft_model.modules() if isinstance(m, BaseTunerLayer)]
        self.embeddings = embeddings
        self.config = config
        self._set_lora(False)

    @classmethod
    def attach(cls, model: nn.Module, config: LookaheadConfig | None = None, seed: int = 0) -> LookaheadAdapter:
        """Wrap ``model`` (modified in place: LoRA layers are injected, switched off) with a fresh adapter."""
        from peft import get_peft_model

        config = replace(config or LookaheadConfig())
        config.target_modules = resolve_target_modules(model, config.target_modules)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers deprecations peft triggers
            torch.manual_seed(seed)
            peft_model = get_peft_model(model, lora_config(config))
        device = next(model.parameters()).device
        embeddings = nn.Parameter(initial_embeddings(model, config, seed).to(device))
        return cls(peft_model, embeddings, config)

    @property
    def base_model(self) -> nn.Module:
        """The transformers model; its LoRA layers are off outside :meth:`score`, so it is the frozen base."""
        return self.peft_model.get_base_model()

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def _set_lora(self, on: bool) -> None:
        # Flip peft's per-layer switch directly: peft's enable/disable_adapter_layers also toggle requires_grad.
        for module in self._lora_layers:
            module._disable_adapters = not on

    @contextmanager
    def lora_on(self):
        """The LoRA is active inside the block (the lookahead pass) and off again after it."""
        self._set_lora(True)
        try:
            yield
        finally:
            self._set_lora(False)

    def train(self, mode: bool = True) -> None:
        """Train mode for the LoRA dropout only; the base model stays in eval mode."""
        for name, module in self.peft_model.named_modules():
            if name.endswith("lora_dropout"):
                module.train(mode)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """The trainable parameters: ``embeddings`` first, then the LoRA matrices by name."""
        lora = [(n, p) for n, p in self.peft_model.named_parameters() if "lora_" in n and p.requires_grad]
        return [("embeddings", self.embeddings)] + sorted(lora)

    def num_parameters(self) -> int:
        return sum(p.numel() for _, p in self.named_parameters())

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """The prompt through the frozen base model (adapter off, no grad) into a new ``DynamicCache``.

        With a left-padded batch pass its ``attention_mask``; the i-th real token gets position i.
        """
        from transformers import DynamicCache

        model = self.base_model
        cache = DynamicCache(config=model.config)
        input_ids = input_ids.to(self.device)
        positions = None
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
            positions = prompt_positions(attention_mask)
        decoder = model.get_decoder()
        decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                **cache_kwargs(decoder, cache), use_cache=True)
        return cache

    def score(self, cache, prompt_len: int | None = None, attention_mask=None,
              query_reduction: str | None = None) -> torch.Tensor:
        """Predicted importance, (batch, layers, kv_heads, L) float32, each row summing to 1 over the prompt.

        ``cache`` is the prompt's prefilled ``DynamicCache`` (adapter off; under grad it must not
        come from ``torch.inference_mode``); it is left exactly as found (nothing is added to it,
        nothing copied). With a left-padded
        batch pass the prompt's ``attention_mask`` (batch, L): pad columns score 0 (see
        :func:`unpad_scores`) and lookahead positions continue each example's own length.
        Differentiable in the embeddings and the LoRA weights when grad is enabled.
        ``query_reduction`` overrides the config's (mean or max over the N lookahead queries).
        """
        model = self.base_model
        past = cache.get_seq_length()
        key_len = past if prompt_len is None else prompt_len
        batch, n = cache.layers[0].keys.shape[0], self.config.num_tokens
        steps = torch.arange(n, device=self.device)
        if attention_mask is None:
            positions, mask = (past + steps).expand(batch, n), None
        else:
            attention_mask = attention_mask.to(self.device)
            positions = attention_mask.sum(-1, keepdim=True) + steps
            mask = torch.cat([attention_mask, attention_mask.new_ones(batch, n)], dim=-1)
        embeds = self.embeddings.to(model.dtype).expand(batch, n, -1)
        capture = capture_attention(model, key_len=key_len, query_start=past, past_len=past,
                                    reduction=self.config.reduction,
                                    rows=query_reduction or self.config.query_reduction)
        with self.lora_on(), attend_over(cache), capture as capture:
            decoder = model.get_decoder()
            decoder(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                    **cache_kwargs(decoder, cache), use_cache=True)
        return capture.scores()

    def predict(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Prefill then score: (batch, layers, kv_heads, L)."""
        return self.score(self.prefill(input_ids, attention_mask), attention_mask=attention_mask)

    def state_dict_parts(self) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(LoRA weights as peft names them, lookahead embeddings (N, hidden))."""
        from peft import get_peft_model_state_dict

        lora = {k: v.detach() for k, v in get_peft_model_state_dict(self.peft_model).items()}
        return lora, self.embeddings.detach()

    @torch.no_grad()
    def load_parts(self, lora_state: dict[str, torch.Tensor], embeddings: torch.Tensor) -> None:
        from peft import set_peft_model_state_dict

        if tuple(embeddings.shape) != tuple(self.embeddings.shape):
            raise LkvError(f"lookahead embeddings of shape {tuple(embeddings.shape)} do not fit this adapter "
                           f"{tuple(self.embeddings.shape)}")
        result = set_peft_model_state_dict(self.peft_model, lora_state)
        missing = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if missing:
            raise LkvError(f"LoRA weights do not fit this model (for example {missing[0]})")
        self.embeddings.copy_(embeddings.to(self.embeddings))


def lora_config(config: LookaheadConfig, **extra):
    from peft import LoraConfig

    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.target_modules), bias="none", task_type="CAUSAL_LM", **extra)


def alora_twin(model: nn.Module, adapter: LookaheadAdapter):
    """Reference only (tests, the naive benchmark step): ``model`` (another copy of the base weights)
    wrapped with peft's aLoRA carrying ``adapter``'s LoRA weights, for single-pass scoring."""
    from peft import get_peft_model, set_peft_model_state_dict

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        twin = get_peft_model(model, lora_config(adapter.config, alora_invocation_tokens=[0]))
    set_peft_model_state_dict(twin, adapter.state_dict_parts()[0])
    return twin


def single_pass_scores(twin, embeddings: torch.Tensor, input_ids: torch.Tensor, reduction: str = "mean",
                       offsets: bool = True) -> torch.Tensor:
    """Reference scores: prompt + lookahead embeddings in ONE forward through an aLoRA ``twin``.

    peft's trap: with ``inputs_embeds`` and no ``alora_offsets`` (``offsets=False``), the
    adapter is silently inactive everywhere.
    """
    model = twin.get_base_model()
    batch, length = input_ids.shape
    n = embeddings.shape[0]
    prompt = model.get_input_embeddings()(input_ids)
    embeds = torch.cat([prompt, embeddings.to(prompt.dtype).expand(batch, n, -1)], dim=1)
    kwargs = {"alora_offsets": [n] * batch} if offsets else {}
    with capture_attention(model, key_len=length, query_start=length, reduction=reduction) as capture:
        twin(inputs_embeds=embeds, logits_to_keep=1, **kwargs)
    return capture.scores()
