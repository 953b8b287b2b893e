"""``lkv eval``: how well each method predicts the response's attention, answers with an evicted
cache, and what it costs. Library code: never prints; ``on_event`` feeds progress displays.

Three parts (``parts``):

* ``prediction``: on held-out collected records, per method, KL(GT || method) (methods that
  produce a distribution) and, per budget, GT-mass recall, recall excluding the first 4
  positions (attention sinks hold much of the mass), and overlap of the kept set with the
  oracle's top-C set. Every method keeps what the eviction runtime would keep (its sink and
  recent protection, its per-layer budgets).
* ``answers``: greedy answers with the cache evicted to each budget, scored by the record's
  ``metric`` against its ``answer``, and by agreement (ROUGE-L F1 over words) with the
  full-cache answer, which is the collected response itself (same model, greedy).
* ``overhead``: per method, the time of prefill, scoring and eviction and the time to first
  token, against plain prefill on the same prompts in the same run; methods interleaved in
  a seeded shuffled order per repeat; medians. Peak memory above the start of each run
  (CUDA allocator, or the process's peak RSS on CPU) and cache bytes before/after.

Modes: ``whole`` (the paper's: the whole prompt is prefilled, scored and evicted) and
``context`` (kvpress's: only the context is; then the question and the chat template's tail
are fed over the evicted cache at their original positions; see docs/eval.md).
"""

from __future__ import annotations

import math
import platform
import random
import statistics
import string
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

import torch

from . import __version__
from .attention import normalise
from .errors import LkvError
from .evict import budget_label, cache_bytes, compress, feed, keep_indices, parse_budget, resolve_budget
from .generate import greedy_decode, prefill, stop_token_ids
from .scorers import available, get_scorer, prepare

PARTS = ("prediction", "answers", "overhead")
SINKS_EXCLUDED = 4  # positions left out of "recall excluding sinks"
DEFAULT_BUDGETS = ["64", "128", "256", "512"]


@dataclass
class EvalConfig:
    """Settings of ``lkv eval`` (recipe section ``eval``)."""

    targets: list[str] = field(default_factory=list)
    model: str | None = None  # default: the model the targets were collected with
    adapter: str | None = None  # training run folder or bundle (needed by the lookahead method)
    methods: list[str] | None = None  # default: every method (lookahead only with an adapter)
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    out: str = "results"
    mode: Literal["whole", "context"] = "whole"
    split: Literal["auto", "validation", "all"] = "auto"  # auto: the adapter run's validation records if known
    limit: int | None = None
    max_new_tokens: int | None = None  # default: each record's collected response length
    overhead_prompts: int = 2
    overhead_repeats: int = 3
    scorers: dict = field(default_factory=dict)  # per-method options, e.g. {"snapkv": {"window": 64}}
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False

    def validate(self) -> None:
        if not self.targets:
            raise LkvError("no targets given; pass --targets FOLDER (written by `lkv collect`)")
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise LkvError(f"unknown part {bad[0] if bad else '(none)'!r}; parts: {', '.join(PARTS)}")
        if not self.budgets:
            raise LkvError("no budgets given; pass --budgets 64,128 (entries per head) or 0.1 (ratio of the prompt)")
        for b in self.budgets:
            parse_budget(b)
        for name in self.methods or []:
            if name != "full":
                get_scorer(name, **self.scorers.get(name, {}))  # unknown names and options fail here
        unknown = sorted(set(self.scorers) - set(available()))
        if unknown:
            raise LkvError(f"scorers: unknown method {unknown[0]!r}; known methods: {', '.join(available())}")
        for name, value in (("limit", self.limit), ("max_new_tokens", self.max_new_tokens)):
            if value is not None and value < 1:
                raise LkvError(f"{name} must be at least 1")
        if self.overhead_prompts < 1 or self.overhead_repeats < 1:
            raise LkvError("overhead_prompts and overhead_repeats must be at least 1")

    def method_names(self, has_adapter: bool) -> list[str]:
        names = [m for m in (self.methods or available()) if m != "full"]
        if self.methods is None and not has_adapter:
            names = [m for m in names if m != "lookahead"]
        return names


