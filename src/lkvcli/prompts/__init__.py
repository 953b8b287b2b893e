"""Prompt sources for lkv: files, Hugging Face datasets and a built-in generator over real text.

``load_prompts(spec)`` accepts:

* a ``.jsonl`` / ``.json`` / ``.parquet`` file whose records carry ``messages``, ``prompt``, or
  ``context`` + ``question`` (kvpress schema; optional ``id``, ``task``, ``answer`` (all must
  appear), ``answers`` (any is acceptable), ``metric``, ``system``, ``answer_prefix``,
  ``max_new_tokens``);
* a folder written by ``Dataset.save_to_disk`` (``PATH@SPLIT`` for a saved DatasetDict), or
  ``hf:NAME[:CONFIG][@SPLIT]`` (``datasets.load_dataset``). Without ``@SPLIT`` the split is
  ``test``, else ``train``, else the only split;
* ``builtin:[KEY=VAL,...]``: see :mod:`lkvcli.prompts.builtin`;
* a list of the above (or a ``.yaml`` file holding that list), each with a count and, for files and datasets, a mapping of the dataset's
  own columns onto these fields: a mixture (:mod:`lkvcli.prompts.mixture`,
  :mod:`lkvcli.prompts.mapping`).
"""

from __future__ import annotations

from pathlib import Path

from .builtin import generate, parse_options
from .files import is_saved_dataset, load_file, load_hub_dataset, load_saved_dataset
from .mapping import RowMapping
from .mixture import is_mixture_file, load_mixture, needs_tokenizer, read_mixture_file
from .records import METRICS, PromptRecord, PromptSourceError
from .tasks import TASKS

__all__ = ["METRICS", "TASKS", "PromptRecord", "PromptSourceError", "load_prompts", "needs_tokenizer"]


def _split_at(spec: str) -> tuple[str, str | None]:
    head, sep, split = spec.rpartition("@")
    return (head, split) if sep and head and split else (spec, None)


def load_prompts(spec: str | list, *, tokenizer=None, seed: int = 0, limit: int | None = None,
                 trust_remote_code: bool = False, mapping: RowMapping | None = None) -> list[PromptRecord]:
    """Resolve a --data spec to prompt records (the first ``limit`` of them when given).

    ``tokenizer`` and ``seed`` are used by ``builtin:`` only (token lengths and randomness);
    ``trust_remote_code`` by ``hf:`` only; ``mapping`` (a mixture entry's columns) by files and
    datasets. Raises :class:`PromptSourceError` with a one-line message naming the problem and the fix.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise PromptSourceError(f"limit={limit!r} is not valid; pass a positive integer or None")
    if is_mixture_file(spec):
        spec = read_mixture_file(spec)
    if isinstance(spec, (list, tuple)):
        def one(source: str, limit: int | None, mapping: RowMapping | None = None) -> list[PromptRecord]:
            return load_prompts(source, tokenizer=tokenizer, seed=seed, limit=limit,
                                trust_remote_code=trust_remote_code, mapping=mapping)

        records = load_mixture(list(spec), one, seed)
        return records if limit is None else records[:limit]
    spec = str(spec).strip()
    if not spec:
        raise PromptSourceError("empty data spec; pass a .jsonl/.json/.parquet file, a Dataset.save_to_disk "
                                "folder, hf:NAME[:CONFIG][@SPLIT] or builtin:[KEY=VAL,...]")
    if spec == "builtin" or spec.startswith("builtin:"):
        if mapping is not None:
            raise PromptSourceError(f"{spec}: columns, extract, template and shots apply to files and datasets, "
                                    "not to built-in prompts; drop them from this source")
        return generate(parse_options(spec[len("builtin:"):]), tokenizer=tokenizer, seed=seed, limit=limit)
    if spec.startswith("hf:"):
        rest, split = _split_at(spec[3:])
        name, _, config = rest.partition(":")
        if not name:
            raise PromptSourceError(f"{spec}: no dataset name; write hf:NAME[:CONFIG][@SPLIT]")
        return load_hub_dataset(name, config or None, split, limit=limit, trust_remote_code=trust_remote_code,
                                mapping=mapping)

    path = Path(spec).expanduser()
    if not path.exists():
        head, split = _split_at(spec)
        if split is not None and is_saved_dataset(Path(head).expanduser()):
            return load_saved_dataset(Path(head).expanduser(), split, limit, mapping)
        raise PromptSourceError(f"{spec}: no such file or folder; check the path "
                                "(or use hf:NAME[:CONFIG][@SPLIT] or builtin:)")
    if path.is_dir():
        if is_saved_dataset(path):
            return load_saved_dataset(path, None, limit, mapping)
        raise PromptSourceError(f"{spec}: folder is not a saved dataset (no dataset_info.json, state.json or "
                                "dataset_dict.json); pass a .jsonl/.json/.parquet file or a Dataset.save_to_disk folder")
    records = load_file(path, mapping)
    return records if limit is None else records[:limit]
