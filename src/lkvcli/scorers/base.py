"""The scorer interface, the registration decorator, and the shared prefill/pooling every scorer goes through.

A scorer is a small ``@dataclass`` of options registered under a name. Given a
:class:`ScoreContext` (the model, the prompt, its prefill state, the collected record and the
shared ``resources`` such as a lookahead adapter) it returns importance scores of shape
``(batch, layers, kv_heads, L)``; every method then goes through the same eviction code
(:mod:`lkvcli.evict`), so the only difference between methods is the score (and, for PyramidKV,
the per-layer budgets). What a scorer needs from the prefill it asks for in :meth:`Scorer.capture_spec`.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from ..attention import capture_attention, normalise
from ..config import Validated
from ..errors import LkvError
from ..generate import prefill

_REGISTRY: dict[str, type[Scorer]] = {}


def register(name: str):
    """Class decorator: register a scorer dataclass under ``name``."""

    def wrap(cls):
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


@dataclass
class ScoreContext:
    """Everything a scorer may read. ``input_ids`` is the scored part of the prompt (in the
    ``context`` mode: the context only); ``state`` is its prefill (cache, last logits, next
    position); ``capture`` holds the prefill attention when the scorer asked for it."""

    model: torch.nn.Module
    input_ids: torch.Tensor  # (batch, L)
    attention_mask: torch.Tensor | None = None  # (batch, L), 0 on (left) padding
    state: object | None = None  # generate.Prefill
    capture: object | None = None  # attention.AttentionCapture
    record: object | None = None  # targets.TargetRecord (oracle)
    tokenizer: object | None = None
    reduction: str = "mean"  # GQA group reduction; must match the targets' (manifest settings)
    resources: dict = field(default_factory=dict)  # shared heavy objects: "adapter", "draft" models

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1]

    @property
    def batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def device(self) -> torch.device:
        return self.input_ids.device


def position_ids(attention_mask: torch.Tensor | None, length: int, device) -> torch.Tensor | None:
    """Positions that skip left padding (None without padding: the model counts from 0)."""
    if attention_mask is None or bool(attention_mask.all()):
        return None
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -length:].to(device)


@dataclass
class Scorer(Validated):
    """Options shared by every scorer.

    ``sink_tokens``: always keep the first k prompt positions. ``recent_window``: always
    keep the last w prompt positions (when protected positions exceed the budget, sinks win,
    then the most recent). ``pooling``/``pooling_kernel``: smooth scores along the prompt
    (1-D avg or max pooling, stride 1, same length), then renormalise; ``pooling_keeps_peaks``:
    each entry keeps the larger of its own and its pooled score, so average pooling lifts a
    peak's neighbours without lowering the peak. ``allocation``: how a
    budget is shared (:func:`lkvcli.evict.keep_indices`): the same count in every KV head
    (``uniform``), one top per layer across its heads (``heads``), or one top over every
    full-attention layer (``global``).
    """

    name: ClassVar[str] = ""
    distribution: ClassVar[bool] = True  # scores are attention-like probabilities (KL is meaningful)

    sink_tokens: int = 0
    recent_window: int = 0
    pooling: Literal["none", "avg", "max"] = "none"
    pooling_kernel: int = 7
    pooling_keeps_peaks: bool = False
    allocation: Literal["uniform", "heads", "global"] = "uniform"

    def validate(self) -> None:
        if self.sink_tokens < 0 or self.recent_window < 0:
            raise LkvError(f"{self.name}: sink_tokens and recent_window must be >= 0")
        if self.pooling != "none" and (self.pooling_kernel < 1 or self.pooling_kernel % 2 == 0):
            raise LkvError(f"{self.name}: pooling_kernel must be a positive odd number, not {self.pooling_kernel}")

    def options(self) -> dict:
        return dataclasses.asdict(self)

    # -- the runtime calls these, in this order -------------------------------------------------
    def capture_spec(self, prompt_len: int) -> dict | None:
        """``capture_attention`` arguments for the prefill (``query_start``...), or None."""
        return None

    def prefill(self, ctx: ScoreContext) -> ScoreContext:
        """Prefill ``ctx.input_ids`` (capturing attention when :meth:`capture_spec` asks) into ``ctx.state``."""
        return prepare_shared({self.name: self}, ctx)[self.name]

    def raw_scores(self, ctx: ScoreContext) -> torch.Tensor:
        """(batch, layers, kv_heads, L) before pooling. Subclasses implement this."""
        raise NotImplementedError

    def score(self, ctx: ScoreContext) -> torch.Tensor:
        """Pooled scores (batch, layers, kv_heads, L), float32; renormalised for distribution scorers."""
        with torch.inference_mode():
            scores = self.raw_scores(ctx).float()
            if self.pooling != "none" and self.pooling_kernel > 1:
                pooled = pool(scores, self.pooling, self.pooling_kernel)
                scores = torch.maximum(scores, pooled) if self.pooling_keeps_peaks else pooled
                if self.distribution:
                    scores = normalise(scores)
        return scores

    def layer_budgets(self, budget: int, num_layers: int, prompt_len: int) -> list[int]:
        """Entries kept per layer and KV head; uniform except for per-layer methods (PyramidKV)."""
        return [min(budget, prompt_len)] * num_layers


def pool(scores: torch.Tensor, kind: str, kernel: int) -> torch.Tensor:
    """1-D pooling along the last dim, stride 1, same length (SnapKV's smoothing)."""
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    if kind == "avg":
        out = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        out = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    return out.reshape(shape)


def captured(ctx: ScoreContext) -> torch.Tensor:
    """The prefill capture's scores (batch, layers, kv, L), renormalised over the prompt."""
    if ctx.capture is None:
        raise RuntimeError("this scorer needs the prefill attention; call scorer.prefill(ctx) first")
    return ctx.capture.scores()


def prepare(scorer: Scorer, model, input_ids: torch.Tensor, *, attention_mask=None, record=None, tokenizer=None,
            reduction: str = "mean", resources: dict | None = None) -> ScoreContext:
    """A context for ``scorer`` with the prompt prefilled as it needs."""
    ctx = ScoreContext(model=model, input_ids=input_ids, attention_mask=attention_mask, record=record,
                       tokenizer=tokenizer, reduction=reduction, resources=resources if resources is not None else {})
    return scorer.prefill(ctx)


def prepare_shared(scorers: dict[str, Scorer], ctx: ScoreContext) -> dict[str, ScoreContext]:
    """One prefill of ``ctx.input_ids`` serving every scorer: a context per scorer, all sharing the
    prefill state, each with the capture its :meth:`Scorer.capture_spec` asks for (identical specs
    share one capture; no capture runs that no scorer needs, so H2O's all-query attention is
    computed only when h2o is among them). Scorers must leave the shared state as they found it.
    """
    L = ctx.prompt_len
    specs = {name: s.capture_spec(L) for name, s in scorers.items()}
    unique = {tuple(sorted(spec.items())) for spec in specs.values() if spec}
    pos = position_ids(ctx.attention_mask, L, ctx.device)
    kwargs = {"attention_mask": ctx.attention_mask} if ctx.attention_mask is not None else {}
    if pos is not None:
        kwargs["position_ids"] = pos
    with ExitStack() as stack:
        captures = {key: stack.enter_context(capture_attention(ctx.model, key_len=L, reduction=ctx.reduction,
                                                               **dict(key)))
                    for key in sorted(unique)}
        state = prefill(ctx.model, ctx.input_ids, **kwargs)
    if pos is not None:  # left padding: each row continues at its own position
        state.next_position = pos[:, -1] + 1
    return {name: dataclasses.replace(ctx, state=state,
                                      capture=captures[tuple(sorted(spec.items()))] if spec else None)
            for name, spec in specs.items()}