# ------------------------------------------------------------------ answer metrics
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


# ------------------------------------------------------------------ prediction metrics
def prediction_metrics(scorer, scores: torch.Tensor, target: torch.Tensor, budgets: list[int]) -> dict:
    """KL(GT || scores) and, per budget, recall / recall without sinks / overlap with the oracle set.

    ``scores`` (1, layers, kv, L), ``target`` (layers, kv, L) renormalised; the kept sets are
    what :func:`lkvcli.evict.compress` would keep for ``scorer`` (protection, per-layer budgets).
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
        kept = keep_indices(scores, per_layer, sink_tokens=scorer.sink_tokens, recent_window=scorer.recent_window)
        best = keep_indices(gt[None], per_layer)
        recall, recall_ns, overlap = torch.ones(3, *gt.shape[:2], device=gt.device)
        for layer, (idx, top) in enumerate(zip(kept, best)):
            if idx is None:
                continue
            idx, g = idx[0], gt[layer]
            mass = g.gather(-1, idx)
            recall[layer] = mass.sum(-1)
            recall_ns[layer] = mass.masked_fill(idx < SINKS_EXCLUDED, 0).sum(-1) / rest[layer].clamp_min(1e-30)
            hit = torch.zeros_like(g, dtype=torch.bool).scatter_(-1, top[0], True)
            overlap[layer] = hit.gather(-1, idx).float().mean(-1)
        out["budgets"][c] = {"recall": float(recall[live].mean()),
                             "recall_nosink": float(recall_ns[live & (rest > 0)].mean()),
                             "overlap": float(overlap[live].mean())}
    return out


# ------------------------------------------------------------------ records and splits
def context_split(record, tokenizer) -> int:
    """Tokens of the prompt that form the context (``context`` mode): everything before the
    question, or, without one, before the chat template's tail after the last message."""
    meta = record.meta
    text = meta.get("prompt_text")
    if not text or tokenizer is None:
        raise LkvError(f"record {record.id!r} has no prompt_text; the context mode needs records from `lkv collect`")
    question = meta.get("question")
    if question and text.rfind(question) >= 0:
        cut = text.rfind(question)
    else:
        last = (meta.get("messages") or [{}])[-1].get("content") or ""
        cut = text.rfind(last) + len(last) if last and text.rfind(last) >= 0 else len(text)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc.input_ids) != record.prompt_ids.tolist():
        raise LkvError(f"record {record.id!r}: the tokenizer does not reproduce its prompt ids; use the model it was "
                       "collected with")
    starts = [s for s, _ in enc.offset_mapping]
    split = sum(1 for s in starts if s < cut)
    return max(1, min(split, record.prompt_len))


def select_records(reader, split: str, validation_ids: list[str] | None, limit: int | None) -> list[int]:
    """Indices of the held-out records: the adapter run's validation ids (``auto`` when known), or all."""
    ids = reader.ids()
    if split == "validation" and validation_ids is None:
        raise LkvError("split=validation needs an adapter run that lists its validation records; use split=all")
    if split in ("auto", "validation") and validation_ids is not None:
        wanted = set(validation_ids)
        chosen = [i for i, rid in enumerate(ids) if rid in wanted]
        if not chosen:
            raise LkvError("none of the adapter run's validation records is in these targets; pass split=all or the "
                           "targets the adapter was trained on")
    else:
        chosen = list(range(len(ids)))
    return chosen[:limit] if limit else chosen


