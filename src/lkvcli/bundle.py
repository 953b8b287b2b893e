"""The bundle (format ``lkv-bundle`` v1): a trained lookahead module as standard Hugging Face files.

    adapter_config.json, adapter_model.safetensors   the lookahead LoRA as a plain peft adapter
    lookahead_embeddings.safetensors                 ``embeddings``: the N soft tokens, (N, hidden) float32
    lkv.json                                         format, base model + fingerprint, settings, training summary
    README.md                                        model card (YAML front matter for the Hub)
    plots/*.png                                      evaluation plots (with ``--eval``)

:func:`export` writes it from a training run's checkpoint into a temporary folder, reads it back
and compares every tensor bit for bit with the checkpoint, then renames it into place.
:func:`attach_bundle` puts a bundle onto a loaded model (peft's own loader for the LoRA).
See docs/bundle.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from . import __version__
from .errors import LkvError

BUNDLE_FORMAT = "lkv-bundle"
BUNDLE_VERSION = 1
LKV_JSON = "lkv.json"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
EMBEDDINGS = "lookahead_embeddings.safetensors"
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


# ------------------------------------------------------------------ reading a run's checkpoint
@dataclass
class Checkpoint:
    """A training checkpoint's lookahead module, read from ``checkpoints/step-N/adapter``."""

    run: Path
    name: str  # step-000100
    meta: dict  # lookahead.json
    lora: dict  # peft state-dict names -> tensors
    embeddings: torch.Tensor

    @property
    def step(self) -> int:
        return int(self.name.split("-")[-1])


def read_tensors(path: Path, hint: str) -> dict[str, torch.Tensor]:
    """A safetensors file; a missing or unreadable one is an LkvError ending with ``hint``."""
    from safetensors.torch import load_file

    if not path.is_file():
        raise LkvError(f"{path} is missing; {hint}")
    try:
        return load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types
        raise LkvError(f"{path} is unreadable ({str(exc).splitlines()[0]}); {hint}") from None


