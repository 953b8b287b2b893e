"""``lkv export``: a training run's checkpoint into a bundle folder (:mod:`lkvcli.bundle`), with its
model card.

:func:`export` copies the checkpoint's adapter files into a temporary folder, writes ``lkv.json``
and the card, reads the bundle back and compares every tensor bit for bit with the checkpoint
(and, unless told not to, attaches it to the base model as a user would), then renames it into
place.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import faults
from .adapter_folder import AdapterFiles
from .config import Validated
from .adapters import attach
from .bundle import Bundle, check_parts, is_bundle, read_bundle, write_bundle
from .errors import LkvError
from .evict import DEFAULT_BUDGETS, parse_budget
from .files import read_json
from .hub import check_repo_id
from .models import BUILTIN_MODELS, load_model, same_model
from .report import sections
from .runs import checkpoint_step, read_checkpoint_adapter, read_config, read_run_info, val_history
from .scorers import get_scorer
from .version import __version__

@dataclass
class ExportConfig(Validated):
    """Settings of ``lkv export`` (recipe section ``export``)."""

    run: str | None = None  # the training run (default: the recipe's train.out)
    out: str | None = None  # the bundle folder to write
    checkpoint: str = "latest"  # step-N, N or latest
    eval: str | None = None  # results of `lkv eval` for the card (default: the recipe's eval.out, when evaluated)
    overwrite: bool = False
    base_model: str | None = None  # Hub id of the base model when training used a local copy
    license: str = "apache-2.0"
    model_check: bool = True  # also attach the bundle to the base model and compare
    device: str = "auto"
    push_to_hub: str | None = None  # ORG/NAME
    private: bool = False
    revision: str | None = None
    commit_message: str | None = None

    def validate(self) -> None:
        if self.push_to_hub:
            check_repo_id(self.push_to_hub)
        if self.base_model:
            check_repo_id(self.base_model)
        if not (self.checkpoint == "latest" or self.checkpoint.isdigit() or self.checkpoint.startswith("step-")):
            raise LkvError(f"checkpoint {self.checkpoint!r}: give step-N, N or latest")


TAGS = ["lookaheadkv", "kv-cache", "lkv"]
DEFAULT_BUDGET = 128
USAGE = '''from lkvcli import LookaheadKV

kv = LookaheadKV.from_pretrained("{repo}")  # bundle folder or Hub repo id; loads the base model too
prompt = open("README.md").read() + "\\n\\nIn one sentence, what is this text about?"  # any long prompt
print(kv.generate(prompt, budget=64, max_new_tokens=32))  # answered from 64 KV entries per head and layer
scores = kv.scores(prompt)  # (layers, kv_heads, prompt_len): predicted importance of every prompt entry'''
CITATION = """@inproceedings{ahn2026lookaheadkv,
  title     = {LookaheadKV: Fast and Accurate KV Cache Eviction by Glimpsing into the Future without Generation},
  author    = {Ahn and Seong and Kedia and Kim and Jang and Lee and Jeon},
  booktitle = {ICLR},
  year      = {2026},
  note      = {arXiv:2603.10899}
}"""


# ------------------------------------------------------------------ what lkv.json says
def base_model_id(source: str) -> str | None:
    """The Hub id of a model source: built-in names map to theirs; ``org/name`` that is not a local path is one."""
    if source in BUILTIN_MODELS:
        return BUILTIN_MODELS[source]["hub_id"]
    if source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).exists():
        return source
    return None


def _public(spec: str) -> str:
    """A data source without local directories (``hf:`` and ``builtin:`` specs are kept whole)."""
    return spec if spec.startswith(("hf:", "builtin:")) else Path(spec).name


def training_summary(run: Path, checkpoint: Path) -> dict:
    """Steps, validation KL at the checkpoint and at the start, and the data, from the run folder."""
    info, config, step = read_run_info(run), read_config(run), checkpoint_step(checkpoint)
    val = val_history(run, up_to=step)
    sources = []
    for folder in info.targets.get("folders", []):
        manifest = Path(folder) / "manifest.json"
        if manifest.is_file():
            sources.append(_public(str(json.loads(manifest.read_text()).get("data", ""))))
    return {
        "run": run.name, "checkpoint": checkpoint.name, "steps": step, "total_steps": info.total_steps,
        "val_kl": val[max(val)] if val else None, "val_kl_start": val.get(0),
        "trainable_parameters": info.trainable_parameters,
        "optimizer": {k: config.get(k) for k in ("optimizer", "lr", "schedule", "batch_size", "grad_accum", "seed")
                      if k in config},
        "data": {"sources": sources, "records": info.targets.get("records"), "train_records": info.train_records,
                 "val_records": len(info.val_ids), "settings": info.targets.get("settings", {})},
    }


def read_eval(folder: Path, fingerprint: dict) -> dict:
    """``results.json`` of ``lkv eval`` for this model (a results folder of another model is refused)."""
    results = read_json(folder / "results.json", "give the --out folder of `lkv eval`")
    if results.get("format") != "lkv-results":
        raise LkvError(f"{folder / 'results.json'} is not an `lkv eval` results file")
    theirs = results.get("meta", {}).get("fingerprint") or {}
    if theirs and not same_model(theirs, fingerprint):
        raise LkvError(f"--eval {folder}: those results are for another model ({results['meta'].get('model')}); "
                       "give the results of this run's model")
    return results


def scoring_settings(reduction: str, results: dict | None) -> dict:
    """The lookahead scorer's options (those ``lkv eval`` used when given, else its defaults)."""
    options = get_scorer("lookahead").options()
    if results and "lookahead" in results.get("scorers", {}):
        options.update(results["scorers"]["lookahead"])
    options.pop("adapter", None)
    return {"method": "lookahead", "reduction": reduction, **options}