# ------------------------------------------------------------------ memory probes
class PeakMemory:
    """Peak memory above the start of a block: CUDA allocator, else the process's peak RSS (Linux)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.peak_mb: float | None = None

    @staticmethod
    def _status(key: str) -> int | None:
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            try:
                Path("/proc/self/clear_refs").write_text("5")  # resets the peak RSS (VmHWM)
            except OSError:
                pass
            self.start = self._status("VmRSS")
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak_mb = (torch.cuda.max_memory_allocated() - self.start) / 2**20
        else:
            peak = self._status("VmHWM")
            self.peak_mb = None if peak is None or self.start is None else max(0, peak - self.start) / 2**20


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------ one method on one prompt
@dataclass
class Scored:
    ctx: object
    scores: torch.Tensor
    prefill_s: float
    score_s: float


def score_prompt(scorer, model, ids: torch.Tensor, *, record=None, tokenizer=None, reduction="mean",
                 resources=None) -> Scored:
    """Prefill ``ids`` as ``scorer`` needs and score them; timed."""
    device = ids.device
    _sync(device)
    t0 = time.perf_counter()
    ctx = prepare(scorer, model, ids, record=record, tokenizer=tokenizer, reduction=reduction, resources=resources)
    _sync(device)
    t1 = time.perf_counter()
    scores = scorer.score(ctx)
    _sync(device)
    return Scored(ctx=ctx, scores=scores, prefill_s=t1 - t0, score_s=time.perf_counter() - t1)


def answer_with_budget(scorer, scored: Scored, budget, tail: torch.Tensor, max_new_tokens: int, stop_ids):
    """Evict to ``budget``, feed the tail (context mode), decode greedily; returns (tokens, eviction)."""
    state, ev = compress(scorer, scored.scores, scored.ctx.state, budget)
    feed(scored.ctx.model, state, tail)
    tokens, _ = greedy_decode(scored.ctx.model, state, max_new_tokens, stop_ids)
    return tokens, ev


# ------------------------------------------------------------------ the run
@dataclass
class EvalRun:
    """What an evaluation needs loaded: model, tokenizer, targets, adapter and the methods."""

    config: EvalConfig
    model: torch.nn.Module
    tokenizer: object
    reader: object
    fingerprint: dict
    source: str
    methods: dict  # name -> scorer
    resources: dict
    record_indices: list[int]
    budgets: list
    adapter_info: dict | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def reduction(self) -> str:
        return self.reader.manifest.get("settings", {}).get("reduction", "mean")


def check_writable(folder: str | Path) -> Path:
    """Create the results folder and prove it is writable, or fail with one line."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".lkv-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise LkvError(f"results folder {folder} is not writable ({exc.strerror or exc}); choose another --out") from None
    return folder


def setup(config: EvalConfig, loaded=None, adapter=None) -> EvalRun:
    """Validate everything that can be checked before the long work, load what is needed."""
    from .models import load_model, same_model
    from .scorers.lookahead import load_adapter, validation_ids
    from .targets import TargetsReader

    config.validate()
    check_writable(config.out)
    reader = TargetsReader(config.targets)
    if len(reader) == 0:
        raise LkvError(f"{config.targets[0]} holds no records yet; run `lkv collect` first")
    if loaded is None:
        name = config.model or reader.manifest["model"]["source"]
        loaded = load_model(name, device=config.device, dtype=config.dtype, trust_remote_code=config.trust_remote_code)
    if not same_model(loaded.fingerprint, reader.fingerprint):
        raise LkvError(f"the targets in {reader.folders[0]} were collected with another model "
                       f"({reader.manifest['model']['source']}); evaluate with that model")
    wants_adapter = config.adapter is not None or adapter is not None
    names = config.method_names(wants_adapter)
    resources: dict = {}
    adapter_info = None
    if "lookahead" in names:
        if adapter is None:
            if config.adapter is None:
                raise LkvError("method lookahead needs an adapter: pass --adapter RUN_DIR_OR_BUNDLE (or drop it from --methods)")
            adapter, adapter_info = load_adapter(config.adapter, loaded.model, fingerprint=loaded.fingerprint)
        resources["adapter"] = adapter
        wanted = reader.manifest.get("settings", {}).get("reduction", "mean")
        if adapter.config.reduction != wanted:
            raise LkvError(f"the adapter reduces query heads by {adapter.config.reduction!r} but the targets by "
                           f"{wanted!r}; evaluate with targets collected with --reduction {adapter.config.reduction}")
    defaults = {"lookahead": (adapter_info or {}).get("scoring", {})}  # a bundle's own scoring settings
    methods = {name: get_scorer(name, **{**defaults.get(name, {}), **config.scorers.get(name, {})}) for name in names}
    val = validation_ids(config.adapter) if config.adapter else None
    indices = select_records(reader, config.split, val, config.limit)
    budgets = [parse_budget(b) for b in config.budgets]
    run = EvalRun(config=config, model=loaded.model, tokenizer=loaded.tokenizer, reader=reader,
                  fingerprint=loaded.fingerprint, source=loaded.source, methods=methods, resources=resources,
                  record_indices=indices, budgets=budgets, adapter_info=adapter_info)
    _check_budgets(run)
    return run


