"""LookaheadKV: Ahn et al., "LookaheadKV: Fast and Accurate KV Cache Eviction by Glimpsing into the Future
without Generation" (ICLR 2026, arXiv 2603.10899)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import LkvError
from .base import ScoreContext, Scorer, register


@register("lookahead")
@dataclass
class Lookahead(Scorer):
    """The trained lookahead module's score: N learned tokens run over the prompt's cache with
    the lookahead LoRA on; their attention over the prompt, per KV head, renormalised. The
    entries they add are removed again. In the ``context`` mode they follow the context.

    The adapter comes from ``ctx.resources["adapter"]`` (a :class:`lkvcli.lookahead.LookaheadAdapter`)
    or is loaded from ``adapter`` (a training run folder or a bundle).
    """

    needs = ("adapter", "extra_forward")
    adapter: str | None = None
    query_reduction: Literal["mean", "max"] | None = None  # None: the adapter's own (lookahead.query_reduction)

    def _adapter(self, ctx: ScoreContext):
        found = ctx.resources.get("adapter")
        if found is None:
            if self.adapter is None:
                raise LkvError("the lookahead method needs an adapter: pass --adapter RUN_DIR_OR_BUNDLE")
            found = ctx.resources["adapter"] = load_adapter(self.adapter, ctx.model)[0]
        return found

    def raw_scores(self, ctx: ScoreContext):
        adapter = self._adapter(ctx)
        override = {"query_reduction": self.query_reduction} if self.query_reduction else {}
        return adapter.score(ctx.state.cache, prompt_len=ctx.prompt_len, attention_mask=ctx.attention_mask, **override)


def _adapter_folder(path: Path) -> Path:
    """The folder holding ``lookahead.json``: the given one, a run's ``adapter/``, or its latest checkpoint's."""
    from ..lookahead import ADAPTER_META

    candidates = [path, path / "adapter"]
    latest = path / "checkpoints" / "latest"
    if latest.is_file():
        candidates.append(path / "checkpoints" / latest.read_text().strip() / "adapter")
    for folder in candidates:
        if (folder / ADAPTER_META).is_file():
            return folder
    raise LkvError(f"{path} holds no lookahead adapter; give a training run folder (lkv train --out), its adapter/ "
                   "folder, a checkpoint, or an exported bundle")


def _run_json(folder: Path) -> dict | None:
    """The training run's run.json at or above an adapter folder (run/, run/adapter, run/checkpoints/step-N/adapter)."""
    for parent in [folder, *list(folder.parents)[:3]]:
        path = parent / "run.json"
        if path.is_file():
            return json.loads(path.read_text())
    return None


def validation_ids(path) -> list[str] | None:
    """Ids of the validation records of the training run behind ``path`` (None when unknown)."""
    try:
        run = _run_json(_adapter_folder(Path(path)))
    except LkvError:
        return None
    return None if run is None else run.get("val_ids")


def load_adapter(path, model, fingerprint: dict | None = None):
    """Attach the adapter at ``path`` (run folder, adapter folder, checkpoint or bundle) to ``model``.

    Refuses an adapter trained for another model when ``fingerprint`` (the model's) is given.
    Returns ``(adapter, info)`` where info names the folder, the step and the source model.
    """
    from ..lookahead import ADAPTER_META, LookaheadAdapter
    from ..models import same_model

    path = Path(path).expanduser()
    if not path.exists():
        raise LkvError(f"adapter {path} not found; give a training run folder (lkv train --out) or a bundle")
    if (path / "lkv.json").is_file():
        return _load_bundle(path, model, fingerprint)
    folder = _adapter_folder(path)
    meta = json.loads((folder / ADAPTER_META).read_text())
    run = _run_json(folder) or {}
    origin = meta.get("model") or run.get("model") or {}
    if fingerprint is not None and origin.get("fingerprint") and not same_model(origin["fingerprint"], fingerprint):
        raise LkvError(f"adapter {path} was trained for another model ({origin.get('source', 'unknown')}); "
                       "evaluate it with that model, or train one for this model")
    adapter = LookaheadAdapter.load(model, folder)
    return adapter, {"path": str(folder), "step": meta.get("step"), "model": origin.get("source"),
                     "num_tokens": adapter.config.num_tokens}


def _load_bundle(path: Path, model, fingerprint: dict | None):
    """An exported bundle (``lkv export``); its scoring settings come back in ``info["scoring"]``."""
    from ..bundle import attach_bundle, read_bundle
    from ..models import same_model

    bundle = read_bundle(path)
    base = bundle.meta.get("base_model", {})
    if fingerprint is not None and base.get("fingerprint") and not same_model(base["fingerprint"], fingerprint):
        raise LkvError(f"bundle {path} was trained for another model ({base.get('source', 'unknown')}); "
                       "evaluate it with that model")
    adapter = attach_bundle(model, path, bundle)
    scoring = {k: v for k, v in bundle.meta.get("scoring", {}).items() if k not in ("method", "reduction")}
    return adapter, {"path": str(path), "step": bundle.meta.get("training", {}).get("step"),
                     "model": base.get("source"), "num_tokens": adapter.config.num_tokens, "scoring": scoring}
