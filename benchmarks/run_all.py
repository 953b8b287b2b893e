"""Every benchmark in one run (what `make bench` runs): eviction overhead, capture cost, train step,
and the eval engine against the one-method-at-a-time path.

Runs the four scripts beside this one, each in its own process and each measuring its
variants side by side (interleaved repeats, medians), then writes one summary:

    OUT/summary.json   the machine, the command lines and every script's results
    OUT/summary.md     one Markdown table of ratios per prompt length

    python benchmarks/run_all.py                         # SmolLM2-135M, 1K/2K/4K, 3 repeats
    python benchmarks/run_all.py --lengths 1024 --repeats 2 --out runs/bench   # a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_EXTRA_WORK = ("random", "streamingllm", "knorm")  # plain prefill + a few ms: their spread is the noise


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: int) -> dict:
    import torch
    import transformers

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch_threads": threads or torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def run_script(name: str, args: list[str]) -> float:
    """Run benchmarks/NAME with ARGS, streaming its output; seconds it took."""
    command = [sys.executable, str(HERE / name), *args]
    print(f"$ {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def pct(value) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def summary_table(overhead: dict, capture: dict, train_step: dict, lengths: list[int]) -> str:
    """One row per measurement, one column per prompt length."""
    by_len = {int(k): v for k, v in overhead["lengths"].items()}
    cols = sorted(by_len) or lengths

    def row(label, cells):
        return f"| {label} | " + " | ".join(cells) + " |"

    lines = [row("measurement", [f"{n} tokens" for n in cols]), "|---|" + "---|" * len(cols)]
    lines.append(row("plain prefill + first token (s)", [f"{by_len[n]['plain']['ttft_s']:.3f}" for n in cols]))
    methods = sorted({m for t in by_len.values() for m in t if m != "plain"},
                     key=lambda m: by_len[cols[0]].get(m, {}).get("overhead_pct") or 0)
    for method in methods:
        lines.append(row(f"{method}: time to first token vs plain",
                         [pct(by_len[n].get(method, {}).get("overhead_pct")) for n in cols]))

    def noise(n):
        values = [by_len[n][m]["overhead_pct"] for m in NO_EXTRA_WORK if m in by_len[n]]
        return f"{min(values):+.1f}% .. {max(values):+.1f}%" if values else "n/a"

    lines.append(row(f"noise: {', '.join(NO_EXTRA_WORK)} (ms of extra work) vs plain", [noise(n) for n in cols]))
    for method in ("lookahead", "draft"):  # their scoring pass runs after prefill and is timed on its own
        cells = [f"{by_len[n][method]['score_s']:.3f} s ({100 * by_len[n][method]['score_s'] / by_len[n]['plain']['prefill_s']:.1f}%)"
                 if method in by_len[n] else "n/a" for n in cols]
        lines.append(row(f"{method}: scoring pass after prefill (% of plain prefill)", cells))
    # the capture prompt is cut at a line of real text: 1008 tokens stand for 1024
    cap = {n: r for n in cols for r in capture["rows"] if abs(r["prompt_tokens"] - n) <= 0.05 * n}
    lines.append(row("ground-truth capture: generate + capture vs generate",
                     [pct(100 * cap[n]["capture_overhead"]) if n in cap else "n/a" for n in cols]))
    lines.append(row("ground-truth capture: peak RSS GB (capture / plain)",
                     [f"{cap[n]['capture_peak_gb']:.2f} / {cap[n]['generate_peak_gb']:.2f}" if n in cap else "n/a"
                      for n in cols]))
    steps = {(r["prompt_len"], r["step"]): r for r in train_step["rows"]}

    def step_cell(n, fmt):
        cached, naive = steps.get((n, "cached")), steps.get((n, "naive"))
        return fmt(cached, naive) if cached and naive else "n/a"

    lines.append(row("train step s (cached / naive)",
                     [step_cell(n, lambda c, v: f"{c['median_s']:.2f} / {v['median_s']:.2f}") for n in cols]))
    lines.append(row("train step: naive / cached time",
                     [step_cell(n, lambda c, v: f"{v['median_s'] / c['median_s']:.1f}x") for n in cols]))
    lines.append(row("train step memory GB (cached / naive)",
                     [step_cell(n, lambda c, v: f"{c['step_mem_gb']:.2f} / {v['step_mem_gb']:.2f}") for n in cols]))
    return "\n".join(lines)


def eval_line(bench: dict) -> str:
    """bench_eval.py's result in one sentence: speed-up and whether the answers agree."""
    check = bench["check"]
    return (f"lkv eval engine vs one method at a time ({bench['records']} records, {len(bench['methods'])} methods x "
            f"{len(bench['budgets'])} budgets, prediction + answers): {bench['seconds']['reference']:.0f} s -> "
            f"{bench['seconds']['engine']:.0f} s, **{bench['speedup']:.2f}x**; answers identical "
            f"{check['answers_identical']}/{check['answers']} (near-tie flips {check['near_tie_flips']}), largest "
            f"metric difference {check['max_metric_diff']:.1e}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--eval-records", type=int, default=8, help="built-in records of bench_eval.py")
    parser.add_argument("--eval-tokens", default="1500,2000", help="their prompt length range, MIN,MAX")
    parser.add_argument("--eval-budgets", default="64,128,256,512")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--summarize-only", action="store_true",
                        help="rewrite the summary from the results already in OUT, running nothing")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    common = ["--model", args.model, "--repeats", str(args.repeats)]
    threads = ["--threads", str(args.threads)] if args.threads else []
    lengths = [str(n) for n in args.lengths]
    jobs = {
        "overhead": ("bench_overhead.py", [*common, *threads, "--lengths", ",".join(lengths), "--out", str(out)],
                     out / "overhead.json"),
        "capture": ("bench_collect.py", [*common, *threads, "--lengths", *lengths, "--out", str(out / "capture")],
                    out / "capture.json"),
        "train_step": ("bench_train_step.py", [*common, *threads, "--lengths", *lengths,
                                               "--out", str(out / "train_step.json")], out / "train_step.json"),
        "eval": ("bench_eval.py", ["--model", args.model, *threads, "--records", str(args.eval_records),
                                   "--min-tokens", args.eval_tokens.split(",")[0],
                                   "--max-tokens", args.eval_tokens.split(",")[1], "--budgets", args.eval_budgets,
                                   "--out", str(out)], out / "bench_eval.json"),
    }
    # --summarize-only keeps the machine, timings and date of the run that produced the results
    previous = (json.loads((out / "summary.json").read_text())
                if args.summarize_only and (out / "summary.json").is_file() else {})
    results, seconds = {}, dict(previous.get("seconds", {}))
    for key, (script, script_args, result_path) in jobs.items():
        if not args.summarize_only:
            seconds[key] = round(run_script(script, script_args), 1)
        results[key] = json.loads(result_path.read_text())
    info = previous.get("machine") or machine(args.threads)
    table = summary_table(results["overhead"], results["capture"], results["train_step"], args.lengths)
    table += "\n\n" + eval_line(results["eval"])
    summary = {"machine": info, "model": args.model, "repeats": args.repeats, "seconds": seconds,
               "created": previous.get("created") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **results}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    where = info["gpu"] or f"{info['cpu']}, {info['cores']} cores, {info['torch_threads']} torch threads"
    header = (f"# lkv benchmarks: {args.model}\n\n{where}; torch {info['torch']}, transformers "
              f"{info['transformers']}; medians of {args.repeats} interleaved repeats; {summary['created']}. "
              f"Overhead at budget {results['overhead']['budget']} with an untrained "
              f"{results['overhead']['lookahead_tokens']}-token adapter (timing does not depend on training); "
              f"capture with {results['capture']['rows'][0]['new_tokens']} generated tokens.\n\n")
    (out / "summary.md").write_text(header + table + "\n")
    print("\n" + header + table)
    print(f"\nwrote {out / 'summary.json'} and {out / 'summary.md'}")


if __name__ == "__main__":
    main()
