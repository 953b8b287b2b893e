"""Seconds per training step: cached prompt (lkv's step), its reused prefill (epochs after the first)
and naive (whole prompt in the graph every step).

cached: prompt prefilled without grad (adapter off), forward + backward over the N lookahead
        positions only (``LookaheadAdapter.prefill`` + ``score``, what ``lkv train`` runs in its first epoch);
reused: the same step in a later epoch: the prefill comes from ``lkvcli.train.PrefillCache``
        (``prefill_cache_mb``), so only the batch cache is assembled ("of which prefill") before the pass;
naive:  prompt + lookahead in one pass with grad through peft's aLoRA (adapter active only at the
        lookahead positions), i.e. the whole prompt goes through the autograd graph.

Both are timed side by side in one run (repeats interleaved), medians reported. Memory is
measured apart, one fresh process per (variant, length) running one step: the peak resident
memory during the step above the process's memory before it (psutil sampling every 5 ms; a
shared process would keep the allocator's high-water mark of the other variant). On CUDA,
torch.cuda.max_memory_allocated.

    python benchmarks/bench_train_step.py                       # SmolLM2-135M, L = 1024 and 2048
    python benchmarks/bench_train_step.py --lengths 512 --repeats 2 --out runs/bench.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig, alora_twin, single_pass_scores
from lkvcli.models import load_model
from lkvcli.shapes import num_kv_heads, num_layers
from lkvcli.targets import TargetRecord
from lkvcli.train import PrefillCache, kl_per_example


KINDS = ("cached", "reused", "naive")


class PeakMemory:
    """Peak RSS (bytes) of this process while the block runs, sampled every 5 ms."""

    def __enter__(self):
        self.proc, self.running = psutil.Process(), True
        self.before = self.peak = self.proc.memory_info().rss
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        return self

    def _sample(self):
        while self.running:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        if torch.cuda.is_available():
            self.before, self.peak = 0, torch.cuda.max_memory_allocated()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--num-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--out", default="runs/bench_train_step.json")
    parser.add_argument("--probe", choices=KINDS, help=argparse.SUPPRESS)  # memory worker
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(args.model, device=args.device)
    model = loaded.model
    twin_base = copy.deepcopy(model)
    adapter = LookaheadAdapter.attach(model, LookaheadConfig(num_tokens=args.num_tokens))
    twin = alora_twin(twin_base, adapter)
    twin_params = [p for n, p in twin.named_parameters() if "lora_" in n] + [adapter.embeddings]
    ours = [p for _, p in adapter.named_parameters()]
    optimisers = {"cached": torch.optim.AdamW(ours, lr=1e-4), "naive": torch.optim.AdamW(twin_params, lr=1e-4)}
    optimisers["reused"] = optimisers["cached"]
    kept = PrefillCache(budget_mb=2**20)  # the training prompts' prefills, kept from the first epoch

    def record(ids: torch.Tensor) -> TargetRecord:
        return TargetRecord(id=f"L{ids.shape[1]}", prompt_ids=ids[0], response_ids=ids[0, :0], target=None)
    gen = torch.Generator().manual_seed(0)
    baseline = psutil.Process().memory_info().rss
    vocab = model.config.vocab_size

    def step(kind: str, ids: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
        """(seconds for the whole step, seconds of it spent in the no-grad prefill)."""
        start = time.perf_counter()
        prefill_s = 0.0
        if kind != "naive":
            cache = adapter.prefill(ids) if kind == "cached" else kept.batch(adapter, [record(ids)])
            prefill_s = time.perf_counter() - start
            pred = adapter.score(cache)
        else:
            pred = single_pass_scores(twin, adapter.embeddings, ids)
        loss = kl_per_example(target, pred).mean()
        loss.backward()
        optimisers[kind].step()
        optimisers[kind].zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter() - start, prefill_s

    def inputs(length: int):
        ids = torch.randint(0, vocab, (1, length), generator=gen).to(adapter.device)
        alpha = torch.full((length,), 0.1)
        return ids, torch.distributions.Dirichlet(alpha).sample((1, num_layers(model), num_kv_heads(model)))

    if args.probe:  # one step in this fresh process; report the memory it took
        ids, target = inputs(args.lengths[0])
        if args.probe == "reused":
            kept.batch(adapter, [record(ids)])  # the first epoch kept the prefill
        with PeakMemory() as mem:
            step(args.probe, ids, target)
        print(json.dumps({"peak_gb": mem.peak / 2**30, "before_gb": mem.before / 2**30}))
        return

    rows = []
    for length in args.lengths:
        ids, target = inputs(length)
        times, prefills = {k: [] for k in KINDS}, {k: [] for k in KINDS}
        for kind in times:  # warm-up (for "reused": the first epoch, which keeps the prefill)
            step(kind, ids, target)
        for _ in range(args.repeats):
            for kind in times:
                total, prefill_s = step(kind, ids, target)
                times[kind].append(total)
                prefills[kind].append(prefill_s)
        for kind in times:
            probe = [sys.executable, __file__, "--probe", kind, "--lengths", str(length), "--model", args.model,
                     "--num-tokens", str(args.num_tokens), "--device", args.device, "--threads", str(args.threads)]
            mem = json.loads(subprocess.run(probe, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            rows.append({"prompt_len": length, "step": kind, "median_s": statistics.median(times[kind]),
                         "prefill_median_s": statistics.median(prefills[kind]), "times_s": times[kind],
                         "step_mem_gb": mem["peak_gb"] - mem["before_gb"], "peak_mem_gb": mem["peak_gb"]})

    header = (f"{'L':>6} {'step':>7} {'median s/step':>14} {'of which prefill':>17} {'step mem GB':>12} "
              f"{'peak GB':>8}")
    print(f"baseline RSS (model + aLoRA twin loaded) {baseline / 2**30:.2f} GB\n" + header + "\n" + "-" * len(header))
    for row in rows:
        print(f"{row['prompt_len']:>6} {row['step']:>7} {row['median_s']:>14.3f} {row['prefill_median_s']:>17.3f} "
              f"{row['step_mem_gb']:>12.2f} {row['peak_mem_gb']:>8.2f}")
    for length in args.lengths:
        cached, reused, naive = (next(r["median_s"] for r in rows if r["prompt_len"] == length and r["step"] == k)
                                 for k in KINDS)
        print(f"L={length}: cached step is {naive / cached:.1f}x faster than naive; in a later epoch (reused "
              f"prefill) {reused:.3f} s vs {cached:.3f} s, {cached / reused:.1f}x faster")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    info = {"model": args.model, "num_tokens": args.num_tokens, "repeats": args.repeats,
            "device": str(adapter.device), "threads": torch.get_num_threads(), "baseline_rss_gb": baseline / 2**30, "rows": rows}
    out.write_text(json.dumps(info, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
