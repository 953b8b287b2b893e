"""Aggregates of the journal's rows: means per method and budget (and per task), in a fixed
order, so a resumed run gives the same numbers as an uninterrupted one."""

from __future__ import annotations

import math

from ..evict import budget_label


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def _mean_lists(lists) -> list[float | None] | None:
    """Elementwise mean of the lists present (per-layer values)."""
    lists = [v for v in lists if v is not None]
    return [_mean(column) for column in zip(*lists)] if lists else None


PREDICTION_KEYS = ("recall", "recall_nosink", "overlap", "critical_recall", "critical_heads", "copy_recall")
BY_LAYER_KEYS = ("critical_recall_by_layer", "critical_heads_by_layer", "copy_recall_by_layer")


def selected_rows(rows: list[dict], record_ids: list[str], methods: list[str], labels: list[str]) -> list[dict]:
    """The rows of this run's records, methods and budgets, in record / part / method / budget order."""
    rank = {rid: i for i, rid in enumerate(record_ids)}
    method_rank = {m: i for i, m in enumerate(["full", *methods])}
    budget_rank = {None: -1, **{b: i for i, b in enumerate(labels)}}
    keep = [r for r in rows if r["id"] in rank and r["method"] in method_rank and r["budget"] in budget_rank
            and r["part"] in ("prediction", "answers")]
    return sorted(keep, key=lambda r: (rank[r["id"]], r["part"], method_rank[r["method"]], budget_rank[r["budget"]]))


def aggregate_prediction(rows: list[dict], methods: list[str], labels: list[str]) -> dict:
    out = {}
    for name in methods:
        mine = [r for r in rows if r["part"] == "prediction" and r["method"] == name]
        per_budget = {}
        for label in labels:
            sel = [r for r in mine if r["budget"] == label]
            per_budget[label] = {k: _mean(r.get(k) for r in sel) for k in PREDICTION_KEYS}  # older rows lack some
            per_budget[label].update({k: _mean_lists(r.get(k) for r in sel) for k in BY_LAYER_KEYS})
        out[name] = {"kl": _mean(r["kl"] for r in mine), "records": len({r["id"] for r in mine}),
                     "critical_records": len({r["id"] for r in mine if r.get("critical_recall") is not None}),
                     "copy_records": len({r["id"] for r in mine if r.get("copy_recall") is not None}),
                     "budgets": per_budget}
    return out


def aggregate_answers(rows: list[dict], methods: list[str], labels: list[str]) -> dict:
    ans = [r for r in rows if r["part"] == "answers"]
    full = [r for r in ans if r["method"] == "full"]
    out = {"full": {"score": _mean(r["score"] for r in full), "records": len(full)}, "methods": {}, "by_task": {}}
    for name in methods:
        out["methods"][name] = {}
        for label in labels:
            sel = [r for r in ans if r["method"] == name and r["budget"] == label]
            out["methods"][name][label] = {
                "score": _mean(r["score"] for r in sel), "agreement": _mean(r["agreement"] for r in sel),
                "same_as_full": _mean(float(r["same_as_full"]) for r in sel),
                "cache_ratio": _mean(r["cache_bytes_after"] / max(1, r["cache_bytes_before"]) for r in sel),
                "padding_ratio": _mean(r.get("padding_bytes", 0) / max(1, r["cache_bytes_before"]) for r in sel)}
    for task in sorted({r["task"] or "-" for r in ans}):
        mine = [r for r in ans if (r["task"] or "-") == task]
        out["by_task"][task] = {"full": _mean(r["score"] for r in mine if r["method"] == "full")}
        for name in methods:
            out["by_task"][task][name] = {label: _mean(r["score"] for r in mine if r["method"] == name
                                                       and r["budget"] == label) for label in labels}
    return out


def throughput(timings: dict, records: int, wall_s: float, parts: list[str], overhead_s: float | None) -> dict:
    """Wall time and records per minute of each part, over the records computed in this run.

    The shared prefill and scoring serve both the prediction and the answers part, so each of
    those parts is charged for them: its time is shared work plus its own (metrics, decoding).
    """
    shared = timings["prefill_s"] + timings["score_s"]
    own = {"prediction": timings["metrics_s"], "answers": timings["decode_s"]}
    out = {"wall_s": wall_s, "records_computed": timings["records"], "records": records, "parts": {}, **timings}
    for part in parts:
        seconds = overhead_s if part == "overhead" else shared + own[part]
        count = records if part == "overhead" else timings["records"]
        out["parts"][part] = {"s": seconds, "records_per_min": 60.0 * count / seconds if seconds and count else None}
    return out


def labels_of(budgets) -> list[str]:
    return [budget_label(b) for b in budgets]
