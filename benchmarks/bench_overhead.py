"""Eviction overhead of every scorer relative to plain prefill, at several prompt lengths.

For each length, every method (and plain prefill) runs on the same prompt in a seeded
shuffled order per repeat, after one warm-up run each; the table shows medians of the
time to first token (prefill + scoring + eviction + first token) and its overhead over plain
prefill. The lookahead adapter is untrained (timing does not depend on training).

    python benchmarks/bench_overhead.py                                  # SmolLM2-135M, 1K/2K/4K
    python benchmarks/bench_overhead.py --lengths 1024,2048 --repeats 3
    git show HEAD~1:src/lkvcli/lookahead.py > /tmp/old_lookahead.py      # before/after, side by side
    python benchmarks/bench_overhead.py --methods lookahead,draft --baseline-lookahead /tmp/old_lookahead.py
    python benchmarks/bench_overhead.py --model-config llama-3.1-8b --device cuda --dtype bfloat16 \
        --lengths 8192,32768

``--model-config`` builds a randomly initialised model from a transformers config (a
config.json file or folder), e.g. Llama-3.1-8B's on a GPU; prompts are then random token
ids. After each length's table comes the scoring passes of lookahead and draft (timed on their own,
after prefill; ``--lookahead-draft-tokens K`` adds lookahead mixed with the model's first K answer
tokens as ``lookahead+draftK``; a list ``1,2,4`` times each K side by side) in seconds and % of plain
prefill, and the ratio draft / lookahead.
``--baseline-lookahead FILE`` also times the scoring pass of another revision's ``lookahead.py`` as
``lookahead-baseline`` (same model and weights, interleaved). Writes ``OUT/overhead.json`` and
``OUT/overhead.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
import time
from pathlib import Path

import torch

from lkvcli.evaluate import environment, overhead_table, time_method
from lkvcli.report import _fmt
from lkvcli.scorers import available, get_scorer

SKIP = {"oracle"}  # needs collected targets; it costs nothing at inference anyway
BASELINE = "lookahead-baseline"
MIXED = "lookahead+draft"  # + K, the number of draft tokens (in increasing K)

PRESETS = {  # --model-config NAME: published configs, built with random weights
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def load(args):
    """(model, tokenizer or None, description)."""
    from lkvcli.models import load_model, prepare_model, resolve_device, resolve_dtype

    if not args.model_config:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
        return loaded.model, loaded.tokenizer, args.model
    from transformers import AutoConfig, AutoModelForCausalLM

    from lkvcli.attention import register_attention

    register_attention()
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.model_config in PRESETS:
        preset = dict(PRESETS[args.model_config])
        config = AutoConfig.for_model(preset.pop("model_type"), **preset)
    else:
        config = AutoConfig.from_pretrained(args.model_config)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="lkv_sdpa")
    return prepare_model(model), None, f"random {config.model_type} from {args.model_config}"


def baseline_adapter(path: str, adapter):
    """``adapter``'s model and weights under the ``LookaheadAdapter`` of another revision's lookahead.py."""
    spec = importlib.util.spec_from_file_location("lkvcli._baseline_lookahead", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a submodule of lkvcli: its relative imports resolve
    spec.loader.exec_module(module)
    return module.LookaheadAdapter(adapter.peft_model, adapter.embeddings, adapter.config)


def prompt_ids(tokenizer, length: int, vocab: int, device) -> torch.Tensor:
    """``length`` tokens of a bundled play (or random ids without a tokenizer)."""
    if tokenizer is None:
        gen = torch.Generator().manual_seed(length)
        return torch.randint(vocab // 8, vocab - vocab // 8, (1, length), generator=gen).to(device)
    from lkvcli.prompts.corpus import load_plays

    text = "\n".join(load_plays()[0].lines)
    ids = tokenizer(text, add_special_tokens=False).input_ids[:length]
    return torch.tensor([ids], device=device)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--model-config", default=None,
                        help=f"config.json/folder, or a preset ({', '.join(PRESETS)}), of a model built with random weights")
    parser.add_argument("--lengths", default="1024,2048,4096")
    parser.add_argument("--methods", default=",".join(m for m in available() if m not in SKIP))
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lookahead-tokens", type=int, default=32)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 gives stable timings on a shared machine)")
    parser.add_argument("--baseline-lookahead", default=None, metavar="FILE",
                        help="another revision's lookahead.py, timed side by side as " + BASELINE)
    parser.add_argument("--lookahead-draft-tokens", default="", metavar="K[,K...]",
                        help="also time the lookahead scorer mixed with the model's own first K answer tokens "
                             "(scorers.lookahead.draft_tokens=K) as lookahead+draftK, for each K listed")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    try:
        draft_counts = sorted({int(k) for k in args.lookahead_draft_tokens.split(",") if k.strip()})  # each timed once
    except ValueError:
        parser.error("--lookahead-draft-tokens takes whole numbers separated by commas, "
                     f"not {args.lookahead_draft_tokens!r}")
    if any(k < 1 for k in draft_counts):
        parser.error("--lookahead-draft-tokens: each K must be >= 1")

    from lkvcli.lookahead import LookaheadAdapter, LookaheadConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, description = load(args)
    names = [m.strip() for m in args.methods.split(",") if m.strip()]
    scorers = {name: get_scorer(name) for name in names}
    resources = {}
    if "lookahead" in names or args.baseline_lookahead or draft_counts:
        resources["adapter"] = LookaheadAdapter.attach(model, LookaheadConfig(num_tokens=args.lookahead_tokens))
    for k in draft_counts:
        names.append(f"{MIXED}{k}")
        scorers[f"{MIXED}{k}"] = get_scorer("lookahead", draft_tokens=k)
    method_resources = {name: resources for name in names}
    if args.baseline_lookahead:
        names.append(BASELINE)
        scorers[BASELINE] = get_scorer("lookahead")
        method_resources[BASELINE] = {**resources, "adapter": baseline_adapter(args.baseline_lookahead,
                                                                               resources["adapter"])}
    device = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    rng = random.Random(args.seed)
    results = {"model": description, "budget": args.budget, "repeats": args.repeats,
               "lookahead_tokens": args.lookahead_tokens, "environment": environment(), "lengths": {}}
    for length in [int(x) for x in args.lengths.split(",")]:
        ids = prompt_ids(tokenizer, length, vocab, device)
        tail = ids[:, :0]

        def run(name):
            scorer = None if name == "plain" else scorers[name]
            return time_method(scorer, model, ids, tail, args.budget, tokenizer=tokenizer,
                               resources=method_resources.get(name))

        order = ["plain", *names]
        for name in order:  # warm-up
            run(name)
        samples = {name: [] for name in order}
        t0 = time.perf_counter()
        for _ in range(args.repeats):
            rng.shuffle(order)
            for name in order:
                samples[name].append(run(name))
        table = overhead_table(samples)
        results["lengths"][str(ids.shape[1])] = table
        print(f"length {ids.shape[1]}: {time.perf_counter() - t0:.0f} s", flush=True)
        print(markdown_table(ids.shape[1], table), flush=True)
        print(passes_table(table), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(results, indent=2))
    md = [f"# Eviction overhead: {description}", "",
          f"Budget {args.budget} entries per KV head; medians of {args.repeats} interleaved repeats; "
          f"{results['environment']['cuda'] or 'CPU'} ({results['environment']['threads']} threads), "
          f"torch {results['environment']['torch']}.", ""]
    md += [markdown_table(int(length), table) + "\n" + passes_table(table)
           for length, table in results["lengths"].items()]
    (out / "overhead.md").write_text("\n".join(md))
    print(f"wrote {out / 'overhead.json'} and {out / 'overhead.md'}")
    return results


def markdown_table(length: int, table: dict) -> str:
    lines = [f"### {length} prompt tokens", "",
             "| method | TTFT s | added s | overhead % | prefill s | score s | evict s | peak MB | cache MB after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, e in sorted(table.items(), key=lambda kv: (kv[0] != "plain", kv[1]["ttft_s"])):
        lines.append(f"| {name} | {_fmt(e['ttft_s'])} | {_fmt(e['scoring_s'], 4)} | {_fmt(e['overhead_pct'], 1)} | "
                     f"{_fmt(e['prefill_s'])} | {_fmt(e['score_s'], 4)} | {_fmt(e['evict_s'], 4)} | "
                     f"{_fmt(e['peak_mb'], 0)} | {_fmt(e['cache_bytes_after'] / 2**20, 2)} |")
    return "\n".join(lines) + "\n"


def passes_table(table: dict) -> str:
    """The scoring passes after prefill: seconds, % of plain prefill, and how many times the draft's pass each is."""
    prefill = table["plain"]["prefill_s"]
    draft = table.get("draft", {}).get("score_s")
    lines = ["| scoring pass | s | % of plain prefill | draft / this |", "|---|---|---|---|"]
    passes = ["lookahead", BASELINE, *(m for m in table if m.startswith(MIXED)), "draft"]  # scored after prefill
    for name in (m for m in passes if m in table):
        score = table[name]["score_s"]
        ratio = f"{draft / score:.1f}x" if draft and name != "draft" else "-"
        lines.append(f"| {name} | {_fmt(score, 4)} | {_fmt(100 * score / prefill, 2)} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
