"""Run an ablation of lookahead training settings and print one table: held-out and in-domain answers
per budget, critical / mass recall, KL and the evicted cache's size, with the `lkv` command behind
every row.

    python benchmarks/ablation.py benchmarks/ablations/small-budget.yaml --out runs/ablation

The YAML names the targets to collect (``collect``: name -> built-in spec, or ``{data, max_new_tokens,
reduction}``: the response length and the GQA group reduction of the targets), the evaluation sets
(``eval_sets``: name -> targets names, split, ``eval`` overrides such as ``mode: context``, and
``tasks`` whose answers get a table of their own, ``budgets`` if not the spec's), the
shared training overrides (``train``), and the settings (``settings``: a name, training overrides,
its own ``train_targets`` if not the spec's, or ``from: NAME`` to reuse another setting's adapter with only ``eval`` overrides such as
``scorers.lookahead.recent_window=16``; ``sets`` limits a setting to some evaluation sets) and the
``baselines``: method names, evaluated together, or ``{name, method, eval}`` variants evaluated on
their own, such as the oracle under ``scorers.oracle.allocation: global`` (an evaluation set may
list its own ``baselines``).
Every step is an ``lkv`` command run in a child process: collect, train and eval resume where they
stopped, so re-running the same command continues and then re-prints the table; a finished step
(a training run with its final adapter, an evaluation with its results) is skipped, so two drivers may run
disjoint ``--only`` lists side by side.
Writes OUT/ablation.json, OUT/ablation.md (per set the table, a table per listed task, and a goals table:
the SnapKV-to-oracle answer gap each lookahead row recovers, its lead over SnapKV and KVzip, its critical
recall against the oracle's; for a context-mode set also its lead over the best heuristic and its answers
against the oracle's at 256) and OUT/critical_by_layer-SET.png (critical recall per layer at the key
budget, one line per row).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

TABLE_BUDGETS_DEFAULT = ("32", "64", "128", "256", "512")
FINISHED = {"train": "adapter", "eval": "results.json"}  # what a finished step has written


def _overrides(mapping: dict | None) -> list[str]:
    out = []
    for key, value in (mapping or {}).items():
        text = json.dumps(value) if isinstance(value, (list, dict)) else str(value)
        out.append(f"{key}={text}")
    return out


def _run(cmd: list[str], log: Path, dry: bool) -> None:
    line = shlex.join(cmd)
    print(f"$ {line}", flush=True)
    if dry:
        return
    with log.open("a") as fh:
        fh.write(f"$ {line}\n")
        fh.flush()
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"error: command failed (exit {proc.returncode}), see {log}: {line}")


def lkv(*args: str) -> list[str]:
    return [sys.executable, "-m", "lkvcli", *args]


def baselines(spec: dict, eval_set: dict) -> tuple[list[str], list[dict]]:
    """(plain baseline methods, variants as {"name", "method", "eval"}) of one evaluation set: its own
    ``baselines`` list, else the spec's."""
    plain, variants = [], []
    for entry in eval_set.get("baselines", spec.get("baselines", ["snapkv", "oracle"])):
        if isinstance(entry, str):
            plain.append(entry)
        else:
            variants.append({"name": entry["name"], "method": entry.get("method", entry["name"]),
                             "eval": entry.get("eval", {})})
    return plain, variants


