"""`make bench` (benchmarks/run_all.py) end to end on a tiny model: every script runs and the summary adds up."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import tiny_llama_folder

ROOT = Path(__file__).resolve().parents[1]


def test_run_all_writes_one_summary_of_every_benchmark(tmp_path):
    model = tiny_llama_folder(tmp_path / "model", max_positions=512)
    out = tmp_path / "bench"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--model", str(model),
                           "--lengths", "256", "320", "--repeats", "1", "--threads", "1", "--out", str(out),
                           "--eval-records", "1", "--eval-tokens", "200,300", "--eval-budgets", "16,32"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["machine"]["torch_threads"] == 1 and set(summary["seconds"]) == {"overhead", "capture", "train_step", "eval"}
    overhead = summary["overhead"]["lengths"]
    assert set(overhead) == {"256", "320"} and {"plain", "lookahead", "snapkv", "h2o"} <= set(overhead["256"])
    table = (out / "summary.md").read_text()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ")}
    assert rows["measurement"] == ["256 tokens", "320 tokens"]
    lookahead = rows["lookahead: time to first token vs plain"]
    expected = [f"{overhead[n]['lookahead']['overhead_pct']:+.1f}%" for n in ("256", "320")]
    assert lookahead == expected
    noise = [overhead["256"][m]["overhead_pct"] for m in ("random", "streamingllm", "knorm")]
    assert rows["noise: random, streamingllm, knorm (ms of extra work) vs plain"][0] == \
        f"{min(noise):+.1f}% .. {max(noise):+.1f}%"
    la = overhead["320"]["lookahead"]
    assert rows["lookahead: scoring pass after prefill (% of plain prefill)"][1] == \
        f"{la['score_s']:.3f} s ({100 * la['score_s'] / overhead['320']['plain']['prefill_s']:.1f}%)"
    capture = summary["capture"]["rows"][1]
    assert 304 <= capture["prompt_tokens"] <= 320
    assert rows["ground-truth capture: generate + capture vs generate"][1] == f"{100 * capture['capture_overhead']:+.1f}%"
    ratio = rows["train step: naive / cached time"]
    assert all(re.fullmatch(r"\d+\.\dx", cell) for cell in ratio), ratio
    bench = summary["eval"]
    assert bench["check"]["rows"] > 0 and not bench["check"]["missing"] and bench["check"]["max_metric_diff"] == 0
    assert f"{bench['speedup']:.2f}x" in table


def test_overhead_times_each_listed_draft_count_side_by_side(tmp_path):
    model = tiny_llama_folder(tmp_path / "model", max_positions=512)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_overhead
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = bench_overhead.main(["--model", str(model), "--lengths", "200", "--repeats", "1", "--threads", "1",
                                   "--methods", "lookahead", "--lookahead-draft-tokens", "2,1,2",
                                   "--out", str(tmp_path / "out")])
    (table,) = results["lengths"].values()
    assert {"plain", "lookahead", "lookahead+draft1", "lookahead+draft2"} == set(table)
    assert all(table[m]["score_s"] > 0 for m in ("lookahead", "lookahead+draft1", "lookahead+draft2"))
    passes = [line.split("|")[1].strip() for line in bench_overhead.passes_table(table).splitlines()[2:]]
    assert passes == ["lookahead", "lookahead+draft1", "lookahead+draft2"]
    assert "| lookahead+draft2 |" in (tmp_path / "out" / "overhead.md").read_text()