def budgets(results: dict | None) -> dict:
    """Recommended budgets (entries per KV head): the evaluated ones, with the smallest whose lookahead
    GT-mass recall reaches 0.9 as the default; without results, the usual grid and 128."""
    if not results:
        return {"recommended": [parse_budget(b) for b in DEFAULT_BUDGETS], "default": DEFAULT_BUDGET,
                "source": "defaults"}
    labels = results.get("budgets", [])
    per = results.get("prediction", {}).get("lookahead", {}).get("budgets", {})
    good = [b for b in labels if (per.get(b) or {}).get("recall") is not None and per[b]["recall"] >= 0.9]
    chosen = good[0] if good else (labels[-1] if labels else str(DEFAULT_BUDGET))
    return {"recommended": [parse_budget(b) for b in labels], "default": parse_budget(chosen), "source": "eval"}


# ------------------------------------------------------------------ the model card
def _table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (pipes inside cells, as in ``KL(GT||m)``, escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


_ALLOCATION = {"uniform": "uniform (the same count in every KV head)",
               "heads": "heads (one top per layer across its KV heads)",
               "global": "global (one top over every full-attention layer's KV heads)"}


def _self_draft(scoring: dict) -> str:
    """The card's line for the lookahead scorer's ``draft_tokens`` option (bundles older than it: off)."""
    tokens = scoring.get("draft_tokens", 0)
    if not tokens:
        return "not used"
    how = "weighted sum" if scoring["draft_combine"] == "sum" else "larger of the weighted terms"
    return f"the first {tokens} greedy tokens' attention mixed in, weight {scoring['draft_weight']} ({how})"


def _pooling(scoring: dict) -> str:
    """The pooling setting in words (bundles written before ``pooling_keeps_peaks`` lack it)."""
    if scoring["pooling"] == "none":
        return "none"
    peaks = ", peaks kept" if scoring.get("pooling_keeps_peaks") else ""
    return f"{scoring['pooling']}, kernel {scoring['pooling_kernel']}{peaks}"


def model_card(meta: dict, repo: str, license_id: str, results: dict | None, plots: list[str]):
    """A ``huggingface_hub.ModelCard``: front matter for the Hub, usage, settings, training, evaluation."""
    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard_data import EvalResult

    base, train, la, scoring = meta["base_model"], meta["training"], meta["lookahead"], meta["scoring"]
    name = base["id"] or Path(base["source"]).name
    datasets = [s[3:].split(":")[0].split("@")[0] for s in train["data"]["sources"] if s.startswith("hf:")]
    evals = []
    for budget, entry in ((results or {}).get("prediction", {}).get("lookahead", {}).get("budgets", {})).items():
        if entry.get("recall") is not None:
            evals.append(EvalResult(task_type="kv-cache-eviction", task_name="KV-cache eviction",
                                    dataset_type="lkv-targets", dataset_name="held-out collected prompts",
                                    metric_type="gt_mass_recall", metric_name=f"GT-mass recall @ {budget}",
                                    metric_value=round(float(entry["recall"]), 4)))
    data = ModelCardData(base_model=base["id"], library_name="peft", tags=list(TAGS), license=license_id,
                         datasets=datasets or None, model_name=f"LookaheadKV {name}" if evals else None,
                         eval_results=evals or None)
    val = train.get("val_kl")
    body = [
        f"# LookaheadKV adapter for {name}", "",
        f"Learned KV-cache eviction ([LookaheadKV](https://arxiv.org/abs/2603.10899)) for `{name}`: "
        f"{meta['num_tokens']} trained soft tokens are appended after the prompt during prefill, with a LoRA active "
        "only on them; their attention over the prompt predicts which KV entries the response will read. The cache "
        "is then evicted to a budget per layer and KV head, and decoding runs on the plain model.", "",
        "## Usage", "", "```python", USAGE.format(repo=repo), "```", "",
        "`pip install lkvcli`. `LookaheadKV.from_pretrained(repo, model)` attaches to a model you already loaded; "
        "the LoRA (`adapter_config.json`, `adapter_model.safetensors`) is a regular peft adapter, but it must only "
        "be active on the lookahead tokens (`lookahead_embeddings.safetensors`), which LookaheadKV takes care of.", "",
        "## Settings", "",
        _table(["setting", "value"], [
            ["lookahead tokens", str(meta["num_tokens"])],
            ["LoRA", f"rank {la['lora_rank']}, alpha {la['lora_alpha']} on {', '.join(la['target_modules'])}"],
            ["query-head reduction (GQA)", scoring["reduction"]],
            ["protected", f"{scoring['sink_tokens']} sink tokens, last {scoring['recent_window']} positions"],
            ["pooling", _pooling(scoring)],
            ["allocation", _ALLOCATION[scoring.get("allocation", "uniform")]],
            ["the model's own first answer tokens", _self_draft(scoring)],
            ["budgets (entries per KV head)", f"{', '.join(map(str, meta['budgets']['recommended']))}; "
                                              f"default {meta['budgets']['default']}"],
        ]), "",
        "## Training", "",
        f"Distilled with lkv {meta['lkv_version']} for {train['steps']} steps on {train['data']['train_records']} "
        f"prompts ({', '.join(train['data']['sources']) or 'collected targets'}): forward KL from the attention of "
        "the model's own greedy response to the lookahead prediction. Validation KL "
        + (f"{train['val_kl_start']:.4g} -> " if train.get("val_kl_start") is not None else "")
        + (f"{val:.4g}" if val is not None else "not measured")
        + f" on {train['data']['val_records']} held-out prompts.", "",
    ]
    if results:
        body += ["## Evaluation", "", "Measured with `lkv eval` on held-out prompts; budgets are entries kept per "
                 "layer and KV head.", ""]
        for title, header, rows in sections(results):
            body += [f"### {title}", "", _table(header, rows), ""]
        body += [f"![{Path(p).stem}]({p})\n" for p in plots]
    body += ["## Citation", "", "```bibtex", CITATION, "```", ""]
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))


