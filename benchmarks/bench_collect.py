"""Cost of ground-truth capture: generation alone vs generation + capture, side by side.

For each prompt length, runs (in fresh subprocesses, so that peak memory is per run) the
same prompt through prefill + greedy decoding with and without the attention capture,
interleaved, and reports medians and ratios. Writes JSON and Markdown.

    python benchmarks/bench_collect.py --lengths 1024 2048 4096 --new-tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def one_run(model_name: str, length: int, new_tokens: int, capture: bool, threads: int, device: str) -> dict:
    import torch

    if threads:
        torch.set_num_threads(threads)

    from lkvcli.collect import ground_truth
    from lkvcli.generate import greedy_decode, prefill
    from lkvcli.models import load_model

    loaded = load_model(model_name, device=device, dtype="auto")
    model, tok = loaded.model, loaded.tokenizer
    from lkvcli.prompts import load_prompts

    text = load_prompts(f"builtin:n=1,min_tokens={length},max_tokens={length},tasks=summarise", tokenizer=tok)[0]
    ids = tok(text.messages[0]["content"], add_special_tokens=False).input_ids[:length]
    prompt = torch.tensor([ids], device=loaded.model.device)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if capture:
        tokens, target, _ = ground_truth(model, prompt, new_tokens, stop_ids=set())
    else:
        with torch.inference_mode():
            tokens, _ = greedy_decode(model, prefill(model, prompt), new_tokens, stop_ids=set())
    if prompt.is_cuda:  # peak GPU memory instead of the process's resident memory
        torch.cuda.synchronize()
        base_rss, peak = 0, torch.cuda.max_memory_allocated() / 2**10
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "peak_rss_gb": peak / 2**20, "rss_before_gb": base_rss / 2**20,
            "tokens": len(tokens), "length": len(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda (on CUDA, memory is peak GPU memory)")
    parser.add_argument("--out", default="benchmarks/results/collect", help="writes OUT.json and OUT.md")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        length, capture = int(args._child[0]), args._child[1] == "1"
        print(json.dumps(one_run(args.model, length, args.new_tokens, capture, args.threads, args.device)))
        return

    runs: dict = {}
    for length in args.lengths:
        for rep in range(args.repeats):
            for capture in (False, True):  # interleaved
                cmd = [sys.executable, __file__, "--model", args.model, "--new-tokens", str(args.new_tokens),
                       "--threads", str(args.threads), "--device", args.device, "--_child", str(length), "1" if capture else "0", "x"]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                runs.setdefault((length, capture), []).append(result)
                print(f"L={length} capture={capture} rep={rep}: {result['seconds']:.2f}s peak {result['peak_rss_gb']:.2f} GB",
                      file=sys.stderr, flush=True)

    rows = []
    for length in args.lengths:
        gen, cap = runs[(length, False)], runs[(length, True)]
        t_gen = statistics.median(r["seconds"] for r in gen)
        t_cap = statistics.median(r["seconds"] for r in cap)
        rows.append({
            "prompt_tokens": gen[0]["length"], "new_tokens": args.new_tokens,
            "generate_s": round(t_gen, 3), "generate_capture_s": round(t_cap, 3),
            "capture_overhead": round(t_cap / t_gen - 1, 4),
            "generate_peak_gb": round(max(r["peak_rss_gb"] for r in gen), 3),
            "capture_peak_gb": round(max(r["peak_rss_gb"] for r in cap), 3),
        })
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "repeats": args.repeats, "torch_threads": args.threads or __import__("torch").get_num_threads()}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = ["| prompt tokens | generate (s) | generate + capture (s) | overhead | peak RSS gen (GB) | peak RSS capture (GB) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prompt_tokens']} | {r['generate_s']:.2f} | {r['generate_capture_s']:.2f} | "
                     f"{100 * r['capture_overhead']:+.1f}% | {r['generate_peak_gb']:.2f} | {r['capture_peak_gb']:.2f} |")
    table = "\n".join(lines)
    out.with_suffix(".md").write_text(f"Model {args.model}, {args.new_tokens} new tokens, medians of {args.repeats}.\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
