"""``lkv collect``: generate each prompt's greedy response and record its ground-truth attention.

Ground truth (method.md): for each layer and KV head, the attention of the response's
queries to the prompt positions, reduced over the query heads of the group, averaged
over the response tokens and renormalised over the prompt. The queries are captured
while the response is decoded (each step's query is exactly the teacher-forced one), so
no second pass and no full attention matrix are needed. The response excludes the stop
token; when generation stops at ``max_new_tokens`` the last token is fed once more so
that every response token contributes its query.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from .attention import capture_attention
from .chat import chat_ids
from .config import Validated
from .errors import LkvError
from .generate import greedy_decode, prefill, stop_token_ids
from .locks import folder_lock
from .preempt import StopRequest
from .models import DEFAULT_MODEL, LoadedModel, chat_template_digest, load_model
from .progress import Event, Listener, ignore
from .prompts import PromptSourceError, load_prompts, needs_tokenizer
from .shapes import context_length, num_kv_heads, num_layers
from .targets import TargetsWriter, new_manifest


@dataclass
class CollectConfig(Validated):
    """Settings of ``lkv collect`` (recipe section ``collect``)."""

    model: str = DEFAULT_MODEL
    data: str | list[dict] = "builtin:"  # a spec, or a mixture: [{data: SPEC, count: N}, ...]
    out: str = "targets"
    max_new_tokens: int = 512
    reduction: Literal["mean", "max"] = "mean"
    # also record each entry's largest attention from any single response token (train objective.target=max|mix)
    extra_targets: list[Literal["max"]] = field(default_factory=lambda: ["max"])
    storage: Literal["dense", "sparse"] = "dense"
    storage_dtype: Literal["float16", "bfloat16", "float32"] = "float16"
    sparse_mass: float = 0.99
    sparse_top_k: int | None = None
    seed: int = 0
    limit: int | None = None
    num_shards: int = 1
    shard_index: int = 0
    records_per_file: int = 16
    strict: bool = False
    overwrite: bool = False
    repair: bool = False  # drop the records of missing or damaged shard files first, then collect them again
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise LkvError("max_new_tokens must be at least 1")
        if not 0 < self.sparse_mass <= 1:
            raise LkvError("sparse_mass must be in (0, 1], for example 0.99")
        if self.num_shards < 1 or not 0 <= self.shard_index < self.num_shards:
            raise LkvError(f"shard_index must be in 0..{self.num_shards - 1} (num_shards={self.num_shards})")
        if self.sparse_top_k is not None and self.sparse_top_k < 1:
            raise LkvError("sparse_top_k must be at least 1 (or unset)")
        if self.limit is not None and self.limit < 1:
            raise LkvError("limit must be at least 1")

    def settings(self, chat_template: str) -> dict:
        """What must match for a folder to be resumed: everything that changes a target."""
        s = {k: getattr(self, k) for k in ("max_new_tokens", "reduction", "storage", "storage_dtype")}
        if self.extra_targets:  # absent when empty: folders from before it existed still resume
            s["extra_targets"] = sorted(set(self.extra_targets))
        if self.storage == "sparse":
            s["sparse_mass"] = self.sparse_mass
            s["sparse_top_k"] = self.sparse_top_k
        s["chat_template"] = chat_template
        return s

    def apply_launcher_env(self, env: dict) -> None:
        """Under ``torchrun`` / ``accelerate launch``: one shard per process, one GPU per local rank."""
        world, rank = int(env.get("WORLD_SIZE", 1)), int(env.get("RANK", 0))
        if world > 1 and self.num_shards == 1:
            self.num_shards, self.shard_index = world, rank
            if self.device == "auto" and torch.cuda.is_available():
                self.device = f"cuda:{int(env.get('LOCAL_RANK', 0))}"

    def out_folder(self) -> Path:
        out = Path(self.out)
        return out / f"shard-{self.shard_index}-of-{self.num_shards}" if self.num_shards > 1 else out


@dataclass
class CollectSummary:
    folder: str
    prompts: int = 0
    written: int = 0
    already_done: int = 0
    repaired: int = 0  # records of damaged shard files dropped and collected again
    skipped_too_long: int = 0
    skipped_empty: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    seconds: float = 0.0


def critical_spans(tokenizer, text: str, prompt) -> list[dict] | None:
    """The prompt's ``critical_chars`` (character spans in its last message) as token spans
    ``{"fact", "text", "span": [start, end)}`` of the chat-formatted ``text``: every token that
    overlaps the characters. None when the prompt has none (or its message is not in ``text``)."""
    chars = prompt.meta.get("critical_chars")
    base = text.rfind(prompt.messages[-1]["content"])
    if not chars or base < 0:
        return None
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
    out = []
    for fact in chars:
        start, end = (base + c for c in fact["chars"])
        tokens = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
        if tokens:
            out.append({"fact": fact["fact"], "text": fact["text"], "span": [tokens[0], tokens[-1] + 1]})
    return out or None


def ground_truth(model, prompt_ids: torch.Tensor, max_new_tokens: int, stop_ids: set[int],
                 reduction: str = "mean") -> tuple[list[int], torch.Tensor | None, str]:
    """Greedy response and its ground-truth target (layers, kv_heads, L) for one prompt (batch 1)."""
    tokens, targets, reason = ground_truth_targets(model, prompt_ids, max_new_tokens, stop_ids, reduction)
    return tokens, targets.get("mean"), reason


@torch.inference_mode()
def ground_truth_targets(model, prompt_ids: torch.Tensor, max_new_tokens: int, stop_ids: set[int],
                         reduction: str = "mean", extras: tuple[str, ...] = ()) -> tuple[list[int], dict, str]:
    """Greedy response and its targets, each (layers, kv_heads, L) and renormalised: ``mean`` (the
    response tokens' mean attention) and, per name in ``extras``, ``max`` (the largest attention any
    single response token pays each entry). Empty dict when the response is empty."""
    prompt_len = prompt_ids.shape[1]
    with ExitStack() as stack:
        caps = {rows: stack.enter_context(capture_attention(model, key_len=prompt_len, query_start=prompt_len,
                                                            reduction=reduction, rows=rows))
                for rows in ("mean", *extras)}
        state = prefill(model, prompt_ids)
        tokens, reason = greedy_decode(model, state, max_new_tokens, stop_ids, feed_last=True)
    if not tokens:
        return tokens, {}, reason
    return tokens, {name: cap.scores()[0] for name, cap in caps.items()}, reason


def collect(config: CollectConfig, *, loaded: LoadedModel | None = None, on_event: Listener | None = None) -> CollectSummary:
    """Run a collection; resumable (records already in the folder are skipped). Never prints.

    ``on_event`` receives :class:`~lkvcli.progress.Event`s: ``start``, then one ``advance`` per
    prompt (written or skipped; ``data["summary"]`` holds the summary so far).
    """
    emit = on_event or ignore
    config.apply_launcher_env(dict(os.environ))
    config.validate()

    def read_prompts(tokenizer=None):
        try:
            return load_prompts(config.data, tokenizer=tokenizer, seed=config.seed, limit=config.limit,
                                trust_remote_code=config.trust_remote_code)
        except PromptSourceError as exc:
            raise LkvError(str(exc)) from exc

    try:
        builtin = needs_tokenizer(config.data)
    except PromptSourceError as exc:
        raise LkvError(str(exc)) from exc
    prompts = None if builtin else read_prompts()  # bad data fails before the model loads
    loaded = loaded or load_model(config.model, device=config.device, dtype=config.dtype,
                                  trust_remote_code=config.trust_remote_code)
    model, tokenizer = loaded.model, loaded.tokenizer
    if prompts is None:
        prompts = read_prompts(tokenizer)  # built-in prompts are sized in this model's tokens
    if not prompts:
        raise LkvError(f"--data {config.data} gave no prompts; check the file or the builtin options")
    mine = [(i, p) for i, p in enumerate(prompts) if i % config.num_shards == config.shard_index]

    settings = config.settings(chat_template_digest(tokenizer))
    manifest = new_manifest(loaded.source, loaded.fingerprint, settings, num_layers(model), num_kv_heads(model))
    manifest["data"] = config.data
    with folder_lock(config.out_folder(), "lkv collect"):  # one writer per targets folder
        writer = TargetsWriter(config.out_folder(), manifest, overwrite=config.overwrite, repair=config.repair,
                               records_per_file=config.records_per_file)
        summary = CollectSummary(folder=str(config.out_folder()), prompts=len(mine))
        todo = [(i, p) for i, p in mine if p.id not in writer.done_ids]
        summary.already_done = len(mine) - len(todo)
        summary.repaired = len(writer.repaired)
        limit_ctx = context_length(model)
        stop_ids = stop_token_ids(model, tokenizer)
        emit(Event("start", "collect", summary.already_done, len(mine), f"{summary.already_done}/{len(mine)} already done"))
        started = time.perf_counter()

        def advance(skipped: str | None = None) -> None:
            summary.seconds = time.perf_counter() - started
            rate = (summary.prompt_tokens + summary.response_tokens) / max(summary.seconds, 1e-9)
            done = summary.already_done + summary.written + summary.skipped_too_long + summary.skipped_empty
            emit(Event("advance", "collect", done, len(mine), f"records, {rate:,.0f} tok/s, "
                       f"{summary.response_tokens} generated" + (f" (skipped: {skipped})" if skipped else ""),
                       data={"summary": summary}))
        try:
            with StopRequest() as stop:  # SIGTERM / SIGUSR1: finish (or, after the grace period, drop) the record
                for index, prompt in todo:
                    stop.check()
                    outcome = collect_record(loaded, prompt, index, config, limit_ctx, stop_ids)
                    if isinstance(outcome, str):
                        summary.skipped_too_long += outcome == "too long"
                        summary.skipped_empty += outcome == "empty response"
                        advance(f"{prompt.id} {outcome}")
                        continue
                    meta, prompt_ids, tokens, targets = outcome
                    writer.add(meta, prompt_ids, torch.tensor(tokens), targets.pop("mean"), extras=targets)
                    summary.written += 1
                    summary.prompt_tokens += len(prompt_ids)
                    summary.response_tokens += len(tokens)
                    advance()
        finally:
            writer.close()
            summary.seconds = time.perf_counter() - started
    return summary


def collect_record(loaded: LoadedModel, prompt, index: int, config: CollectConfig, limit_ctx: int | None,
                   stop_ids: set[int]):
    """One prompt: ``(meta, prompt_ids, response_ids, targets)`` for the writer, or why it is skipped
    (``"too long"``, ``"empty response"``)."""
    tokenizer = loaded.tokenizer
    ids, text = chat_ids(tokenizer, prompt.messages)
    if limit_ctx and len(ids) + config.max_new_tokens > limit_ctx:
        if config.strict:
            raise LkvError(f"prompt {prompt.id!r} has {len(ids)} tokens; with max_new_tokens={config.max_new_tokens} "
                           f"it exceeds the model's context of {limit_ctx}; shorten it, or drop --strict to skip such "
                           "prompts")
        return "too long"
    prompt_ids = torch.tensor([ids], device=loaded.device)
    tokens, targets, reason = ground_truth_targets(loaded.model, prompt_ids, config.max_new_tokens, stop_ids,
                                                   config.reduction, tuple(sorted(set(config.extra_targets))))
    if not targets:
        return "empty response"
    meta = {
        "id": prompt.id, "index": index, "task": prompt.task, "answer": prompt.answer,
        "metric": prompt.metric, "context": prompt.context, "question": prompt.question,
        "messages": prompt.messages, "prompt_text": text,
        "response_text": tokenizer.decode(tokens, skip_special_tokens=True), "stop_reason": reason,
        "extra": prompt.meta,
    }
    spans = critical_spans(tokenizer, text, prompt)
    if spans:
        meta["critical_spans"] = spans
    return meta, prompt_ids[0], tokens, targets


def summary_dict(summary: CollectSummary) -> dict:
    return asdict(summary)
