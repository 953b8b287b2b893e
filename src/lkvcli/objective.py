"""What the lookahead module is trained to predict (``objective.target``) and how a prediction is
scored against it (``objective.loss``); the ``objective`` section of ``lkv train``.

Targets, each (layers, kv_heads, L) and renormalised per (layer, head) row:

- ``mean``: the response tokens' mean attention over the prompt (the paper's target);
- ``max``: the largest attention any single response token pays each entry, so the few entries
  one answer token copies from weigh as much as the diffuse context (needs targets collected
  with ``extra_targets: [max]``, the default);
- ``mix``: ``(1 - mix) * mean + mix * max``.

``copy_weight`` (any target): extra mass spread evenly over the prompt tokens the response copies
(runs of 4 or more tokens it shares with the prompt) in every layer and KV head, then renormalised,
so the lookahead learns to keep what the answer will copy in every head, not only in those that
read it. ``copy_boost`` instead multiplies each row's target on those copied tokens by ``1 + copy_boost``
and renormalises: a head that already reads them ranks them higher, a head that does not is left as it is.
``copy_head_weight`` leaves the targets alone and weighs each (layer, head) row of the
loss by ``1 + copy_head_weight * m``, ``m`` the row's target mass on those copied tokens, so the
heads that read what the answer copies count more.

Losses, each a mean over the rows with a non-zero target, per example:

- ``kl``: ``KL(target || prediction)``;
- ``listwise``: the same KL between both distributions tempered, ``p ** (1 / temperature)``
  renormalised: above 1 it flattens them, so the order of the many small entries near a small
  budget's cut counts more than the mass of the sinks;
- ``recall``: ``kl`` plus ``recall_weight`` times a budget-aware hinge: the target mass of the
  entries that the prediction ranks below its ``budget``-th entry, each weighted by
  ``softplus((threshold - log p) / temperature)`` (a differentiable top-``budget`` recall).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from .attention import normalise
from .config import Validated
from .errors import LkvError
from .targets import copied_runs

TARGETS = ("mean", "max", "mix")
LOSSES = ("kl", "listwise", "recall")


@dataclass
class ObjectiveConfig(Validated):
    """The ``train.objective`` section."""

    target: Literal["mean", "max", "mix"] = "max"
    mix: float = 0.5  # weight of the max target in "mix"
    loss: Literal["kl", "listwise", "recall"] = "kl"
    temperature: float = 1.0  # listwise: tempering exponent 1/T; recall: hinge width in log-score units
    budget: int = 64  # recall: entries per KV head whose recall the hinge pushes
    recall_weight: float = 1.0  # recall: weight of the hinge next to the KL
    copy_weight: float = 0.0  # extra target mass on the prompt tokens the response copies
    copy_boost: float = 0.0  # each row's target on those tokens multiplied by 1 + copy_boost
    copy_head_weight: float = 0.0  # extra loss weight of the rows that attend to those tokens

    def validate(self) -> None:
        checks = [
            (0 <= self.mix <= 1, "objective.mix", "must be in [0, 1]"),
            (self.temperature > 0, "objective.temperature", "must be > 0"),
            (self.budget >= 1, "objective.budget", "must be at least 1"),
            (self.recall_weight >= 0, "objective.recall_weight", "must be >= 0"),
            (self.copy_weight >= 0, "objective.copy_weight", "must be >= 0"),
            (self.copy_boost >= 0, "objective.copy_boost", "must be >= 0"),
            (self.copy_head_weight >= 0, "objective.copy_head_weight", "must be >= 0"),
        ]
        for ok, name, why in checks:
            if not ok:
                raise LkvError(f"{name}: {why}")

    @property
    def needs_max(self) -> bool:
        return self.target in ("max", "mix")


def record_target(record, config: ObjectiveConfig) -> torch.Tensor:
    """The training target of one :class:`lkvcli.targets.TargetRecord` under ``config``."""
    target = _base_target(record, config)
    if not (config.copy_weight or config.copy_boost):
        return target
    copied = _copied_mask(record, target.dtype)
    if not copied.any():
        return target
    if config.copy_boost:
        target = normalise(target * (1 + config.copy_boost * copied))
    if config.copy_weight:
        live = (target.sum(-1, keepdim=True) > 0).to(target.dtype)  # all-zero rows stay out of the loss
        target = normalise(target + config.copy_weight * live * copied / copied.sum())
    return target


def record_row_weights(record, config: ObjectiveConfig) -> torch.Tensor:
    """(layers, kv_heads) loss weight of each row of ``record``: ``1 + copy_head_weight * m``, ``m`` the
    row's base-target mass on the prompt tokens the response copies (all ones when the option is 0)."""
    target = _base_target(record, config)
    return 1 + config.copy_head_weight * (target * _copied_mask(record, target.dtype)).sum(-1)


def _copied_mask(record, dtype) -> torch.Tensor:
    """(L,) 1 on the prompt tokens inside a run the response copies, else 0."""
    copied = torch.zeros(record.prompt_len, dtype=dtype)
    for start, end in copied_runs(record.prompt_ids.tolist(), record.response_ids.tolist()):
        copied[start:end] = 1
    return copied


def _base_target(record, config: ObjectiveConfig) -> torch.Tensor:
    if not config.needs_max:
        return record.target
    peak = record.extras.get("max")
    if peak is None:
        raise LkvError(f"objective.target={config.target} needs max targets, which record {record.id!r} lacks; "
                       "re-collect with extra_targets=max (collect's default) or use objective.target=mean")
    if config.target == "max":
        return peak
    return normalise((1 - config.mix) * record.target + config.mix * peak)


def _kl_rows(target: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    return torch.xlogy(target, target).sum(-1) - (target * pred.clamp_min(1e-12).log()).sum(-1)


def _temper(p: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature == 1:
        return p
    return normalise(torch.where(p > 0, p.clamp_min(1e-30) ** (1 / temperature), 0.0))


def _recall_hinge_rows(target: torch.Tensor, pred: torch.Tensor, budget: int, temperature: float) -> torch.Tensor:
    """Per row: sum_i target_i * softplus((threshold - log pred_i) / T), threshold the log of the
    prediction's ``budget``-th largest entry (no gradient through it); pad columns have target 0."""
    log_pred = pred.clamp_min(1e-12).log()
    k = min(budget, pred.shape[-1])
    threshold = log_pred.detach().topk(k, dim=-1).values[..., -1:]
    return (target * F.softplus((threshold - log_pred) / temperature)).sum(-1)


def loss_per_example(target: torch.Tensor, pred: torch.Tensor, config: ObjectiveConfig | None = None,
                     row_weights: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) loss of each example: the mean over (layer, head) rows with a non-zero target, weighted by
    ``row_weights`` (B, layers, heads) when given; inputs (B, layers, heads, L)."""
    config = config or ObjectiveConfig()
    target = target.to(pred)
    if config.loss == "listwise":
        rows = _kl_rows(_temper(target, config.temperature), _temper(pred, config.temperature))
    else:
        rows = _kl_rows(target, pred)
    if config.loss == "recall" and config.recall_weight:
        rows = rows + config.recall_weight * _recall_hinge_rows(target, pred, config.budget, config.temperature)
    valid = (target.sum(-1) > 0).to(pred)
    if row_weights is not None:
        valid = valid * row_weights.to(pred)
    return (rows * valid).sum((1, 2)) / valid.sum((1, 2)).clamp_min(1)


def kl_per_example(target: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """(B,) mean over (layer, head) rows with a non-zero target of KL(target || pred): the validation metric."""
    return loss_per_example(target, pred)
