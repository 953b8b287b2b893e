"""An evaluation run: load and check everything up front (:func:`setup`), then compute the rows
missing from the results folder's journal and aggregate them (:func:`evaluate`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..adapters import load_adapter, validation_ids
from ..environment import environment
from ..errors import LkvError
from ..evict import parse_budget
from ..generate import stop_token_ids
from ..locks import folder_lock
from ..preempt import StopRequest
from ..models import load_model, same_model
from ..progress import Event, Listener, ignore
from ..scorers import get_scorer
from ..targets import TargetsReader
from .aggregate import (
    aggregate_answers,
    aggregate_prediction,
    labels_of,
    selected_rows,
    throughput,
)
from .config import EvalConfig
from .engine import Timings, evaluate_record
from .journal import Journal
from .overhead import measure_overhead
from .records import context_split, select_records


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

    @property
    def stop_ids(self) -> set[int]:
        return stop_token_ids(self.model, self.tokenizer)

    def settings(self) -> dict:
        """What decides the rows' values (a resumed run must match it; see :mod:`.journal`)."""
        adapter = self.adapter_info or {}
        return {"model": self.fingerprint, "targets": [str(Path(f).resolve()) for f in self.reader.folders],
                "adapter": {k: adapter.get(k) for k in ("path", "step")} if adapter else None,
                "mode": self.config.mode, "max_new_tokens": self.config.max_new_tokens,
                "dtype": str(next(self.model.parameters()).dtype), "device": self.device.type,
                "reduction": self.reduction, "scorers": {n: s.options() for n, s in self.methods.items()}}


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
    config.check_data()
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


def evaluate(run: EvalRun, on_event: Listener | None = None) -> dict:
    """Compute the rows missing from ``OUT/predictions.jsonl`` (durable as they come), then aggregate
    every selected row; returns the results dict. Interrupted at any moment, the same call resumes."""
    # one writer per results folder; SIGTERM / SIGUSR1 stop after the record (or part step) under way
    with folder_lock(run.config.out, "lkv eval"), StopRequest() as stop:
        return _evaluate(run, on_event or ignore, stop)


def _evaluate(run: EvalRun, emit: Listener, stop: StopRequest) -> dict:
    config, t0 = run.config, time.perf_counter()
    journal = Journal(config.out, run.settings(), overwrite=config.overwrite)
    ids = [run.reader.meta(i)["id"] for i in run.record_indices]
    labels = labels_of(run.budgets)
    results = {
        "format": "lkv-results", "version": 1,
        "meta": {"model": run.source, "fingerprint": run.fingerprint, "targets": [str(f) for f in run.reader.folders],
                 "adapter": run.adapter_info, "mode": config.mode, "records": ids, "environment": environment(),
                 "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "resumed_rows": journal.resumed},
        "methods": list(run.methods), "budgets": labels,
        "scorers": {n: s.options() for n, s in run.methods.items()},
    }
    want_pred, want_ans = "prediction" in config.parts, "answers" in config.parts
    timings = Timings()
    if want_pred or want_ans:
        phase, total = "prediction+answers", len(run.record_indices)
        emit(Event("start", phase, 0, total, f"{total} records"))
        for done, (i, rid) in enumerate(zip(run.record_indices, ids), 1):
            stop.check()
            added = evaluate_record(run, run.reader[i], journal, want_pred, want_ans, timings)
            emit(Event("advance", phase, done, total, f"{rid}: {added} rows" if added else f"{rid}: done before"))
        rows = selected_rows(journal.rows, ids, list(run.methods), labels)
        if want_pred:
            results["prediction"] = aggregate_prediction(rows, list(run.methods), labels)
        if want_ans:
            results["answers"] = aggregate_answers(rows, list(run.methods), labels)
    overhead_s = None
    if "overhead" in config.parts:
        key = ("*", "*", labels[0], "overhead")
        done = [r for r in journal.rows if (r["id"], r["method"], r["budget"], r["part"]) == key]
        t1 = time.perf_counter()
        if done:
            results["overhead"] = done[0]["overhead"]
        else:
            results["overhead"] = measure_overhead(run, emit)
            journal.write({"id": "*", "method": "*", "budget": labels[0], "part": "overhead",
                           "overhead": results["overhead"]})
            overhead_s = time.perf_counter() - t1
    results["throughput"] = throughput(timings.as_dict(), len(ids), time.perf_counter() - t0, config.parts,
                                       overhead_s)
    return results