# ------------------------------------------------------------------ writing the bundle
def _write(folder: Path, run: Path, ckpt: AdapterFiles, *, base_model: str | None, eval_dir: Path | None,
           repo: str, license_id: str) -> dict:
    """Every bundle file of checkpoint ``ckpt`` of ``run`` into the (empty) ``folder``; returns lkv.json."""
    info = read_run_info(run)
    if not info.model.get("source") or not info.model.get("fingerprint"):
        raise LkvError(f"{run / 'run.json'} does not name the model it was trained for; the run folder is damaged")
    source, fingerprint = info.model["source"], info.model["fingerprint"]
    la = dataclasses.asdict(ckpt.config)
    results = read_eval(eval_dir, fingerprint) if eval_dir else None
    base_id = base_model or base_model_id(source)
    plots = []
    if results and (eval_dir / "plots").is_dir():
        (folder / "plots").mkdir()
        for png in sorted((eval_dir / "plots").glob("*.png")):
            shutil.copy2(png, folder / "plots" / png.name)
            plots.append(f"plots/{png.name}")
    meta = write_bundle(folder, ckpt, {
        "lkv_version": __version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_model": {"id": base_id, "source": source, "fingerprint": fingerprint},
        "num_tokens": int(ckpt.embeddings.shape[0]), "hidden_size": int(ckpt.embeddings.shape[1]),
        "lookahead": la, "scoring": scoring_settings(la.get("reduction", "mean"), results),
        "budgets": budgets(results), "training": training_summary(run, ckpt.folder.parent),
    }, base_id)
    model_card(meta, repo, license_id, results, plots).save(str(folder / "README.md"))
    return meta


