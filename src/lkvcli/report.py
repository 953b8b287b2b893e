"""The results folder of ``lkv eval`` (format ``lkv-results`` v1), its Markdown report, plots and tables.

Layout::

    OUT/config.json        the resolved EvalConfig and every method's options
    OUT/results.json       aggregates per part, with environment versions and the model fingerprint
    OUT/predictions.jsonl  one line per (record, method, budget) and part, the journal (lkvcli.evaluate.journal)
    OUT/journal.json       the settings that decide the rows' values (a resumed run must match them)
    OUT/report.md          the tables below, in Markdown, with the plots
    OUT/plots/*.png        recall vs budget, critical recall per layer, answer accuracy vs budget, overhead
"""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from .files import write_bytes_atomic, write_json_atomic


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


# ------------------------------------------------------------------ tables as rows (shared by Markdown and rich)
def prediction_rows(results: dict, key: str = "recall") -> tuple[list[str], list[list[str]]]:
    budgets = results["budgets"]
    header = ["method", "KL(GT||m)", *[f"{key}@{b}" for b in budgets]]
    rows = []
    for name, entry in _ranked(results["prediction"], lambda e: e["budgets"][budgets[0]].get(key)):
        rows.append([name, _fmt(entry["kl"]), *[_fmt(entry["budgets"][b].get(key)) for b in budgets]])
    return header, rows


def _has(results: dict, key: str) -> bool:
    """Whether any method has ``key`` at some budget (critical/copy metrics need spans or copies)."""
    return any(e["budgets"][b].get(key) is not None for e in results.get("prediction", {}).values()
               for b in results["budgets"])


def answer_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    budgets, ans = results["budgets"], results["answers"]
    header = ["method", *[f"score@{b}" for b in budgets], *[f"agree@{b}" for b in budgets]]
    rows = [["full", *[_fmt(ans["full"]["score"])] * len(budgets), *["1.000"] * len(budgets)]]
    for name, entry in _ranked(ans["methods"], lambda e: e[budgets[0]]["score"]):
        rows.append([name, *[_fmt(entry[b]["score"]) for b in budgets], *[_fmt(entry[b]["agreement"]) for b in budgets]])
    return header, rows


def task_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    b, by_task = results["budgets"][0], results["answers"]["by_task"]
    tasks = list(by_task)
    header = ["method", *tasks]
    rows = [["full", *[_fmt(by_task[t]["full"]) for t in tasks]]]
    rows += [[m, *[_fmt(by_task[t][m][b]) for t in tasks]] for m in results["methods"]]
    return header, rows


def overhead_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    header = ["method", "prefill s", "score s", "evict s", "TTFT s", "added s", "overhead % of TTFT", "peak MB",
              "cache MB before", "cache MB after"]
    rows = []
    methods = results["overhead"]["methods"]
    for name, e in sorted(methods.items(), key=lambda kv: (kv[0] != "plain", kv[1]["ttft_s"])):
        rows.append([name, _fmt(e["prefill_s"]), _fmt(e["score_s"], 4), _fmt(e["evict_s"], 4), _fmt(e["ttft_s"]),
                     _fmt(e["scoring_s"], 4), _fmt(e["overhead_pct"], 1), _fmt(e["peak_mb"], 1),
                     _fmt(e["cache_bytes_before"] / 2**20, 2), _fmt(e["cache_bytes_after"] / 2**20, 2)])
    return header, rows


def summary_rows(results: dict) -> tuple[list[str], list[list[str]]]:
    """Method x budget in one table: mass recall, answer agreement and time-to-first-token overhead."""
    budgets = results["budgets"]
    pred, ans = results.get("prediction", {}), (results.get("answers") or {}).get("methods", {})
    over = (results.get("overhead") or {}).get("methods", {})
    header = ["method", *[f"recall@{b}" for b in budgets]]
    header += [f"agree@{b}" for b in budgets] if ans else []
    header += ["TTFT overhead %"] if over else []
    rows = []
    ranked = [name for name, _ in _ranked(pred, lambda e: e["budgets"][budgets[0]]["recall"])]
    for name in ranked + [m for m in ans if m not in pred]:
        row = [name, *[_fmt(pred[name]["budgets"][b]["recall"]) if name in pred else "-" for b in budgets]]
        row += [_fmt(ans[name][b]["agreement"]) if name in ans else "-" for b in budgets] if ans else []
        row += [_fmt(over[name]["overhead_pct"], 1) if name in over else "-"] if over else []
        rows.append(row)
    return header, rows


def _ranked(entries: dict, key) -> list:
    def sort_key(item):
        value = key(item[1])
        return -(value if value is not None else -1e9)

    return sorted(entries.items(), key=sort_key)


