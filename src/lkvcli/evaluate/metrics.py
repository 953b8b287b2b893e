"""What ``lkv eval`` measures: answer scores (task metrics, ROUGE-L) and prediction metrics
(KL, ground-truth mass recall, recall without sinks, overlap with the oracle's kept set, and
the share kept of the critical spans, or else of the prompt tokens the response copies)."""

from __future__ import annotations

import string

import torch

from ..attention import normalise
from ..errors import LkvError
from ..evict import keep_indices

SINKS_EXCLUDED = 4  # positions left out of "recall excluding sinks"


def normalise_text(text: str) -> str:
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.split())


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F1 over normalised words (longest common subsequence)."""
    a, b = normalise_text(prediction).split(), normalise_text(reference).split()
    if not a or not b:
        return float(a == b)
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(a), lcs / len(b)
    return 2 * p * r / (p + r)


def answer_score(prediction: str, answer, metric: str | None, full_answer: str) -> float:
    """Score of one answer: the record's metric against its answer; ``agreement`` (or no answer)
    compares with the full-cache answer by ROUGE-L F1."""
    answers = [answer] if isinstance(answer, str) else list(answer or [])
    if metric in (None, "agreement") or not answers:
        return rouge_l(prediction, full_answer)
    pred = normalise_text(prediction)
    found = [normalise_text(a) in pred for a in answers]
    if metric == "contains_all":
        return float(all(found))
    if metric == "contains_any":
        return float(any(found))
    if metric == "exact":
        return float(any(pred == normalise_text(a) for a in answers))
    if metric == "rouge_l":
        return max(rouge_l(prediction, a) for a in answers)
    raise LkvError(f"unknown answer metric {metric!r}")


def span_metrics(kept: torch.Tensor, spans: list[tuple[int, int]], name: str, heads: bool) -> dict:
    """Share of the span tokens kept (``{name}_recall``) and, with ``heads``, share of (layer, KV head)
    pairs keeping every token of every span (``{name}_heads``): means over layers and heads, and per
    layer (``_by_layer``). ``kept`` (layers, kv, L) bool; spans ``[start, end)`` in its positions."""
    member = torch.zeros(len(spans), kept.shape[-1], dtype=torch.bool, device=kept.device)
    for k, (start, end) in enumerate(spans):
        member[k, start:end] = True
    union = member.any(0)
    values = {"recall": (kept & union).sum(-1) / union.sum()}
    if heads:
        values["heads"] = ((kept.float() @ member.float().T) == member.sum(-1)).all(-1).float()
    out = {}
    for key, v in values.items():
        out[f"{name}_{key}"] = float(v.mean())
        out[f"{name}_{key}_by_layer"] = v.mean(-1).tolist()
    return out


def prediction_metrics(scorer, scores: torch.Tensor, target: torch.Tensor, budgets: list[int],
                       pooled_layers: list[int] | None = None, critical: list[tuple[int, int]] | None = None,
                       copied: list[tuple[int, int]] | None = None) -> dict:
    """KL(GT || scores) and, per budget, recall / recall without sinks / overlap with the oracle set,
    and the :func:`span_metrics` of the ``critical`` spans (recall and heads) and of the ``copied``
    ones (recall) when given.

    ``scores`` (1, layers, kv, L), ``target`` (layers, kv, L) renormalised; the kept sets are
    what :func:`lkvcli.evict.compress` would keep for ``scorer`` (protection, per-layer budgets,
    allocation over ``pooled_layers``: the full-attention layers); a layer kept whole keeps every
    span. The oracle's set for ``overlap`` is its uniform top-C per head.
    """
    gt = target.to(scores.device).float()
    L, layers = gt.shape[-1], gt.shape[0]
    live = gt.sum(-1) > 0  # all-zero GT rows carry no information
    rest = gt[..., SINKS_EXCLUDED:].sum(-1)
    out: dict = {"kl": None, "budgets": {}}
    if scorer.distribution:
        pred = normalise(scores[0].clamp_min(0)).clamp_min(1e-10)
        out["kl"] = float((gt * (gt.clamp_min(1e-30).log() - pred.log())).sum(-1)[live].mean())
    for c in budgets:
        per_layer = scorer.layer_budgets(c, layers, L)
        kept = keep_indices(scores, per_layer, sink_tokens=scorer.sink_tokens, recent_window=scorer.recent_window,
                            allocation=scorer.allocation, pooled_layers=pooled_layers)
        best = keep_indices(gt[None], per_layer)
        recall, recall_ns, overlap = torch.ones(3, *gt.shape[:2], device=gt.device)
        kept_mask = torch.ones(gt.shape, dtype=torch.bool, device=gt.device)
        for layer, (idx, top) in enumerate(zip(kept, best)):
            if idx is None:
                continue
            idx, g = idx[0], gt[layer]
            real = idx >= 0  # heads/global allocation pad short heads with -1
            kept_mask[layer] = torch.zeros(*g.shape[:-1], L + 1, dtype=torch.bool, device=g.device).scatter_(
                -1, idx.where(real, L), True)[..., :L]
            mass = g.gather(-1, idx.clamp_min(0)) * real
            recall[layer] = mass.sum(-1)
            recall_ns[layer] = mass.masked_fill(idx < SINKS_EXCLUDED, 0).sum(-1) / rest[layer].clamp_min(1e-30)
            hit = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, top[0], True) if top is not None else \
                torch.ones_like(g, dtype=torch.bool)
            picked = hit.gather(-1, idx.clamp_min(0))
            overlap[layer] = picked.float().mean(-1) if bool(real.all()) else \
                (picked & real).float().sum(-1) / real.sum(-1).clamp_min(1)
        out["budgets"][c] = {"recall": float(recall[live].mean()),
                             "recall_nosink": float(recall_ns[live & (rest > 0)].mean()),
                             "overlap": float(overlap[live].mean())}
        for name, spans in (("critical", critical), ("copy", copied)):
            if spans:
                out["budgets"][c].update(span_metrics(kept_mask, spans, name, heads=name == "critical"))
    return out
