"""The overhead part of ``lkv eval``: per method, the time of prefill, scoring and eviction and the
time to first token, against plain prefill on the same prompts in the same run; methods
interleaved in a seeded shuffled order per repeat; medians. Peak memory above the start of each
run (CUDA allocator, or the process's peak RSS on CPU) and cache bytes before/after."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import torch

from ..evict import budget_label, cache_bytes, compress, feed, resolve_budget
from ..generate import prefill
from ..progress import Event, Listener, ignore
from .engine import score_prompt, sync
from .records import split_ids


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


def time_method(scorer, model, head: torch.Tensor, tail: torch.Tensor, budget: int, *, record=None, tokenizer=None,
                reduction="mean", resources=None) -> dict:
    """One timed run: prefill (+capture), score, evict, feed the tail, first token. ``scorer=None`` is plain prefill."""
    device = head.device
    with PeakMemory(device) as mem:
        sync(device)
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
            sync(device)
            t_evict = time.perf_counter() - t1
            before, after = ev.bytes_before, ev.bytes_after
        feed(model, state, tail)
        int(state.logits[0].argmax())
        sync(device)
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


def measure_overhead(run, emit: Listener = ignore) -> dict:
    """Interleaved, repeated timings on the first ``overhead_prompts`` held-out prompts; medians."""
    config = run.config
    records = [run.reader[i] for i in run.record_indices[: config.overhead_prompts]]
    names = ["plain", *run.methods]
    rng = random.Random(config.seed)
    samples: dict[str, list[dict]] = {n: [] for n in names}
    total, done = config.overhead_repeats * len(records) * len(names), 0
    emit(Event("start", "overhead", 0, total, f"{total} timed runs"))
    budget = run.budgets[0]
    for record in records:  # one warm-up run of each method (first-call costs, lazy loads)
        for name in names:
            _time_one(run, name, record, budget)
    for _ in range(config.overhead_repeats):
        for record in records:
            order = names[:]
            rng.shuffle(order)
            for name in order:
                samples[name].append(_time_one(run, name, record, budget))
                done += 1
                emit(Event("advance", "overhead", done, total, name))
    return {"budget": budget_label(budget), "prompts": [r.id for r in records],
            "prompt_tokens": [r.prompt_len for r in records], "repeats": config.overhead_repeats,
            "methods": overhead_table(samples)}


def _time_one(run, name: str, record, budget) -> dict:
    head, tail, cut = split_ids(record, run.config.mode, run.tokenizer, run.device)
    scorer = None if name == "plain" else run.methods[name]
    return time_method(scorer, run.model, head, tail, resolve_budget(budget, cut), record=record,
                       tokenizer=run.tokenizer, reduction=run.reduction, resources=run.resources)
