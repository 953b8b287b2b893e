"""The targets folder: ground-truth attention records written by ``lkv collect``, read by train and eval.

Layout (format ``lkv-targets`` version 1, documented in docs/formats.md)::

    OUT/manifest.json               model fingerprint, settings, lkv version
    OUT/records.jsonl               one JSON object per record, appended as shard files land
    OUT/targets-00000.safetensors   tensors of up to ``records_per_file`` records
    OUT/pending/, OUT/pending.jsonl each finished record at once, until its shard is written

Every file is written aside and renamed into place; a record line is appended only once
its tensors are on disk, and a finished record is durable in ``pending/`` before it waits
for its shard, so a crash at any moment loses at most the record in flight and never leaves
a corrupt file. Several folders (for example the
``shard-I-of-N`` folders of a parallel collection) read as one.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .version import __version__
from .attention import normalise
from .errors import LkvError
from .files import append_line, load_file, read_jsonl, remove_leftovers, save_tensors_atomic, sha256, write_bytes_atomic, write_json_atomic
from .models import same_model

FORMAT = "lkv-targets"
VERSION = 1
MANIFEST = "manifest.json"
RECORDS = "records.jsonl"
PENDING = "pending"  # finished records not yet in a shard: PENDING/NNNNNN.safetensors + PENDING.jsonl
STORAGE_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass
class TargetRecord:
    """One collected example: token ids, the dense renormalised target and its metadata."""

    id: str
    prompt_ids: torch.Tensor  # (L,) int64
    response_ids: torch.Tensor  # (R,) int64
    target: torch.Tensor  # (layers, kv_heads, L) float32, each row sums to 1 (or is all zero)
    meta: dict = field(default_factory=dict)
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. "max": same shape, renormalised

    @property
    def prompt_len(self) -> int:
        return int(self.prompt_ids.numel())


COPY_MIN_RUN = 4  # shortest run of tokens shared by response and prompt that counts as copied


def copied_runs(prompt: list[int], response: list[int], n: int = COPY_MIN_RUN) -> list[tuple[int, int]]:
    """Prompt ranges ``[i, i + n)`` whose n tokens also occur in a row in the response; together they
    cover every prompt position inside a run of >= n tokens shared by response and prompt."""
    grams = {tuple(response[j : j + n]) for j in range(len(response) - n + 1)}
    return [(i, i + n) for i in range(len(prompt) - n + 1) if tuple(prompt[i : i + n]) in grams]


def sparsify(target: torch.Tensor, mass: float, top_k: int | None = None) -> dict[str, torch.Tensor]:
    """Per (layer, head) row, the fewest positions holding ``mass`` of the total (at most ``top_k``), with values.

    Indices are int16 when the prompt is shorter than 32768 tokens, else int32.
    """
    rows = target.reshape(-1, target.shape[-1]).float()
    values, order = rows.sort(dim=-1, descending=True)
    cum = values.cumsum(-1)
    total = cum[:, -1:].clamp_min(1e-30)
    keep = ((cum - values) < mass * total).sum(-1).clamp_min(1)  # prefix that first reaches `mass`
    if top_k:
        keep = keep.clamp_max(top_k)
    offsets = torch.zeros(rows.shape[0] + 1, dtype=torch.int64)
    offsets[1:] = keep.cumsum(0)
    idx = torch.cat([order[r, : int(k)] for r, k in enumerate(keep)])
    val = torch.cat([values[r, : int(k)] for r, k in enumerate(keep)])
    index_dtype = torch.int16 if target.shape[-1] <= torch.iinfo(torch.int16).max else torch.int32
    return {"indices": idx.to(index_dtype), "values": val, "offsets": offsets}


def densify(indices, values, offsets, shape) -> torch.Tensor:
    rows = torch.zeros(shape[0] * shape[1], shape[2], dtype=torch.float32)
    counts = offsets[1:] - offsets[:-1]
    row_of = torch.repeat_interleave(torch.arange(rows.shape[0]), counts)
    rows[row_of, indices.long()] = values.float()
    return rows.view(shape)


class TargetsWriter:
    """Append records to a targets folder; resumable, atomic, refuses another model's folder."""

    def __init__(self, folder: str | Path, manifest: dict, *, overwrite: bool = False, records_per_file: int = 16,
                 repair: bool = False):
        self.folder = Path(folder)
        self.manifest = manifest
        self.records_per_file = max(1, records_per_file)
        self.storage = manifest["settings"]["storage"]
        self.dtype = STORAGE_DTYPES[manifest["settings"]["storage_dtype"]]
        self.sparse_mass = manifest["settings"].get("sparse_mass", 0.99)
        self.sparse_top_k = manifest["settings"].get("sparse_top_k")
        self._pending: list[tuple[dict, dict]] = []
        self.repaired: list[str] = []  # ids of the records dropped by repair (collected again)
        self._open(overwrite)
        if repair:
            self._repair()

    def _open(self, overwrite: bool) -> None:
        path = self.folder / MANIFEST
        if self.folder.exists() and not self.folder.is_dir():
            raise LkvError(f"{self.folder} is a file; give a folder for the targets")
        remove_leftovers(self.folder)
        if path.is_file() and overwrite:
            self._wipe()
        elif path.is_file():
            old = read_manifest(self.folder)
            if not same_model(old["model"]["fingerprint"], self.manifest["model"]["fingerprint"]):
                theirs, ours = old["model"]["fingerprint"], self.manifest["model"]["fingerprint"]
                raise LkvError(
                    f"{self.folder} holds targets collected for another model ({old['model']['source']}, weights "
                    f"{theirs.get('weights')} vs {ours.get('weights')}); use another --out folder, or --overwrite "
                    "to replace them"
                )
            if old["settings"] != self.manifest["settings"]:
                diff = sorted(k for k in set(old["settings"]) | set(self.manifest["settings"])
                              if old["settings"].get(k) != self.manifest["settings"].get(k))
                raise LkvError(
                    f"{self.folder} was collected with other settings ({', '.join(diff)}); re-run with the same "
                    "settings to resume, use another --out folder, or --overwrite"
                )
        elif self.folder.is_dir() and any(not p.name.startswith(".") for p in self.folder.iterdir()):
            raise LkvError(f"{self.folder} exists and is not a targets folder; give an empty or new --out folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            write_json_atomic(path, self.manifest)
        self.records = _read_records(self.folder, repair=True)
        self.done_ids = {r["id"] for r in self.records}
        referenced = {r["file"] for r in self.records}
        for orphan in (p for p in self.folder.glob("targets-*.safetensors") if p.name not in referenced):
            orphan.unlink()  # written by a run that died before appending its records' lines
        self._next_file = max((int(Path(name).stem.split("-")[1]) for name in referenced), default=-1) + 1
        self._restore_pending()

    def _restore_pending(self) -> None:
        """Finished records of an interrupted run that were waiting for their shard: back in the queue."""
        for row in read_jsonl(self.folder / f"{PENDING}.jsonl", repair=True):
            path = self.folder / PENDING / row.pop("pending")
            if row["id"] not in self.done_ids and path.is_file():
                self._pending.append((row, load_file(str(path))))
                self.done_ids.add(row["id"])  # durable: not to be collected again
        if not self._pending:  # none left waiting (their shard was written before the crash)
            (self.folder / f"{PENDING}.jsonl").unlink(missing_ok=True)
            shutil.rmtree(self.folder / PENDING, ignore_errors=True)
        elif len(self._pending) >= self.records_per_file:
            self.flush()

    def _repair(self) -> None:
        """Drop the records whose shard file is missing or fails its checksum (records.jsonl rewritten
        atomically, the damaged files deleted), so that resuming collects exactly them again."""
        damaged = {name for name in {r["file"] for r in self.records} if shard_problem(self.folder, name, self.records)}
        if not damaged:
            return
        keep = [r for r in self.records if r["file"] not in damaged]
        self.repaired = [r["id"] for r in self.records if r["file"] in damaged]
        write_bytes_atomic(self.folder / RECORDS, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep).encode())
        for name in damaged:
            (self.folder / name).unlink(missing_ok=True)
        self.records = keep
        self.done_ids = {r["id"] for r in keep} | {m["id"] for m, _ in self._pending}

    def _wipe(self) -> None:
        for p in self.folder.iterdir():
            if p.name in (MANIFEST, RECORDS, f"{PENDING}.jsonl") or p.name.startswith("targets-") or p.name.endswith(".tmp"):
                p.unlink()
            elif p.is_dir() and (p.name.startswith("shard-") or p.name == PENDING):
                shutil.rmtree(p)

    def add(self, meta: dict, prompt_ids: torch.Tensor, response_ids: torch.Tensor, target: torch.Tensor,
            extras: dict[str, torch.Tensor] | None = None) -> None:
        """Queue one record (``extras``: further targets of the same shape by name, such as ``max``);
        shard files are written every ``records_per_file`` records."""
        rid = meta["id"]
        if rid in self.done_ids:
            raise LkvError(f"record id {rid!r} is already in {self.folder}; record ids must be unique")
        tensors = {
            f"{rid}.prompt_ids": prompt_ids.reshape(-1).to("cpu", torch.int32),
            f"{rid}.response_ids": response_ids.reshape(-1).to("cpu", torch.int32),
        }
        for name, tensor in {"": target, **(extras or {})}.items():
            tensors.update(self._target_tensors(f"{rid}.{name}" if name else rid, tensor.detach().float().cpu()))
        meta = {**meta, "prompt_len": int(prompt_ids.numel()), "response_len": int(response_ids.numel()),
                "target_shape": list(target.shape)}
        if extras:
            meta["extra_targets"] = sorted(extras)
        # durable at once, before it waits for its shard: a crash loses at most the record in flight
        name = f"{len(self._pending):06d}.safetensors"
        (self.folder / PENDING).mkdir(exist_ok=True)
        save_tensors_atomic(self.folder / PENDING / name, tensors)
        append_line(self.folder / f"{PENDING}.jsonl", json.dumps({**meta, "pending": name}, ensure_ascii=False))
        self._pending.append((meta, tensors))
        self.done_ids.add(rid)
        if len(self._pending) >= self.records_per_file:
            self.flush()

    def _target_tensors(self, prefix: str, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """``PREFIX.target`` (dense) or ``PREFIX.indices/values/offsets`` (sparse)."""
        if self.storage == "dense":
            return {f"{prefix}.target": target.to(self.dtype)}
        parts = sparsify(target, self.sparse_mass, self.sparse_top_k)
        parts["values"] = parts["values"].to(self.dtype)
        return {f"{prefix}.{k}": v for k, v in parts.items()}

    def flush(self) -> None:
        """Write queued records: the shard file first, then their lines in records.jsonl."""
        if not self._pending:
            return
        name = f"targets-{self._next_file:05d}.safetensors"
        tensors = {k: v for _, t in self._pending for k, v in t.items()}
        # one metadata key: safetensors writes a map of several in a random order, and a shard must be reproducible
        save_tensors_atomic(self.folder / name, tensors, metadata={"format": f"{FORMAT}/{VERSION}"})
        digest = sha256(self.folder / name)
        lines = []
        for meta, _ in self._pending:
            meta = {**meta, "file": name, "sha256": digest}
            lines.append(json.dumps(meta, ensure_ascii=False) + "\n")
            self.records.append(meta)
            self.done_ids.add(meta["id"])
        append_line(self.folder / RECORDS, "".join(lines))
        (self.folder / f"{PENDING}.jsonl").unlink(missing_ok=True)  # their records are in the shard now
        shutil.rmtree(self.folder / PENDING, ignore_errors=True)
        self._next_file += 1
        self._pending = []

    def close(self) -> None:
        self.flush()


def shard_problem(folder: Path, name: str, records: list[dict]) -> str | None:
    """Why shard ``name`` cannot be trusted (missing, or not the bytes its records.jsonl lines hash), or None."""
    path = Path(folder) / name
    if not path.is_file():
        return "missing"
    want = {r.get("sha256") for r in records if r["file"] == name} - {None}
    if want and sha256(path) not in want:
        return "damaged (its sha256 differs from records.jsonl)"
    return None


def read_manifest(folder: Path) -> dict:
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise LkvError(f"{folder} is not a targets folder (no {MANIFEST}); run `lkv collect --out {folder}` first")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise LkvError(f"{path} is not valid JSON ({exc.msg}); re-collect into a new folder") from exc
    if manifest.get("format") != FORMAT:
        raise LkvError(f"{path} is not an lkv targets manifest")
    if manifest.get("version", 0) > VERSION:
        raise LkvError(f"{folder} uses targets format v{manifest['version']}; upgrade lkv to read it")
    return manifest


def _read_records(folder: Path, repair: bool = False) -> list[dict]:
    return read_jsonl(folder / RECORDS, repair, fix="delete that line to re-collect it")


def expand_folders(paths) -> list[Path]:
    """A folder holding ``shard-*`` sub-folders stands for those folders."""
    out = []
    for p in [paths] if isinstance(paths, (str, Path)) else paths:
        p = Path(p)
        shards = sorted(d for d in p.glob("shard-*") if (d / MANIFEST).is_file()) if p.is_dir() else []
        if shards and not (p / MANIFEST).is_file():
            out.extend(shards)
        else:
            out.append(p)
    return out


class TargetsReader:
    """Read one or several targets folders as one sequence of :class:`TargetRecord`."""

    def __init__(self, paths):
        self.folders = expand_folders(paths)
        if not self.folders:
            raise LkvError("no targets folder given")
        self.manifests = [read_manifest(f) for f in self.folders]
        first = self.manifests[0]
        for folder, m in zip(self.folders[1:], self.manifests[1:]):
            if not same_model(first["model"]["fingerprint"], m["model"]["fingerprint"]):
                raise LkvError(f"{folder} was collected for another model than {self.folders[0]}; read them separately")
        self.entries: list[tuple[Path, dict]] = []
        self._verified: set[Path] = set()
        seen = set()
        for folder in self.folders:
            for rec in _read_records(folder):
                if rec["id"] in seen:
                    continue
                seen.add(rec["id"])
                self.entries.append((folder, rec))

    @property
    def manifest(self) -> dict:
        return self.manifests[0]

    @property
    def fingerprint(self) -> dict:
        return self.manifest["model"]["fingerprint"]

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def ids(self) -> list[str]:
        return [rec["id"] for _, rec in self.entries]

    def meta(self, i: int) -> dict:
        return self.entries[i][1]

    def _verify(self, folder: Path, name: str) -> None:
        """A shard's checksum, once per reader: a damaged file names itself, its records and the fix."""
        path = folder / name
        if path in self._verified:
            return
        records = [rec for f, rec in self.entries if f == folder and rec["file"] == name]
        problem = shard_problem(folder, name, records)
        if problem:
            ids = [rec["id"] for rec in records]
            shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
            raise LkvError(f"{path} is {problem}: records {shown} cannot be read; run the same `lkv collect` "
                           "with --repair to collect exactly those again")
        self._verified.add(path)

    def __getitem__(self, i: int) -> TargetRecord:
        folder, rec = self.entries[i]
        rid, path = rec["id"], folder / rec["file"]
        self._verify(folder, rec["file"])
        try:
            with safe_open(str(path), framework="pt") as fh:
                get = fh.get_tensor
                prompt_ids = get(f"{rid}.prompt_ids").long()
                response_ids = get(f"{rid}.response_ids").long()
                keys, shape = set(fh.keys()), rec["target_shape"]

                def dense(prefix: str) -> torch.Tensor:
                    if f"{prefix}.target" in keys:
                        return get(f"{prefix}.target").float()
                    return densify(get(f"{prefix}.indices"), get(f"{prefix}.values"), get(f"{prefix}.offsets"), shape)

                target = dense(rid)
                extras = {name: normalise(dense(f"{rid}.{name}")) for name in rec.get("extra_targets", [])}
        except Exception as exc:  # noqa: BLE001 - any unreadable shard is the same user problem
            raise LkvError(f"{path}: cannot read record {rid!r} ({exc}); re-collect into a new folder") from exc
        return TargetRecord(id=rid, prompt_ids=prompt_ids, response_ids=response_ids,
                            target=normalise(target), meta=rec, extras=extras)


def new_manifest(source: str, fingerprint: dict, settings: dict, num_layers: int, num_kv_heads: int) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "lkv_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": {"source": source, "fingerprint": fingerprint},
        "num_layers": num_layers,
        "num_kv_heads": num_kv_heads,
        "settings": settings,
    }