def plan(spec: dict, out: Path) -> list[dict]:
    """Every step as {"kind", "name", "cmd", "result"} in the order to run; ValueError on a setting that
    names an evaluation set or a source setting the spec lacks."""
    model = spec.get("model", "smollm2-135m-instruct")
    names = [setting["name"] for setting in spec["settings"]]
    for setting in spec["settings"]:
        unknown = sorted(set(setting.get("sets", [])) - set(spec["eval_sets"]))
        if unknown or setting.get("from", names[0]) not in names:
            raise ValueError(f"setting {setting['name']!r} names " + (
                f"evaluation sets the spec lacks: {', '.join(unknown)} (it has {', '.join(spec['eval_sets'])})"
                if unknown else f"an unknown `from` setting {setting['from']!r}"))
    steps = []
    folders = {name: out / "targets" / name for name in spec["collect"]}
    for name, data in spec["collect"].items():
        options = data if isinstance(data, dict) else {"data": data}
        reduction = ["--reduction", options["reduction"]] if "reduction" in options else []
        steps.append({"kind": "collect", "name": name, "result": folders[name],
                      "cmd": lkv("collect", "--model", model, "--data", options["data"], "--out", str(folders[name]),
                                 "--max-new-tokens", str(options.get("max_new_tokens", 48)), *reduction)})
    train_data = [str(folders[n]) for n in spec["train_targets"]]
    runs = {}
    for setting in spec["settings"]:
        name = setting["name"]
        if "from" in setting:
            runs[name] = runs[setting["from"]]
            continue
        run = runs[name] = out / "runs" / name
        data = [str(folders[n]) for n in setting["train_targets"]] if "train_targets" in setting else train_data
        cmd = lkv("train", "--model", model, *sum((["--data", d] for d in data), []), "--out", str(run),
                  *_overrides(spec.get("train")), *_overrides(setting.get("train")))
        steps.append({"kind": "train", "name": name, "result": run, "cmd": cmd})
    for set_name, eval_set in spec["eval_sets"].items():
        # the baselines' eval names the run of the first setting this set evaluates (any run serves)
        first_run = next((runs[s["name"]] for s in spec["settings"] if set_name in s.get("sets", spec["eval_sets"])),
                         next(iter(runs.values())))
        targets = ",".join(str(folders[n]) for n in eval_set["targets"])
        common = ["--targets", targets, "--budgets", ",".join(set_budgets(spec, eval_set)), "--parts", "prediction,answers",
                  "--split", eval_set.get("split", "all"), *(["--limit", str(eval_set["limit"])] if "limit" in eval_set else []),
                  *_overrides(spec.get("eval")), *_overrides(eval_set.get("eval"))]
        plain, variants = baselines(spec, eval_set)
        result = out / "results" / "baselines" / set_name
        steps.append({"kind": "eval", "name": "baselines", "set": set_name, "result": result,
                      "cmd": lkv("eval", *common, "--adapter", str(first_run), "--methods", ",".join(plain),
                                 "--out", str(result))})
        for variant in variants:
            result = out / "results" / variant["name"] / set_name
            steps.append({"kind": "eval", "name": variant["name"], "set": set_name, "result": result,
                          "cmd": lkv("eval", *common, "--adapter", str(first_run), "--methods", variant["method"],
                                     "--out", str(result), *_overrides(variant["eval"]))})
        for setting in spec["settings"]:
            if set_name not in setting.get("sets", spec["eval_sets"]):
                continue
            result = out / "results" / setting["name"] / set_name
            steps.append({"kind": "eval", "name": setting["name"], "set": set_name, "result": result,
                          "cmd": lkv("eval", *common, "--adapter", str(runs[setting["name"]]), "--methods", "lookahead",
                                     "--out", str(result), *_overrides(setting.get("eval")))})
    return steps


def _row(results: Path, method: str, budgets: list[str], key_budget: str) -> dict:
    data = json.loads((results / "results.json").read_text())
    pred = data.get("prediction", {}).get(method, {})
    answers = data.get("answers", {})
    row = {"full": answers.get("full", {}).get("score"), "kl": pred.get("kl")}
    for b in budgets:
        row[f"score@{b}"] = answers.get("methods", {}).get(method, {}).get(b, {}).get("score")
    at = pred.get("budgets", {}).get(key_budget, {})
    cache = answers.get("methods", {}).get(method, {}).get(key_budget, {})
    row.update({"critical_by_layer": at.get("critical_recall_by_layer"),
                "critical_recall": at.get("critical_recall"), "critical_heads": at.get("critical_heads"),
                "recall": at.get("recall"), "records": pred.get("records"),
                "cache_ratio": cache.get("cache_ratio"), "padding_ratio": cache.get("padding_ratio"),
                "by_task": {task: {"full": scores.get("full"), **{f"score@{b}": scores.get(method, {}).get(b)
                                                                  for b in budgets}}
                            for task, scores in answers.get("by_task", {}).items()}})
    return row


def set_budgets(spec: dict, eval_set: dict) -> list[str]:
    """An evaluation set's budgets: its own, else the spec's."""
    return [str(b) for b in eval_set.get("budgets", spec.get("budgets", TABLE_BUDGETS_DEFAULT))]


