"""Load a trained lookahead module onto a model: the one loader behind ``lkv eval``, ``lkv export``'s
check, :class:`lkvcli.api.LookaheadKV` and the ``lookahead`` scorer.

It takes a bundle folder, a training run folder (its final ``adapter/``, else its latest
checkpoint), a checkpoint or an adapter folder.
"""

from __future__ import annotations

from pathlib import Path

from .adapter_folder import AdapterFiles, read_adapter
from .bundle import is_bundle, read_bundle
from .errors import LkvError
from .lookahead import LookaheadAdapter
from .models import prepare_model, same_model
from .runs import adapter_folder, read_run_info, run_of


def attach(model, files: AdapterFiles) -> LookaheadAdapter:
    """``files`` on ``model`` (modified in place: frozen, lkv's attention, LoRA layers injected and off),
    for inference: nothing of it requires grad."""
    prepare_model(model)
    adapter = LookaheadAdapter.attach(model, files.config)
    try:
        adapter.load_parts(files.lora, files.embeddings)
    except (ValueError, RuntimeError, KeyError) as exc:
        raise LkvError(f"the LoRA in {files.folder} does not fit this model ({str(exc).splitlines()[0]})") from None
    for _, param in adapter.named_parameters():
        param.requires_grad_(False)
    return adapter


def read_any(path) -> tuple[AdapterFiles, dict, dict | None]:
    """(adapter files, the model it was trained for, the bundle's lkv.json or None) at ``path``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise LkvError(f"adapter {path} not found; give a training run folder (lkv train --out) or a bundle")
    if is_bundle(path):
        bundle = read_bundle(path)
        return bundle.adapter, bundle.meta.get("base_model", {}), bundle.meta
    files = read_adapter(adapter_folder(path))
    run = run_of(files.folder)
    origin = files.meta.get("model") or (read_run_info(run).model if run else {})
    return files, origin, None


def load_adapter(path, model, fingerprint: dict | None = None) -> tuple[LookaheadAdapter, dict]:
    """Attach the adapter at ``path`` to ``model``; refuses one trained for another model when
    ``fingerprint`` (the model's) is given. Returns ``(adapter, info)``: the folder, the step, the
    source model, N, and for a bundle its scoring settings (``info["scoring"]``)."""
    files, origin, bundle_meta = read_any(path)
    kind = "adapter" if bundle_meta is None else "bundle"
    if fingerprint is not None and origin.get("fingerprint") and not same_model(origin["fingerprint"], fingerprint):
        raise LkvError(f"{kind} {path} was trained for another model ({origin.get('source', 'unknown')}); "
                       "evaluate it with that model, or train one for this model")
    adapter = attach(model, files)
    info = {"path": str(files.folder), "step": files.meta.get("step"), "model": origin.get("source"),
            "num_tokens": adapter.config.num_tokens}
    if bundle_meta is not None:
        info["step"] = bundle_meta.get("training", {}).get("step")
        info["scoring"] = {k: v for k, v in bundle_meta.get("scoring", {}).items() if k not in ("method", "reduction")}
    return adapter, info


def validation_ids(path) -> list[str] | None:
    """Ids of the validation records of the training run behind ``path`` (None when unknown)."""
    try:
        run = run_of(adapter_folder(Path(path)))
    except LkvError:
        return None
    return None if run is None else read_run_info(run).val_ids
