"""The per-record engine of ``lkv eval``: one prefill shared by every method, every method scored
from it, and every (method, budget) answer decoded in batches of equal cache shape.

For one record:

1. **Plan** from the journal: the prediction rows still missing, and the answer batches still
   missing. Every (method, budget) variant of the record decodes in one batch (chunks of
   ``decode_batch``); a batch with any row missing is decoded whole, so its composition, and
   with it every float, is the same whether the run was interrupted or not.
2. **One prefill** with every capture the selected scorers need active at once
   (:func:`lkvcli.scorers.base.prepare_shared`); the lookahead and draft passes run over the
   shared cache and leave it as they found it.
3. **Score** each method, write its prediction rows.
4. **Answer**: per batch, evict each member, stack the caches (rows holding fewer entries, in
   any layer, are padded and masked: :func:`lkvcli.generate.stack_states`), feed the tail
   (``context`` mode) and decode greedily (:func:`lkvcli.generate.decode_batch`, greedy by default).

:func:`evaluate_record_sequential` is the one-method-at-a-time reference the engine replaced
(its own prefill per method, one decode per budget); tests and ``benchmarks/bench_eval.py``
compare the two.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field, fields

import torch

from ..attention import normalise
from ..evict import budget_label, compress, feed, full_attention_layers, resolve_budget
from ..generate import decode_batch, stack_states
from ..scorers import prepare
from ..scorers.base import ScoreContext, prepare_shared
from ..targets import copied_runs
from .metrics import answer_score, prediction_metrics, rouge_l
from .records import split_ids


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@dataclass
class Timings:
    """Seconds spent per kind of work (summed over the records computed in this run)."""

    prefill_s: float = 0.0
    score_s: float = 0.0
    metrics_s: float = 0.0
    decode_s: float = 0.0
    records: int = 0
    by_method: dict = field(default_factory=lambda: defaultdict(float))  # scoring seconds per method

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "by_method"}
        return {**out, "score_s_by_method": dict(self.by_method)}


@contextmanager
def timed(timings: Timings, name: str, device: torch.device, method: str | None = None):
    """Add the block's wall time (device-synchronised) to ``timings.<name>`` (and to ``method``'s)."""
    sync(device)
    t0 = time.perf_counter()
    yield
    sync(device)
    dt = time.perf_counter() - t0
    setattr(timings, name, getattr(timings, name) + dt)
    if method is not None:
        timings.by_method[method] += dt


@dataclass
class RecordJob:
    """One record as the engine sees it: the prompt split, the answer length and the row stub."""

    record: object
    head: torch.Tensor
    tail: torch.Tensor
    cut: int
    sizes: dict  # budget label -> entries per head for this record
    limit: int
    full_tokens: list
    full_text: str
    common: dict
    critical: list | None = None  # critical spans [start, end) clipped to the scored part
    copied: list | None = None    # without critical spans: the prompt ranges the response copies

    @classmethod
    def build(cls, run, record) -> RecordJob:
        head, tail, cut = split_ids(record, run.config.mode, run.tokenizer, run.device)
        limit = run.config.max_new_tokens or max(1, record.response_ids.numel())
        full_tokens = record.response_ids[:limit].tolist()
        meta = record.meta
        common = {"id": record.id, "task": meta.get("task"), "metric": meta.get("metric"),
                  "prompt_len": record.prompt_len, "scored_len": cut}
        spans = [(s, min(e, cut)) for s, e in (f["span"] for f in meta.get("critical_spans") or []) if s < cut]
        copied = None if spans else [(s, min(e, cut)) for s, e in copied_runs(
            record.prompt_ids.tolist(), record.response_ids.tolist()) if s < cut]
        return cls(record=record, head=head, tail=tail, cut=cut,
                   sizes={budget_label(b): resolve_budget(b, cut) for b in run.budgets}, limit=limit,
                   full_tokens=full_tokens, full_text=run.tokenizer.decode(full_tokens, skip_special_tokens=True),
                   common=common, critical=spans or None, copied=copied or None)

    def target(self) -> torch.Tensor:
        return normalise(self.record.target[..., : self.cut])

    def full_row(self) -> dict:
        meta = self.record.meta
        return {**self.common, "part": "answers", "method": "full", "budget": None, "answer_text": self.full_text,
                "score": answer_score(self.full_text, meta.get("answer"), meta.get("metric"), self.full_text),
                "agreement": 1.0, "same_as_full": True}

    def prediction_rows(self, name: str, scorer, scores: torch.Tensor, labels: list[str], state) -> list[dict]:
        m = prediction_metrics(scorer, scores, self.target(), sorted({self.sizes[b] for b in labels}),
                               pooled_layers=full_attention_layers(state.cache), critical=self.critical,
                               copied=self.copied)
        return [{**self.common, "part": "prediction", "method": name, "budget": b, "entries": self.sizes[b],
                 "kl": m["kl"], **m["budgets"][self.sizes[b]]} for b in labels]

    def answer_row(self, tokenizer, name: str, label: str, decoded, eviction) -> dict:
        meta = self.record.meta
        text = tokenizer.decode(decoded.tokens, skip_special_tokens=True)
        return {**self.common, "part": "answers", "method": name, "budget": label, "entries": self.sizes[label],
                "answer_text": text, "score": answer_score(text, meta.get("answer"), meta.get("metric"), self.full_text),
                "agreement": rouge_l(text, self.full_text), "same_as_full": decoded.tokens == self.full_tokens,
                "margin_min": min(decoded.margins, default=None),
                "cache_bytes_before": eviction.bytes_before, "cache_bytes_after": eviction.bytes_after,
                "padding_bytes": eviction.padding_bytes}


def answer_batches(run, job: RecordJob) -> list[list[tuple[str, str]]]:
    """The ``(method, budget label)`` variants of a record in batches of at most ``decode_batch``, in a
    fixed order, so a resumed run decodes exactly the batches of an uninterrupted one. On a CPU a
    row costs a few percent of a batch-1 step, so one batch of every variant beats one per budget
    despite padding the smaller caches."""
    variants = [(name, label) for label in job.sizes for name in run.methods]
    size = run.config.decode_batch
    return [variants[i : i + size] for i in range(0, len(variants), size)]


def answer_batch(run, job: RecordJob, state, members: list[tuple[str, str, object, torch.Tensor]]) -> list[dict]:
    """Evict the shared prefill ``state`` once per member ``(method, budget, scorer, scores)``, decode
    all of them as one batch (caches of different sizes padded and masked); rows in member order."""
    evicted = [compress(scorer, scores, state, job.sizes[label]) for _, label, scorer, scores in members]
    batch = stack_states([s for s, _ in evicted])
    feed(run.model, batch, job.tail.expand(len(members), -1))
    decoded = decode_batch(run.model, batch, job.limit, run.stop_ids)
    return [job.answer_row(run.tokenizer, name, label, d, ev)
            for (name, label, _, _), (_, ev), d in zip(members, evicted, decoded)]


def evaluate_record(run, record, journal, want_pred: bool, want_ans: bool, timings: Timings) -> int:
    """Compute the rows of ``record`` missing from ``journal`` (written as they come); returns how many."""
    job = RecordJob.build(run, record)
    rid, written = job.common["id"], len(journal.rows)
    if want_ans:
        journal.write(job.full_row())
    pred_todo = {name: [b for b in job.sizes if not journal.has(rid, name, b, "prediction")]
                 for name in run.methods} if want_pred else {}
    batches = [batch for batch in answer_batches(run, job)
               if any(not journal.has(rid, n, b, "answers") for n, b in batch)] if want_ans else []
    needed = [n for n in run.methods if pred_todo.get(n) or any(n == m for batch in batches for m, _ in batch)]
    if not needed:
        return len(journal.rows) - written
    with timed(timings, "prefill_s", run.device):
        base = ScoreContext(model=run.model, input_ids=job.head, record=record, tokenizer=run.tokenizer,
                            reduction=run.reduction, resources=run.resources)
        contexts = prepare_shared({n: run.methods[n] for n in needed}, base)
    scores = {}
    for name in needed:
        with timed(timings, "score_s", run.device, method=name):
            scores[name] = run.methods[name].score(contexts[name])
    with timed(timings, "metrics_s", run.device):
        for name, labels in pred_todo.items():
            for row in job.prediction_rows(name, run.methods[name], scores[name], labels, contexts[name].state) \
                    if labels else []:
                journal.write(row)
    state = contexts[needed[0]].state
    with timed(timings, "decode_s", run.device):
        for batch in batches:
            for row in answer_batch(run, job, state, [(n, b, run.methods[n], scores[n]) for n, b in batch]):
                journal.write(row)
    timings.records += 1
    return len(journal.rows) - written


# ------------------------------------------------------------------ the reference path
@dataclass
class Scored:
    ctx: object
    scores: torch.Tensor
    prefill_s: float
    score_s: float


def score_prompt(scorer, model, ids: torch.Tensor, *, record=None, tokenizer=None, reduction="mean",
                 resources=None) -> Scored:
    """Prefill ``ids`` as ``scorer`` alone needs and score them; timed."""
    device = ids.device
    sync(device)
    t0 = time.perf_counter()
    ctx = prepare(scorer, model, ids, record=record, tokenizer=tokenizer, reduction=reduction, resources=resources)
    sync(device)
    t1 = time.perf_counter()
    scores = scorer.score(ctx)
    sync(device)
    return Scored(ctx=ctx, scores=scores, prefill_s=t1 - t0, score_s=time.perf_counter() - t1)


def evaluate_record_sequential(run, record, want_pred: bool = True, want_ans: bool = True) -> list[dict]:
    """The rows of ``record`` the one-method-at-a-time way: a prefill per method, a decode per budget."""
    job = RecordJob.build(run, record)
    rows = [job.full_row()] if want_ans else []
    for name, scorer in run.methods.items():
        scored = score_prompt(scorer, run.model, job.head, record=record, tokenizer=run.tokenizer,
                              reduction=run.reduction, resources=run.resources)
        if want_pred:
            rows += job.prediction_rows(name, scorer, scored.scores, list(job.sizes), scored.ctx.state)
        for label in job.sizes if want_ans else []:
            rows += answer_batch(run, job, scored.ctx.state, [(name, label, scorer, scored.scores)])
    return rows