def table(spec: dict, steps: list[dict], key_budget: str) -> tuple[dict, str]:
    rows, lines = {}, []
    for set_name, eval_set in spec["eval_sets"].items():
        budgets = set_budgets(spec, eval_set)
        head = ["setting", *[f"ans@{b}" for b in budgets], f"crit@{key_budget}", f"heads@{key_budget}",
                f"recall@{key_budget}", "KL", f"cache@{key_budget}"]
        lines += [f"### {set_name}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        plain, variants = baselines(spec, eval_set)
        entries = [(m, "baselines", m) for m in plain] + [(v["name"], v["name"], v["method"]) for v in variants]
        entries += [(s["name"], s["name"], "lookahead") for s in spec["settings"]
                    if set_name in s.get("sets", spec["eval_sets"])]
        full = None
        for label, source, method in entries:
            results = Path(next(s["result"] for s in steps if s["name"] == source and s.get("set") == set_name))
            if not (results / "results.json").exists():
                continue
            row = _row(results, method, budgets, key_budget)
            full = row["full"] if full is None else full
            rows.setdefault(set_name, {})[label] = row
            cells = [label, *[_fmt(row[f"score@{b}"]) for b in budgets], _fmt(row["critical_recall"]),
                     _fmt(row["critical_heads"]), _fmt(row["recall"]), _fmt(row["kl"]), _cache(row)]
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"full cache: {_fmt(full)}; records: "
                  f"{next(iter(rows.get(set_name, {}).values()), {}).get('records')}", ""]
        for task in eval_set.get("tasks", []):  # answers of one task family alone
            found = {label: row["by_task"][task] for label, row in rows.get(set_name, {}).items()
                     if task in row["by_task"]}
            full_task = next(iter(found.values()), {}).get("full")
            lines += [f"#### {set_name}, task {task} (full cache {_fmt(full_task)})", "",
                      "| " + " | ".join(["setting", *[f"ans@{b}" for b in budgets]]) + " |",
                      "|" + "---|" * (len(budgets) + 1)]
            lines += ["| " + " | ".join([label, *[_fmt(r[f"score@{b}"]) for b in budgets]]) + " |"
                      for label, r in found.items()]
            lines.append("")
        lines += goals(set_name, rows.get(set_name, {}), budgets, key_budget,
                       baseline_rows={label for label, _, method in entries if method != "lookahead"},
                       heuristic_rows=({label for label, _, method in entries
                                        if method not in ("lookahead", "oracle", "kvzip")}
                                       if (eval_set.get("eval") or {}).get("mode") == "context" else None))
    lines += ["### Commands", "", "```"]
    lines += [shlex.join([Path(c[0]).name if i == 0 else c[i] for i in range(len(c))])
              for c in dict.fromkeys(tuple(s["cmd"]) for s in steps)]
    lines += ["```"]
    return rows, "\n".join(lines)


