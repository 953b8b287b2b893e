"""What a training step reads: the train/validation split, the seeded data order, the prompts'
prefills kept across epochs, and the loss of a micro-batch.

Each prompt is prefilled alone without grad (adapter off; kept across epochs by
:class:`PrefillCache` within ``prefill_cache_mb``), the prompts are left-padded into one batch
cache, and the N lookahead tokens run over it with grad (adapter on).
"""

from __future__ import annotations

import hashlib

import torch
from transformers import DynamicCache

from ..errors import LkvError
from ..lookahead import LookaheadAdapter, left_pad
from ..models import LoadedModel, same_model
from ..objective import ObjectiveConfig, loss_per_example, record_row_weights, record_target
from ..targets import TargetsReader
from .config import TrainConfig


def split_records(ids: list[str], val_split: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, validation) indices; validation = the records whose seeded id hash is smallest."""
    count = int(val_split) if val_split >= 1 else round(val_split * len(ids))
    if count >= len(ids):
        raise LkvError(f"val_split: {val_split} leaves no training records out of {len(ids)}")
    rank = sorted(range(len(ids)), key=lambda i: _rank(seed, ids[i]))
    val = sorted(rank[:count])
    chosen = set(val)
    return [i for i in range(len(ids)) if i not in chosen], val


def usable_split(reader: TargetsReader, config: TrainConfig) -> tuple[list[int], list[int]]:
    """(train, validation) record indices, leaving out ``exclude_tasks``; checks the objective's targets exist."""
    excluded = set(config.exclude_tasks)
    tasks = {reader.meta(i).get("task") for i in range(len(reader))}
    unknown = sorted(excluded - tasks)
    if unknown:
        raise LkvError(f"exclude_tasks: no record has task {unknown[0]!r}; tasks in these targets: "
                       f"{', '.join(sorted(map(str, tasks)))}")
    usable = [i for i in range(len(reader)) if reader.meta(i).get("task") not in excluded]
    if not usable:
        raise LkvError("exclude_tasks leaves no record to train on")
    if config.objective.needs_max and any("max" not in reader.meta(i).get("extra_targets", []) for i in usable):
        raise LkvError(f"objective.target={config.objective.target} needs max targets, which {reader.folders[0]} "
                       "lacks; re-collect with extra_targets=max (collect's default) or use objective.target=mean")
    ids = [reader.ids()[i] for i in usable]
    train, val = split_records(ids, config.val_split, config.seed)
    if config.train_records is not None and config.train_records < len(train):
        # nested subsets: a smaller learning-curve point trains on a subset of a larger one's records
        keep = set(sorted(train, key=lambda i: _rank(config.seed, "train", ids[i]))[:config.train_records])
        train = [i for i in train if i in keep]
    return [usable[i] for i in train], [usable[i] for i in val]


def _rank(seed: int, *parts: str) -> bytes:
    return hashlib.sha256(":".join((str(seed), *parts)).encode()).digest()


