"""`lkv eval`'s engine against the one-method-at-a-time path it replaced, side by side in one run.

On the same records, both paths compute the prediction and answers parts for every method and
budget. Per record they run back to back (the reference first, then the engine), so drift of
a shared machine hits both alike. The reference prefills the prompt once per method and decodes
each (method, budget) alone; the engine prefills once per record, scores every method from
that state and decodes every variant of one cache shape as one batch
(:mod:`lkvcli.evaluate.engine`). Prints the speed-up and whether every row agrees:
prediction rows must be equal, answers identical token for token or a near-tie flip (the
reference's greedy margin <= 1e-4 at some step), counted.

    python benchmarks/bench_eval.py                      # SmolLM2, 8 built-in records of 1.5-2K tokens
    python benchmarks/bench_eval.py --records 2 --budgets 64,128 --out runs/bench

Targets are collected into OUT/eval-targets-* on the first run (resumable). The lookahead
adapter is untrained unless --adapter is given (its cost does not depend on training).
Writes OUT/bench_eval.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

METHODS = "lookahead,snapkv,pyramidkv,tova,streamingllm,oracle,draft"
NUMERIC = ("kl", "recall", "recall_nosink", "overlap", "score", "agreement")


def collect_targets(args, folder: Path) -> None:
    data = f"builtin:n={args.records},min_tokens={args.min_tokens},max_tokens={args.max_tokens},seed=0"
    subprocess.run([sys.executable, "-m", "lkvcli", "collect", "--model", args.model, "--data", data, "--out",
                    str(folder), "--max-new-tokens", str(args.collect_tokens)], check=True)


def compare(reference: list[dict], engine: list[dict]) -> dict:
    """Rows keyed by (record, method, budget, part): equal, or how they differ."""
    key = lambda r: (r["id"], r["method"], r["budget"], r["part"])  # noqa: E731
    ref, new = {key(r): r for r in reference}, {key(r): r for r in engine}
    out = {"rows": len(ref), "missing": sorted(map(str, set(ref) ^ set(new))), "max_metric_diff": 0.0,
           "answers": 0, "answers_identical": 0, "answers_differ": [], "near_tie_flips": 0}
    for k, a in ref.items():
        b = new.get(k)
        if b is None:
            continue
        for field in NUMERIC:
            if a.get(field) is not None and b.get(field) is not None:
                out["max_metric_diff"] = max(out["max_metric_diff"], abs(a[field] - b[field]))
        if a["part"] == "answers" and a["method"] != "full":
            out["answers"] += 1
            if a["answer_text"] == b["answer_text"]:
                out["answers_identical"] += 1
            else:
                tie = a.get("margin_min") is not None and a["margin_min"] <= 1e-4
                out["near_tie_flips"] += tie
                out["answers_differ"].append({"row": list(map(str, k)), "reference_margin_min": a.get("margin_min"),
                                              "engine_margin_min": b.get("margin_min"), "near_tie": tie})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--records", type=int, default=8)
    parser.add_argument("--min-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--collect-tokens", type=int, default=48, help="response length collected")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="answer length evaluated (the demo's)")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--budgets", default="64,128,256,512")
    parser.add_argument("--adapter", default=None, help="run folder or bundle (default: an untrained adapter)")
    parser.add_argument("--lookahead-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--targets", default=None, help="targets folder (default: OUT/eval-targets, collected)")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from lkvcli.evaluate import EvalConfig, evaluate_record, evaluate_record_sequential, setup
    from lkvcli.evaluate.engine import Timings
    from lkvcli.evaluate.journal import Journal
    from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig
    from lkvcli.models import load_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    default = out / f"eval-targets-{args.records}x{args.min_tokens}-{args.max_tokens}-{args.collect_tokens}"
    targets = Path(args.targets) if args.targets else default
    if not args.targets:
        collect_targets(args, targets)
    loaded = load_model(args.model, device="cpu")
    adapter = None if args.adapter else LookaheadAdapter.attach(loaded.model, LookaheadConfig(
        num_tokens=args.lookahead_tokens))
    scratch = Path(tempfile.mkdtemp(prefix="bench-eval-"))
    config = EvalConfig(targets=[str(targets)], adapter=args.adapter, methods=args.methods.split(","),
                        budgets=args.budgets.split(","), parts=["prediction", "answers"], out=str(scratch),
                        split="all", limit=args.records, max_new_tokens=args.max_new_tokens, device="cpu")
    run = setup(config, loaded=loaded, adapter=adapter)
    journal = Journal(scratch, run.settings())
    reference, seconds = [], {"reference": 0.0, "engine": 0.0}
    per_record = []
    for n, i in enumerate(run.record_indices, 1):
        record = run.reader[i]
        t0 = time.perf_counter()
        reference += evaluate_record_sequential(run, record)
        t1 = time.perf_counter()
        evaluate_record(run, record, journal, True, True, Timings())
        t2 = time.perf_counter()
        seconds["reference"] += t1 - t0
        seconds["engine"] += t2 - t1
        per_record.append({"id": record.id, "prompt_len": record.prompt_len, "reference_s": t1 - t0,
                           "engine_s": t2 - t1})
        print(f"record {n}/{len(run.record_indices)} ({record.prompt_len} tokens): reference {t1 - t0:.1f} s, "
              f"engine {t2 - t1:.1f} s", flush=True)
    check = compare(reference, journal.rows)
    speedup = seconds["reference"] / seconds["engine"]
    result = {"model": args.model, "records": len(run.record_indices), "methods": list(run.methods),
              "budgets": config.budgets, "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
              "seconds": seconds, "speedup": speedup, "per_record": per_record, "check": check,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "bench_eval.json").write_text(json.dumps(result, indent=2) + "\n")
    lengths = [r["prompt_len"] for r in per_record]
    print(f"\n{len(lengths)} records of {min(lengths)}-{max(lengths)} tokens, {len(run.methods)} methods x "
          f"{len(config.budgets)} budgets, prediction + answers ({args.max_new_tokens} tokens), "
          f"{torch.get_num_threads()} thread(s)")
    print("| path | seconds | s / record | speed-up |\n|---|---|---|---|")
    for name in ("reference", "engine"):
        print(f"| {name} | {seconds[name]:.1f} | {seconds[name] / len(lengths):.1f} | "
              f"{seconds['reference'] / seconds[name]:.2f}x |")
    print(f"rows compared: {check['rows']}, missing on either side: {len(check['missing'])}, largest metric "
          f"difference: {check['max_metric_diff']:.2e}; answers identical: {check['answers_identical']}/"
          f"{check['answers']}, differing: {len(check['answers_differ'])} (near-tie flips: {check['near_tie_flips']})")
    print(f"wrote {out / 'bench_eval.json'}")


if __name__ == "__main__":
    main()