def sections(results: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table the results hold."""
    out = []
    if "prediction" in results:
        out.append(("Ground-truth mass recall (higher is better)", *prediction_rows(results, "recall")))
        out.append(("Recall excluding the first 4 positions", *prediction_rows(results, "recall_nosink")))
        out.append(("Overlap with the oracle's kept set", *prediction_rows(results, "overlap")))
        for key, title in (("critical_recall", "Critical recall: share of the inserted facts' tokens kept"),
                           ("critical_heads", "Critical heads: share of (layer, KV head) pairs keeping every "
                                              "fact whole"),
                           ("copy_recall", "Copy recall (records without facts): share kept of the prompt tokens "
                                           "the response copies")):
            if _has(results, key):
                out.append((title, *prediction_rows(results, key)))
    if "answers" in results:
        out.append(("Answer accuracy (task metric; open prompts: ROUGE-L agreement with the full cache)",
                    *answer_rows(results)))
        out.append((f"Answer accuracy per task at budget {results['budgets'][0]}", *task_rows(results)))
    if "overhead" in results:
        o = results["overhead"]
        title = (f"Overhead vs plain prefill (budget {o['budget']}, prompts of {o['prompt_tokens']} tokens, "
                 f"medians of {o['repeats']} interleaved repeats)")
        out.append((title, *overhead_rows(results)))
    return out


# ------------------------------------------------------------------ outputs
def markdown(results: dict, plots: list[str]) -> str:
    meta = results["meta"]
    lines = [f"# lkv eval: {meta['model']}", "",
             f"- mode: `{meta['mode']}`; records: {len(meta['records'])}; budgets (entries per KV head): "
             f"{', '.join(results['budgets'])}",
             f"- targets: {', '.join(meta['targets'])}",
             f"- adapter: {meta['adapter']['path'] if meta.get('adapter') else '-'}",
             f"- lkv {meta['environment']['lkv']}, torch {meta['environment']['torch']}, transformers "
             f"{meta['environment']['transformers']}; {meta['environment']['cuda'] or 'CPU'}", ""]
    for title, header, rows in sections(results):
        cells = [[str(c).replace("|", "\\|") for c in r] for r in [header, *rows]]  # "KL(GT||m)" in a table
        lines += [f"## {title}", "", "| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
        lines.append("")
    for plot in plots:
        lines += [f"![{Path(plot).stem}]({plot})", ""]
    return "\n".join(lines)


def plot(results: dict, folder: Path) -> list[str]:
    """PNG plots (matplotlib, Agg); returns their paths relative to ``folder``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    (folder / "plots").mkdir(exist_ok=True)
    budgets = results["budgets"]
    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(folder / "plots" / name, dpi=110)
        plt.close(fig)
        made.append(f"plots/{name}")

    if "prediction" in results:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, key in zip(axes, ("recall", "recall_nosink")):
            for name, entry in results["prediction"].items():
                ax.plot(budgets, [entry["budgets"][b][key] for b in budgets], marker="o", label=name)
            ax.set_xlabel("budget (entries per KV head)")
            ax.set_ylabel("GT-mass recall" + (" (excluding first 4)" if key != "recall" else ""))
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        save(fig, "recall_vs_budget.png")
    if _has(results, "critical_recall_by_layer"):
        fig, axes = plt.subplots(1, len(budgets), figsize=(4.5 * len(budgets), 4), sharey=True, squeeze=False)
        for ax, b in zip(axes[0], budgets):
            for name, entry in results["prediction"].items():
                values = entry["budgets"][b].get("critical_recall_by_layer")
                if values:
                    ax.plot(range(len(values)), values, marker=".", label=name)
            ax.set_title(f"budget {b}")
            ax.set_xlabel("layer")
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("critical recall (share of fact tokens kept)")
        axes[0][0].legend(fontsize=8)
        save(fig, "critical_by_layer.png")
    if "answers" in results:
        fig, ax = plt.subplots(figsize=(6, 4))
        ans = results["answers"]
        for name, entry in ans["methods"].items():
            ax.plot(budgets, [entry[b]["score"] for b in budgets], marker="o", label=name)
        if ans["full"]["score"] is not None:
            ax.axhline(ans["full"]["score"], color="black", linestyle="--", label="full cache")
        ax.set_xlabel("budget (entries per KV head)")
        ax.set_ylabel("answer accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "answers_vs_budget.png")
    if "overhead" in results:
        methods = {k: v for k, v in results["overhead"]["methods"].items() if k != "plain"}
        fig, ax = plt.subplots(figsize=(7, 4))
        names = sorted(methods, key=lambda n: methods[n]["overhead_pct"] or 0)
        ax.barh(names, [methods[n]["overhead_pct"] or 0 for n in names])
        ax.set_xlabel("time-to-first-token overhead vs plain prefill (%)")
        ax.grid(alpha=0.3, axis="x")
        save(fig, "overhead.png")
    return made


def write_results(folder: str | Path, config: dict, results: dict) -> dict:
    """Write config.json, results.json, report.md and plots into ``folder`` (predictions.jsonl is already there)."""
    folder = Path(folder)
    write_json_atomic(folder / "config.json", config)
    write_json_atomic(folder / "results.json", results)
    plots = plot(results, folder)
    write_bytes_atomic(folder / "report.md", markdown(results, plots).encode())
    return {"folder": str(folder), "report": str(folder / "report.md"), "plots": [str(folder / p) for p in plots]}


def rich_table(title: str, header: list[str], rows: list[list[str]]):
    """One table as a rich Table: first column left, the rest right-aligned."""
    table = Table(title=title, title_justify="left")
    for i, h in enumerate(header):
        table.add_column(h, justify="left" if i == 0 else "right")
    for r in rows:
        table.add_row(*r)
    return table


def rich_tables(results: dict) -> list:
    """The report's tables as rich Tables (the CLI prints them)."""
    return [rich_table(*section) for section in sections(results)]