def data_order(train: list[int], seed: int, start: int, count: int) -> list[int]:
    """Positions ``start..start+count`` of the endless stream of seeded per-epoch permutations."""
    n, perms = len(train), {}
    for epoch in range(start // n, (start + count - 1) // n + 1):
        perms[epoch] = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return [train[perms[pos // n][pos % n]] for pos in range(start, start + count)]


class PrefillCache:
    """Each prompt prefilled alone (keys and values per layer), kept in CPU memory for later epochs:
    first come, first kept while the tensor bytes fit in ``budget_mb`` (never evicted); per process.

    Prompts are prefilled one by one, cached or not, and only then left-padded into a batch: a
    prompt's cache then does not depend on what it is batched with, so caching changes nothing.
    """

    def __init__(self, budget_mb: float = 0.0):
        self.budget, self.used, self.hits, self.misses = int(budget_mb * 2**20), 0, 0, 0
        self.kept: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def prompt(self, adapter: LookaheadAdapter, record) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) of every layer, each (1, kv_heads, length, head_dim), of ``record``'s prompt alone."""
        if record.id in self.kept:
            self.hits += 1
            return self.kept[record.id]
        self.misses += 1
        layers = [(layer.keys, layer.values) for layer in adapter.prefill(record.prompt_ids.view(1, -1)).layers]
        size = sum(t.numel() * t.element_size() for pair in layers for t in pair)
        if self.used + size <= self.budget and not torch.is_inference_mode_enabled():  # unusable under grad
            self.kept[record.id] = layers = [(k.cpu(), v.cpu()) for k, v in layers]
            self.used += size
        return layers

    def batch(self, adapter: LookaheadAdapter, records):
        """The records' prompts left-padded into one ``DynamicCache`` (pad entries zero)."""
        prompts = [self.prompt(adapter, r) for r in records]
        cache = DynamicCache(config=adapter.base_model.config)
        for i, layer in enumerate(cache.layers):
            keys, values = (_right_align([p[i][j] for p in prompts], adapter.device) for j in (0, 1))
            layer.update(keys, values)
            if hasattr(layer, "cumulative_length"):  # sliding window: it holds fewer keys than it has seen
                layer.cumulative_length = max(r.prompt_len for r in records)
        return cache

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "prompts": len(self.kept), "mb": self.used / 2**20,
                "budget_mb": self.budget / 2**20}


def _right_align(parts: list[torch.Tensor], device) -> torch.Tensor:
    """(1, H, l_b, D) tensors into one (B, H, max l_b, D), each at the right end, zeros before it."""
    width = max(t.shape[-2] for t in parts)
    out = parts[0].new_zeros((len(parts), parts[0].shape[1], width, parts[0].shape[-1]), device=device)
    for row, t in enumerate(parts):
        out[row, :, width - t.shape[-2]:] = t[0]
    return out


def batch_loss(adapter: LookaheadAdapter, records, prefills: PrefillCache | None = None,
               objective: ObjectiveConfig | None = None) -> torch.Tensor:
    """(B,) loss of each record's prediction under ``objective`` (None: KL against the mean target,
    the validation metric); the records are left-padded into one batch."""
    mask = left_pad([r.prompt_ids for r in records])[1]
    if bool(mask.all()):
        mask = None
    cache = (prefills if prefills is not None else PrefillCache()).batch(adapter, records)
    pred = adapter.score(cache, attention_mask=mask)
    target = torch.zeros_like(pred)
    for row, record in enumerate(records):
        target[row, ..., target.shape[-1] - record.prompt_len:] = (record_target(record, objective) if objective
                                                                    else record.target)
    weights = (torch.stack([record_row_weights(r, objective) for r in records])
               if objective and objective.copy_head_weight else None)
    return loss_per_example(target, pred, objective, weights)


def batch_kl(adapter: LookaheadAdapter, records, prefills: PrefillCache | None = None) -> torch.Tensor:
    """(B,) KL(mean target || prediction) of each record."""
    return batch_loss(adapter, records, prefills)


def check_targets(reader: TargetsReader, loaded: LoadedModel, config: TrainConfig) -> None:
    manifest = reader.manifest
    if not same_model(reader.fingerprint, loaded.fingerprint):
        differ = [k for k in ("config", "tokenizer", "weights") if reader.fingerprint.get(k) != loaded.fingerprint.get(k)]
        raise LkvError(f"data: targets in {reader.folders[0]} were collected for model {manifest['model']['source']!r}, "
                       f"not for the loaded {loaded.source!r} (fingerprints differ: {', '.join(differ)}); train with "
                       "that model or collect targets with this one")
    reduction = manifest.get("settings", {}).get("reduction", config.lookahead.reduction)
    if reduction != config.lookahead.reduction:
        raise LkvError(f"lookahead.reduction: {config.lookahead.reduction!r} differs from the targets' {reduction!r}; "
                       f"set lookahead.reduction={reduction}")
    if len(reader) == 0:
        raise LkvError(f"data: {reader.folders[0]} holds no records yet")


def validation_kl(adapter: LookaheadAdapter, records, indices: list[int], batch_size: int,
             accelerator=None, prefills: PrefillCache | None = None) -> float | None:
    """Mean per-example KL(target || lookahead) over the ``indices`` of ``records`` (a targets reader or
    :class:`lkvcli.context_mode.TrainingRecords`), split across processes."""
    if not indices:
        return None
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = indices[rank::world]
    total = torch.zeros(2, dtype=torch.float64, device=adapter.device)
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            kl = batch_kl(adapter, [records[j] for j in mine[i:i + batch_size]], prefills)
            total[0] += kl.sum().double()
            total[1] += kl.numel()
    if world > 1:
        total = accelerator.reduce(total, "sum")
    return float(total[0] / total[1])