def goals(set_name: str, rows: dict, budgets: list[str], key_budget: str, baseline_rows: set[str],
          heuristic_rows: set[str] | None = None) -> list[str]:
    """The small-budget goals of one set, per lookahead row (the rows not in ``baseline_rows``): the share of
    the SnapKV-to-oracle answer gap recovered per budget, the row's smallest lead over SnapKV, its
    critical recall as a share of the oracle's, and its lead over KVzip per budget (if KVzip ran).
    A context-mode set passes its ``heuristic_rows`` (every baseline row but the oracle's and KVzip's) and
    gets the context-mode goals too: the smallest lead over the best of them at each budget and the answers
    as a share of the oracle's at 256 (or the largest budget below it). Empty without SnapKV and oracle rows."""
    if "snapkv" not in rows or "oracle" not in rows:
        return []
    snap, oracle, kvzip = rows["snapkv"], rows["oracle"], rows.get("kvzip")
    context = heuristic_rows is not None
    heuristics = [rows[label] for label in sorted(heuristic_rows or ()) if label in rows]
    top = max((b for b in budgets if int(b) <= 256), key=int, default=budgets[-1])

    def share(value, low, high) -> str:
        if None in (value, low, high) or high - low < 1e-9:
            return "-"
        return f"{100 * (value - low) / (high - low):.0f}%"

    def lead(row, base, b) -> float | None:
        mine, theirs = row[f"score@{b}"], base[f"score@{b}"]
        return None if mine is None or theirs is None else mine - theirs

    best_heuristic = {f"score@{b}": max((h[f"score@{b}"] for h in heuristics if h[f"score@{b}"] is not None),
                                         default=None) for b in budgets}
    head = ["setting", *[f"gap@{b}" for b in budgets], "min lead over SnapKV", f"crit@{key_budget} / oracle's",
            *([f"lead over KVzip@{b}" for b in budgets] if kvzip else []),
            *(["min lead over the best heuristic", f"ans@{top} / oracle's"] if context else [])]
    lines = [f"#### {set_name}, goals: SnapKV-to-oracle answer gap recovered, critical recall against the oracle's",
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, row in rows.items():
        if label in baseline_rows:
            continue
        leads = [x for x in (lead(row, snap, b) for b in budgets) if x is not None]
        cells = [label, *[share(row[f"score@{b}"], snap[f"score@{b}"], oracle[f"score@{b}"]) for b in budgets],
                 f"{min(leads):+.3f}" if leads else "-", share(row["critical_recall"], 0.0, oracle["critical_recall"])]
        if kvzip:
            cells += [("-" if x is None else f"{x:+.3f}") for x in (lead(row, kvzip, b) for b in budgets)]
        if context:
            over = [x for x in (lead(row, best_heuristic, b) for b in budgets) if x is not None]
            cells += [f"{min(over):+.3f}" if over else "-", share(row[f"score@{top}"], 0.0, oracle[f"score@{top}"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def plot_layers(rows: dict, key_budget: str, out: Path, only: set[str] | None = None) -> list[Path]:
    """OUT/critical_by_layer-SET.png: critical recall per layer at the key budget, one line per row
    (the rows named in ``only``, if given); past ten lines the colours repeat with another dash."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = []
    for set_name, entries in rows.items():
        fig, ax = plt.subplots(figsize=(7, 4))
        shown = [(label, row) for label, row in entries.items()
                 if row.get("critical_by_layer") and (not only or label in only)]
        for i, (label, row) in enumerate(shown):
            ax.plot(range(len(row["critical_by_layer"])), row["critical_by_layer"], marker=".", label=label,
                    linestyle=("-", "--", ":")[i // 10 % 3])
        if not ax.lines:
            plt.close(fig)
            continue
        ax.set(title=f"{set_name}: critical recall per layer at budget {key_budget}", xlabel="layer",
               ylabel="share of fact tokens kept")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        made.append(out / f"critical_by_layer-{set_name}.png")
        fig.savefig(made[-1], dpi=110)
        plt.close(fig)
    return made


def _cache(row: dict) -> str:
    """The evicted cache's bytes as a share of the full cache's (its padding in brackets, if any)."""
    if row.get("cache_ratio") is None:
        return "-"
    pad = row.get("padding_ratio") or 0.0
    return f"{100 * row['cache_ratio']:.1f}%" + (f" ({100 * pad:.1f}% pad)" if pad > 0 else "")


def _fmt(value) -> str:
    """Three decimals; a value that rounds to zero prints as 0.000, never -0.000 (the oracle's KL)."""
    return "-" if value is None else f"{(0.0 if abs(value) < 5e-4 else value):.3f}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("spec", help="ablation YAML (see benchmarks/ablations/)")
    parser.add_argument("--out", default="runs/ablation")
    parser.add_argument("--only", default=None, help="comma-separated collect / setting names to run (default: all)")
    parser.add_argument("--sets", default=None, help="comma-separated evaluation sets to run (default: all)")
    parser.add_argument("--table-budget", default="64", help="budget of the recall columns")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only; the tables and plots are re-rendered from finished results")
    parser.add_argument("--plot-rows", default=None, help="comma-separated rows to plot (default: all)")
    args = parser.parse_args(argv)
    spec = yaml.safe_load(Path(args.spec).read_text())
    out = Path(args.out)
    try:
        steps = plan(spec, out)
    except ValueError as error:
        parser.error(f"{args.spec}: {error}")
    out.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) | {"baselines"} if args.only else None  # variants run only when named
    sets = set(args.sets.split(",")) if args.sets else None
    log = out / "ablation.log"
    for step in steps:
        if only and step["name"] not in only or sets and step["kind"] == "eval" and step["set"] not in sets:
            continue
        cmd = list(step["cmd"])
        if step["kind"] != "collect" and (Path(step["result"]) / FINISHED[step["kind"]]).exists():
            continue  # finished (delete its folder to run it again)
        if step["kind"] == "train" and (Path(step["result"]) / "checkpoints" / "latest").exists():
            cmd.append("--resume")
        _run(cmd, log, args.dry_run)
    rows, text = table(spec, steps, args.table_budget)
    (out / "ablation.json").write_text(json.dumps(rows, indent=1))
    (out / "ablation.md").write_text(text + "\n")
    plots = plot_layers(rows, args.table_budget, out, set(args.plot_rows.split(",")) if args.plot_rows else None)
    print(text + "".join(f"\nplot: {p}" for p in plots))


if __name__ == "__main__":
    main()