def read_json(path: Path, hint: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise LkvError(f"{path} is missing; {hint}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise LkvError(f"{path} is not valid JSON ({exc}); {hint}") from None


def checkpoint_names(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step-*") if (p / "adapter").is_dir())


def find_checkpoint(run: Path, which: str = "latest") -> str:
    """``latest`` (the run's pointer, else the newest), ``step-N`` or ``N``: the checkpoint's folder name."""
    if not (run / "run.json").is_file():
        raise LkvError(f"{run} is not a training run folder (no run.json); give the --out folder of `lkv train`")
    names = checkpoint_names(run)
    if not names:
        raise LkvError(f"{run} has no checkpoint yet (checkpoints/step-N); train it first, or wait for its first "
                       "checkpoint (train.checkpoint_every)")
    if which == "latest":
        pointer = run / "checkpoints" / "latest"
        name = pointer.read_text().strip() if pointer.is_file() else ""
        return name if name in names else names[-1]
    name = which if which.startswith("step-") else f"step-{int(which):06d}" if which.isdigit() else which
    if name not in names:
        raise LkvError(f"--checkpoint {which}: not in {run / 'checkpoints'}; available: {', '.join(names)} or latest")
    return name


def read_checkpoint(run: Path, which: str = "latest") -> Checkpoint:
    from .lookahead import ADAPTER_FILE, ADAPTER_META

    name = find_checkpoint(run, which)
    folder = run / "checkpoints" / name / "adapter"
    others = [n for n in checkpoint_names(run) if n != name]
    hint = f"the checkpoint is damaged: export another one with --checkpoint ({', '.join(others) or 'none left'})"
    meta = read_json(folder / ADAPTER_META, hint)
    tensors = read_tensors(folder / ADAPTER_FILE, hint)
    if "embeddings" not in tensors or "config" not in meta:
        raise LkvError(f"{folder} holds no lookahead embeddings or settings; {hint}")
    lora = {k[len("lora."):]: v for k, v in tensors.items() if k.startswith("lora.")}
    return Checkpoint(run=run, name=name, meta=meta, lora=lora, embeddings=tensors["embeddings"])


# ------------------------------------------------------------------ what lkv.json says
def base_model_id(source: str) -> str | None:
    """The Hub id of a model source: built-in names map to theirs; ``org/name`` that is not a local path is one."""
    from .models import BUILTIN_MODELS

    if source in BUILTIN_MODELS:
        return BUILTIN_MODELS[source]["hub_id"]
    if source.count("/") == 1 and not source.startswith((".", "/", "~")) and not Path(source).exists():
        return source
    return None


def _public(spec: str) -> str:
    """A data source without local directories (``hf:`` and ``builtin:`` specs are kept whole)."""
    return spec if spec.startswith(("hf:", "builtin:")) else Path(spec).name


def training_summary(ckpt: Checkpoint) -> dict:
    """Steps, validation KL at the checkpoint and at the start, and the data, from the run folder."""
    run = ckpt.run
    info = read_json(run / "run.json", "the run folder is damaged")
    config = read_json(run / "config.json", "the run folder is damaged") if (run / "config.json").is_file() else {}
    val = {}
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("val_kl") is not None and row.get("step", 0) <= ckpt.step:
            val[row["step"]] = row["val_kl"]
    targets = info.get("targets", {})
    sources = []
    for folder in targets.get("folders", []):
        manifest = Path(folder) / "manifest.json"
        if manifest.is_file():
            sources.append(_public(str(json.loads(manifest.read_text()).get("data", ""))))
    return {
        "run": run.name, "checkpoint": ckpt.name, "steps": ckpt.step, "total_steps": info.get("total_steps"),
        "val_kl": val[max(val)] if val else None, "val_kl_start": val.get(0),
        "trainable_parameters": info.get("trainable_parameters"),
        "optimizer": {k: config.get(k) for k in ("optimizer", "lr", "schedule", "batch_size", "grad_accum", "seed")
                      if k in config},
        "data": {"sources": sources, "records": targets.get("records"), "train_records": info.get("train_records"),
                 "val_records": len(info.get("val_ids", [])), "settings": targets.get("settings", {})},
    }


def read_eval(folder: Path, fingerprint: dict) -> dict:
    """``results.json`` of ``lkv eval`` for this model (a results folder of another model is refused)."""
    from .models import same_model

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
    from .scorers import get_scorer

    options = get_scorer("lookahead").options()
    if results and "lookahead" in results.get("scorers", {}):
        options.update(results["scorers"]["lookahead"])
    options.pop("adapter", None)
    return {"method": "lookahead", "reduction": reduction, **options}


def budgets(results: dict | None) -> dict:
    """Recommended budgets (entries per KV head): the evaluated ones, with the smallest whose lookahead
    GT-mass recall reaches 0.9 as the default; without results, the usual grid and 128."""
    from .evaluate import DEFAULT_BUDGETS
    from .evict import parse_budget

    if not results:
        return {"recommended": [parse_budget(b) for b in DEFAULT_BUDGETS], "default": DEFAULT_BUDGET,
                "source": "defaults"}
    labels = results.get("budgets", [])
    per = results.get("prediction", {}).get("lookahead", {}).get("budgets", {})
    good = [b for b in labels if (per.get(b) or {}).get("recall") is not None and per[b]["recall"] >= 0.9]
    chosen = good[0] if good else (labels[-1] if labels else str(DEFAULT_BUDGET))
    return {"recommended": [parse_budget(b) for b in labels], "default": parse_budget(chosen), "source": "eval"}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------ the model card
def _table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (pipes inside cells, as in ``KL(GT||m)``, escaped)."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header)] + [line(r) for r in rows])


def model_card(meta: dict, repo: str, license_id: str, results: dict | None, plots: list[str]):
    """A ``huggingface_hub.ModelCard``: front matter for the Hub, usage, settings, training, evaluation."""
    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard_data import EvalResult

    from .report import sections

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
            ["pooling", scoring["pooling"] if scoring["pooling"] == "none"
             else f"{scoring['pooling']}, kernel {scoring['pooling_kernel']}"],
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


# ------------------------------------------------------------------ writing, reading, verifying
def _peft_config(la: dict, base_id: str | None):
    from peft import LoraConfig

    return LoraConfig(r=la["lora_rank"], lora_alpha=la["lora_alpha"], lora_dropout=la["lora_dropout"],
                      target_modules=list(la["target_modules"]), bias="none", task_type="CAUSAL_LM",
                      base_model_name_or_path=base_id, inference_mode=True)


def write_bundle(folder: Path, ckpt: Checkpoint, *, base_model: str | None = None, eval_dir: Path | None = None,
                 repo: str | None = None, license_id: str = "apache-2.0") -> dict:
    """Write every bundle file of ``ckpt`` into the (empty) ``folder``; returns lkv.json's content."""
    from safetensors.torch import save_file

    model = read_json(ckpt.run / "run.json", "the run folder is damaged").get("model") or {}
    if not model.get("source") or not model.get("fingerprint"):
        raise LkvError(f"{ckpt.run / 'run.json'} does not name the model it was trained for; the run folder is damaged")
    source, fingerprint = model["source"], model["fingerprint"]
    la = dict(ckpt.meta["config"])
    results = read_eval(eval_dir, fingerprint) if eval_dir else None
    base_id = base_model or base_model_id(source)
    _peft_config(la, base_id).save_pretrained(str(folder))
    save_file({k: v.contiguous() for k, v in ckpt.lora.items()}, str(folder / PEFT_WEIGHTS), metadata={"format": "pt"})
    save_file({"embeddings": ckpt.embeddings.contiguous()}, str(folder / EMBEDDINGS),
              metadata={"format": BUNDLE_FORMAT})
    plots = []
    if results and (eval_dir / "plots").is_dir():
        (folder / "plots").mkdir()
        for png in sorted((eval_dir / "plots").glob("*.png")):
            shutil.copy2(png, folder / "plots" / png.name)
            plots.append(f"plots/{png.name}")
    meta = {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "lkv_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "base_model": {"id": base_id, "source": source, "fingerprint": fingerprint},
        "num_tokens": int(ckpt.embeddings.shape[0]), "hidden_size": int(ckpt.embeddings.shape[1]),
        "lookahead": la, "scoring": scoring_settings(la.get("reduction", "mean"), results),
        "budgets": budgets(results), "training": training_summary(ckpt),
        "files": {n: {"sha256": sha256(folder / n), "bytes": (folder / n).stat().st_size} for n in (PEFT_WEIGHTS,
                                                                                                   EMBEDDINGS)},
    }
    (folder / LKV_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    model_card(meta, repo or folder.name, license_id, results, plots).save(str(folder / "README.md"))
    return meta


@dataclass
class Bundle:
    """A bundle read back from disk."""

    folder: Path
    meta: dict
    lora: dict
    embeddings: torch.Tensor


def is_bundle(folder: str | Path) -> bool:
    return (Path(folder) / LKV_JSON).is_file()


def read_bundle(folder: str | Path) -> Bundle:
    """Read and check a bundle: format, version, file checksums, tensor shapes."""
    folder = Path(folder)
    hint = "export it again with `lkv export RUN_DIR --out FOLDER --overwrite`"
    meta = read_json(folder / LKV_JSON, f"{folder} is not an lkv bundle; {hint}")
    if meta.get("format") != BUNDLE_FORMAT:
        raise LkvError(f"{folder / LKV_JSON} is not an lkv bundle file (format {meta.get('format')!r})")
    if meta.get("version", 0) > BUNDLE_VERSION:
        raise LkvError(f"{folder} is bundle format v{meta['version']}; this lkv reads up to v{BUNDLE_VERSION}: "
                       "upgrade lkvcli")
    for name, want in meta.get("files", {}).items():
        if (folder / name).is_file() and sha256(folder / name) != want["sha256"]:
            raise LkvError(f"{folder / name} does not match its checksum in {LKV_JSON} (damaged or edited); {hint}")
    read_json(folder / PEFT_CONFIG, hint)
    lora = read_tensors(folder / PEFT_WEIGHTS, hint)
    embeddings = read_tensors(folder / EMBEDDINGS, hint).get("embeddings")
    if embeddings is None or tuple(embeddings.shape) != (meta["num_tokens"], meta["hidden_size"]):
        raise LkvError(f"{folder / EMBEDDINGS} does not hold ({meta['num_tokens']}, hidden) embeddings; {hint}")
    return Bundle(folder=folder, meta=meta, lora=lora, embeddings=embeddings)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaN-safe, -0.0 != 0.0)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.detach().cpu().contiguous().view(torch.uint8), b.detach().cpu().contiguous().view(torch.uint8))


def check_parts(where: str, lora: dict, embeddings: torch.Tensor, ckpt: Checkpoint) -> None:
    """Every LoRA tensor and the embeddings equal the checkpoint's, bit for bit."""
    bad = sorted(set(lora) ^ set(ckpt.lora)) or [k for k in sorted(lora) if not same_bits(lora[k], ckpt.lora[k])]
    if bad or not same_bits(embeddings, ckpt.embeddings):
        raise LkvError(f"verification failed: {where} differs from checkpoint {ckpt.name} "
                       f"({bad[0] if bad else 'embeddings'}); nothing was written")


def attach_bundle(model, folder: str | Path, bundle: Bundle | None = None):
    """A :class:`~lkvcli.lookahead.LookaheadAdapter` on ``model`` (modified in place), with the bundle's LoRA
    loaded by peft's own ``PeftModel.from_pretrained`` and its embeddings."""
    from peft import PeftModel
    from torch import nn

    from .lookahead import LookaheadAdapter, LookaheadConfig
    from .models import prepare_model

    bundle = bundle or read_bundle(folder)
    prepare_model(model)
    config = LookaheadConfig(**bundle.meta["lookahead"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft calls a deprecated transformers helper
            peft_model = PeftModel.from_pretrained(model, str(bundle.folder), is_trainable=False)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise LkvError(f"the LoRA in {bundle.folder} does not fit this model ({str(exc).splitlines()[0]})") from None
    device = next(model.parameters()).device
    embeddings = nn.Parameter(bundle.embeddings.to(device), requires_grad=False)
    return LookaheadAdapter(peft_model, embeddings, config)


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

    ``check_model`` also loads the base model and attaches the bundle to it (the LoRA through
    ``PeftModel.from_pretrained``), comparing the tensors the model holds with the checkpoint.
    """
    run, out = Path(run), Path(out)
    if base_model:
        from .hub import check_repo_id

        check_repo_id(base_model)
    _check_out(out, run, overwrite)
    ckpt = read_checkpoint(run, checkpoint)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        meta = write_bundle(tmp, ckpt, base_model=base_model, eval_dir=Path(eval_dir) if eval_dir else None,
                            repo=repo or out.name, license_id=license_id)
        back = read_bundle(tmp)
        check_parts("the bundle", back.lora, back.embeddings, ckpt)
        if check_model:
            _check_on_model(tmp, back, ckpt, device)
        _check_out(out, run, overwrite)
        _normal_permissions(tmp)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    return {"bundle": str(out), "checkpoint": ckpt.name, "step": ckpt.step, "base_model": meta["base_model"]["id"]
            or meta["base_model"]["source"], "num_tokens": meta["num_tokens"], "files": files,
            "bytes": sum(files.values()), "val_kl": meta["training"]["val_kl"], "verified_on_model": check_model}


def _normal_permissions(folder: Path) -> None:
    """mkdtemp makes a private folder; give the bundle the permissions of any other new folder."""
    mask = os.umask(0)
    os.umask(mask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _check_on_model(folder: Path, bundle: Bundle, ckpt: Checkpoint, device: str) -> None:
    from .models import load_model, same_model

    loaded = load_model(bundle.meta["base_model"]["source"], device=device, dtype="float32")
    if not same_model(loaded.fingerprint, bundle.meta["base_model"]["fingerprint"]):
        raise LkvError(f"the base model {bundle.meta['base_model']['source']} changed since training (fingerprints "
                       "differ); export where the training model is available, or pass --no-model-check")
    from peft import get_peft_model_state_dict

    adapter = attach_bundle(loaded.model, folder, bundle)
    # save_embedding_layers=False: "auto" would look the base model up on the Hub
    lora = get_peft_model_state_dict(adapter.peft_model, save_embedding_layers=False)
    check_parts("the adapter loaded onto the base model", lora, adapter.embeddings, ckpt)