def _scored_len(run: EvalRun, i: int) -> int:
    meta = run.reader.meta(i)
    if run.config.mode == "whole":
        return meta["prompt_len"]
    return context_split(run.reader[i], run.tokenizer)


def _check_budgets(run: EvalRun) -> None:
    shortest = min(((_scored_len(run, i), run.reader.meta(i)["id"]) for i in run.record_indices), default=None)
    if shortest is None:
        raise LkvError("no records selected; check --limit and --split")
    for b in run.budgets:
        if not isinstance(b, float) and b > shortest[0]:
            part = "prompt" if run.config.mode == "whole" else "context"
            raise LkvError(f"budget {b} is larger than the {part} of record {shortest[1]!r} ({shortest[0]} tokens); "
                           f"use budgets up to {shortest[0]} or a ratio such as 0.1")


def environment() -> dict:
    import transformers

    return {"lkv": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "threads": torch.get_num_threads()}


def evaluate(run: EvalRun, on_event: Callable | None = None) -> dict:
    """Run the selected parts; writes predictions.jsonl as it goes; returns the results dict."""
    from .report import PREDICTIONS, append_jsonl

    emit = on_event or (lambda kind, **info: None)
    config, out = run.config, Path(run.config.out)
    preds_path = out / PREDICTIONS
    preds_path.write_text("")
    results = {
        "format": "lkv-results", "version": 1,
        "meta": {"model": run.source, "fingerprint": run.fingerprint, "targets": [str(f) for f in run.reader.folders],
                 "adapter": run.adapter_info, "mode": config.mode, "records": [run.reader.meta(i)["id"]
                                                                               for i in run.record_indices],
                 "environment": environment(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "methods": list(run.methods), "budgets": [budget_label(b) for b in run.budgets],
        "scorers": {n: s.options() for n, s in run.methods.items()},
    }
    want_pred, want_ans = "prediction" in config.parts, "answers" in config.parts
    if want_pred or want_ans:
        rows = _per_record(run, want_pred, want_ans, emit, lambda row: append_jsonl(preds_path, row))
        if want_pred:
            results["prediction"] = aggregate_prediction(rows, run)
        if want_ans:
            results["answers"] = aggregate_answers(rows, run)
    if "overhead" in config.parts:
        results["overhead"] = measure_overhead(run, emit)
    return results


def _split_ids(run: EvalRun, record) -> tuple[torch.Tensor, torch.Tensor, int]:
    ids = record.prompt_ids[None].to(run.device)
    cut = ids.shape[1] if run.config.mode == "whole" else context_split(record, run.tokenizer)
    return ids[:, :cut], ids[:, cut:], cut


def _per_record(run: EvalRun, want_pred: bool, want_ans: bool, emit, write) -> list[dict]:
    config = run.config
    stop_ids = stop_token_ids(run.model, run.tokenizer)
    rows: list[dict] = []
    emit("start", part="prediction+answers", total=len(run.record_indices) * len(run.methods))
    for i in run.record_indices:
        record = run.reader[i]
        head, tail, cut = _split_ids(run, record)
        target = normalise(record.target[..., :cut])
        limit = config.max_new_tokens or max(1, record.response_ids.numel())
        full_tokens = record.response_ids[:limit].tolist()
        full_text = run.tokenizer.decode(full_tokens, skip_special_tokens=True)
        meta = record.meta
        common = {"id": record.id, "task": meta.get("task"), "metric": meta.get("metric"),
                  "prompt_len": record.prompt_len, "scored_len": cut}
        if want_ans:
            full_row = {**common, "part": "answers", "method": "full", "budget": None, "answer_text": full_text,
                        "score": answer_score(full_text, meta.get("answer"), meta.get("metric"), full_text),
                        "agreement": 1.0, "same_as_full": True}
            rows.append(full_row)
            write(full_row)
        for name, scorer in run.methods.items():
            scored = score_prompt(scorer, run.model, head, record=record, tokenizer=run.tokenizer,
                                  reduction=run.reduction, resources=run.resources)
            sizes = [resolve_budget(b, cut) for b in run.budgets]
            if want_pred:
                m = prediction_metrics(scorer, scored.scores, target, sorted(set(sizes)))
                for b, c in zip(run.budgets, sizes):
                    row = {**common, "part": "prediction", "method": name, "budget": budget_label(b), "entries": c,
                           "kl": m["kl"], **m["budgets"][c]}
                    rows.append(row)
                    write(row)
            if want_ans:
                for b, c in zip(run.budgets, sizes):
                    tokens, ev = answer_with_budget(scorer, scored, c, tail, limit, stop_ids)
                    text = run.tokenizer.decode(tokens, skip_special_tokens=True)
                    row = {**common, "part": "answers", "method": name, "budget": budget_label(b), "entries": c,
                           "answer_text": text, "score": answer_score(text, meta.get("answer"), meta.get("metric"),
                                                                      full_text),
                           "agreement": rouge_l(text, full_text), "same_as_full": tokens == full_tokens,
                           "cache_bytes_before": ev.bytes_before, "cache_bytes_after": ev.bytes_after}
                    rows.append(row)
                    write(row)
            del scored
            emit("advance", info=f"{record.id} {name}")
    return rows


def _mean(values) -> float | None:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return sum(values) / len(values) if values else None


def aggregate_prediction(rows: list[dict], run: EvalRun) -> dict:
    out = {}
    for name in run.methods:
        mine = [r for r in rows if r["part"] == "prediction" and r["method"] == name]
        per_budget = {}
        for label in (budget_label(b) for b in run.budgets):
            sel = [r for r in mine if r["budget"] == label]
            per_budget[label] = {k: _mean(r[k] for r in sel) for k in ("recall", "recall_nosink", "overlap")}
        out[name] = {"kl": _mean(r["kl"] for r in mine), "records": len({r["id"] for r in mine}),
                     "budgets": per_budget}
    return out


def aggregate_answers(rows: list[dict], run: EvalRun) -> dict:
    ans = [r for r in rows if r["part"] == "answers"]
    full = [r for r in ans if r["method"] == "full"]
    out = {"full": {"score": _mean(r["score"] for r in full), "records": len(full)}, "methods": {}, "by_task": {}}
    tasks = sorted({r["task"] or "-" for r in ans})
    for name in run.methods:
        out["methods"][name] = {}
        for label in (budget_label(b) for b in run.budgets):
            sel = [r for r in ans if r["method"] == name and r["budget"] == label]
            out["methods"][name][label] = {
                "score": _mean(r["score"] for r in sel), "agreement": _mean(r["agreement"] for r in sel),
                "same_as_full": _mean(float(r["same_as_full"]) for r in sel),
                "cache_ratio": _mean(r["cache_bytes_after"] / max(1, r["cache_bytes_before"]) for r in sel)}
    for task in tasks:
        mine = [r for r in ans if (r["task"] or "-") == task]
        out["by_task"][task] = {"full": _mean(r["score"] for r in mine if r["method"] == "full")}
        for name in run.methods:
            out["by_task"][task][name] = {label: _mean(r["score"] for r in mine if r["method"] == name
                                                       and r["budget"] == label)
                                          for label in (budget_label(b) for b in run.budgets)}
    return out


# ------------------------------------------------------------------ overhead
def time_method(scorer, model, head: torch.Tensor, tail: torch.Tensor, budget: int, *, record=None, tokenizer=None,
                reduction="mean", resources=None) -> dict:
    """One timed run: prefill (+capture), score, evict, feed the tail, first token. ``scorer=None`` is plain prefill."""
    device = head.device
    with PeakMemory(device) as mem:
        _sync(device)
        t0 = time.perf_counter()
        if scorer is None:
            state = prefill(model, head)
            t_prefill = time.perf_counter() - t0
            t_score = t_evict = 0.0
            before = after = cache_bytes(state.cache)
        else:
            scored = score_prompt(scorer, model, head, record=record, tokenizer=tokenizer, reduction=reduction,
                                  resources=resources)
            t_prefill, t_score = scored.prefill_s, scored.score_s
            t1 = time.perf_counter()
            state, ev = compress(scorer, scored.scores, scored.ctx.state, budget)
            _sync(device)
            t_evict = time.perf_counter() - t1
            before, after = ev.bytes_before, ev.bytes_after
        feed(model, state, tail)
        int(state.logits[0].argmax())
        _sync(device)
        ttft = time.perf_counter() - t0
    return {"prefill_s": t_prefill, "score_s": t_score, "evict_s": t_evict, "ttft_s": ttft,
            "cache_bytes_before": before, "cache_bytes_after": after, "peak_mb": mem.peak_mb}


def overhead_table(samples: dict[str, list[dict]]) -> dict:
    """Medians per method and overhead relative to plain prefill (``samples["plain"]``)."""
    def med(rows, key):
        values = [r[key] for r in rows if r.get(key) is not None]
        return statistics.median(values) if values else None

    plain_ttft = med(samples["plain"], "ttft_s")
    plain_prefill = med(samples["plain"], "prefill_s")
    out = {}
    for name, rows in samples.items():
        entry = {k: med(rows, k) for k in ("prefill_s", "score_s", "evict_s", "ttft_s", "cache_bytes_before",
                                           "cache_bytes_after", "peak_mb")}
        extra = entry["prefill_s"] - plain_prefill + entry["score_s"] + entry["evict_s"]
        entry["scoring_s"] = extra  # everything the method adds before the first token
        entry["overhead_pct"] = 100.0 * (entry["ttft_s"] - plain_ttft) / plain_ttft if plain_ttft else None
        entry["scoring_pct"] = 100.0 * extra / plain_prefill if plain_prefill else None
        entry["repeats"] = len(rows)
        out[name] = entry
    return out


def measure_overhead(run: EvalRun, emit=lambda *a, **k: None) -> dict:
    """Interleaved, repeated timings on the first ``overhead_prompts`` held-out prompts; medians."""
    config = run.config
    indices = run.record_indices[: config.overhead_prompts]
    records = [run.reader[i] for i in indices]
    names = ["plain", *run.methods]
    rng = random.Random(config.seed)
    samples: dict[str, list[dict]] = {n: [] for n in names}
    emit("start", part="overhead", total=config.overhead_repeats * len(records) * len(names))
    budget = run.budgets[0]
    for record in records:  # one warm-up run of each method (first-call costs, lazy loads)
        head, tail, cut = _split_ids(run, record)
        for name in names:
            _time_one(run, name, record, head, tail, resolve_budget(budget, cut))
    for _ in range(config.overhead_repeats):
        for record in records:
            head, tail, cut = _split_ids(run, record)
            order = names[:]
            rng.shuffle(order)
            for name in order:
                samples[name].append(_time_one(run, name, record, head, tail, resolve_budget(budget, cut)))
                emit("advance", info=f"overhead {name}")
    table = overhead_table(samples)
    return {"budget": budget_label(budget), "prompts": [r.id for r in records],
            "prompt_tokens": [r.prompt_len for r in records], "repeats": config.overhead_repeats, "methods": table}


def _time_one(run: EvalRun, name: str, record, head, tail, budget: int) -> dict:
    scorer = None if name == "plain" else run.methods[name]
    return time_method(scorer, run.model, head, tail, budget, record=record, tokenizer=run.tokenizer,
                       reduction=run.reduction, resources=run.resources)


def config_dict(config: EvalConfig) -> dict:
    return asdict(config)