# ------------------------------------------------------------------ export
def _check_out(out: Path, run: Path, overwrite: bool) -> None:
    if out.exists() and not overwrite:
        raise LkvError(f"{out} already exists; pass --overwrite to replace it or choose another --out")
    if out.exists() and not out.is_dir():
        raise LkvError(f"{out} exists and is not a folder; choose another --out")
    o, r = out.resolve(), run.resolve()
    if o == r or o in r.parents:
        raise LkvError(f"--out {out} would replace the training run itself; choose another folder")
    if out.exists() and any(out.iterdir()) and not is_bundle(out):
        raise LkvError(f"{out} is not an lkv bundle; --overwrite only replaces bundles, choose another --out")


def export(run: str | Path, out: str | Path, *, checkpoint: str = "latest", eval_dir: str | Path | None = None,
           overwrite: bool = False, base_model: str | None = None, repo: str | None = None,
           license_id: str = "apache-2.0", check_model: bool = True, device: str = "auto") -> dict:
    """Export ``run``'s checkpoint to the bundle folder ``out`` (atomic); returns a summary dict.

    ``check_model`` also loads the base model and attaches the bundle to it (:func:`lkvcli.adapters.attach`,
    as every user of the bundle does), comparing the tensors the model holds with the checkpoint.
    """
    run, out = Path(run), Path(out)
    if base_model:
        check_repo_id(base_model)
    _check_out(out, run, overwrite)
    ckpt = read_checkpoint_adapter(run, checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        meta = _write(tmp, run, ckpt, base_model=base_model, eval_dir=Path(eval_dir) if eval_dir else None,
                      repo=repo or out.name, license_id=license_id)
        back = read_bundle(tmp)
        check_parts("the bundle", back.lora, back.embeddings, ckpt)
        if check_model:
            _check_on_model(back, ckpt, device)
        _check_out(out, run, overwrite)
        _normal_permissions(tmp)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        faults.point("bundle-rename", out)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    return {"bundle": str(out), "checkpoint": ckpt.folder.parent.name, "step": checkpoint_step(ckpt.folder.parent), "base_model": meta["base_model"]["id"]
            or meta["base_model"]["source"], "num_tokens": meta["num_tokens"], "files": files,
            "bytes": sum(files.values()), "val_kl": meta["training"]["val_kl"], "verified_on_model": check_model}


def _normal_permissions(folder: Path) -> None:
    """mkdtemp makes a private folder; give the bundle the permissions of any other new folder."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _check_on_model(bundle: Bundle, ckpt: AdapterFiles, device: str) -> None:
    """Load the base model, attach the bundle as any user would, compare the tensors it holds."""
    from peft import get_peft_model_state_dict

    loaded = load_model(bundle.meta["base_model"]["source"], device=device, dtype="float32")
    if not same_model(loaded.fingerprint, bundle.meta["base_model"]["fingerprint"]):
        raise LkvError(f"the base model {bundle.meta['base_model']['source']} changed since training (fingerprints "
                       "differ); export where the training model is available, or pass --no-model-check")
    adapter = attach(loaded.model, bundle.adapter)
    # save_embedding_layers=False: "auto" would look the base model up on the Hub
    lora = get_peft_model_state_dict(adapter.peft_model, save_embedding_layers=False)
    check_parts("the adapter loaded onto the base model", lora, adapter.embeddings, ckpt)
