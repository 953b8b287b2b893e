"""What per-record durability costs `lkv collect`: each finished record is written to ``pending/`` (its
tensors, its line) before it waits for its shard. Times a real collection per record, then, on the same
records, the pending writes alone (the same file and line writes, fsync included), side by side.

    python benchmarks/bench_durability.py --n 6 --min-tokens 1500 --max-tokens 2000 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=6)
    parser.add_argument("--min-tokens", type=int, default=1500)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--storage", default="dense", choices=["dense", "sparse"])
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5, help="timings of the pending writes per record")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from lkvcli.collect import CollectConfig, collect
    from lkvcli.files import append_line, save_tensors_atomic
    from lkvcli.targets import TargetsReader, TargetsWriter

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "targets"
        config = CollectConfig(model=args.model, data=f"builtin:n={args.n},min_tokens={args.min_tokens},"
                                                        f"max_tokens={args.max_tokens},seed=7",
                               out=str(folder), max_new_tokens=args.new_tokens, storage=args.storage, device="cpu")
        start = time.perf_counter()
        summary = collect(config)
        collect_s = (time.perf_counter() - start) / max(1, summary.written)
        reader = TargetsReader(folder)
        writer = TargetsWriter(Path(tmp) / "scratch", reader.manifest, records_per_file=10**9)
        pending = Path(tmp) / "scratch" / "pending"
        pending.mkdir()
        per_record = []
        for record in reader:  # the exact writes add() makes for this record
            tensors = {f"{record.id}.prompt_ids": record.prompt_ids.to(torch.int32),
                       f"{record.id}.response_ids": record.response_ids.to(torch.int32),
                       **writer._target_tensors(record.id, record.target),
                       **{k: v for name, t in record.extras.items()
                          for k, v in writer._target_tensors(f"{record.id}.{name}", t).items()}}
            line = json.dumps({**record.meta, "pending": "000000.safetensors"}, ensure_ascii=False)
            times = []
            for _ in range(args.repeats):
                tic = time.perf_counter()
                save_tensors_atomic(pending / "000000.safetensors", tensors)
                append_line(Path(tmp) / "scratch" / "pending.jsonl", line)
                times.append(time.perf_counter() - tic)
            per_record.append(statistics.median(times))
        writes_s = statistics.median(per_record)
    result = {"records": summary.written, "prompt_tokens": summary.prompt_tokens // max(1, summary.written),
              "collect_s_per_record": collect_s, "pending_writes_s_per_record": writes_s,
              "overhead_pct": 100 * writes_s / collect_s, "storage": args.storage}
    print(f"{result['records']} records of ~{result['prompt_tokens']} prompt tokens ({args.storage}): collect "
          f"{collect_s:.3f} s/record; pending writes {1000 * writes_s:.2f} ms/record = "
          f"{result['overhead_pct']:.2f}% of collecting it")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
