"""The prompt record type, its error type, and conversion of raw dataset rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

METRICS = ("contains_all", "contains_any", "exact", "rouge_l", "agreement")
ACCEPTED_FIELDS = "'messages' (list of {role, content}), 'prompt' (string), or 'context' + 'question'"
_KNOWN_FIELDS = {
    "id", "messages", "prompt", "context", "question", "answer", "answers", "task",
    "metric", "system", "answer_prefix", "max_new_tokens",
}


class PromptSourceError(ValueError):
    """A --data spec cannot be turned into prompts; the message names the problem and the fix."""


@dataclass
class PromptRecord:
    """One prompt.

    ``messages`` is always filled. When ``context`` and ``question`` are set, ``messages`` is a
    single user message ``context + "\\n\\n" + question``, so a context-only eviction mode can
    compress ``context`` and feed ``question`` afterwards.

    ``metric`` says how to score a generated answer against ``answer``:
    ``contains_all`` (every answer string appears in the output; a str answer is one string),
    ``contains_any`` (at least one appears), ``exact`` (normalised output equals the answer),
    ``rouge_l``, or ``agreement`` (open-ended: compare with the full-cache answer; ``answer`` is None).
    """

    id: str
    messages: list[dict]
    task: str | None = None
    answer: str | list[str] | None = None
    context: str | None = None
    question: str | None = None
    metric: str | None = None
    meta: dict = field(default_factory=dict)


def join_context_question(context: str, question: str) -> str:
    """The user message for a context + question record: context, blank line, question."""
    return f"{context}\n\n{question}"


def _present(row: dict, key: str) -> bool:
    return key in row and row[key] is not None


def _check_messages(value: Any, where: str) -> list[dict]:
    fix = "it must be a non-empty list of {\"role\": str, \"content\": str} objects"
    if not isinstance(value, (list, tuple)) or not value:
        raise PromptSourceError(f"{where}: 'messages' has the wrong shape ({type(value).__name__}); {fix}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise PromptSourceError(f"{where}: 'messages' item {i} has the wrong shape ({m!r:.80}); {fix}")
        out.append({"role": m["role"], "content": m["content"]})
    while out and out[-1]["role"] == "assistant":  # SFT data ends with the reference reply: the model writes its own
        out.pop()
    if not out:
        raise PromptSourceError(f"{where}: 'messages' holds only assistant turns; it needs a user turn to answer")
    return out


def _check_str(row: dict, key: str, where: str) -> str | None:
    if not _present(row, key):
        return None
    value = row[key]
    if not isinstance(value, str):
        raise PromptSourceError(f"{where}: '{key}' must be a string, got {type(value).__name__}; fix that field")
    return value


def _answer(row: dict, where: str) -> tuple[str | list[str] | None, str | None]:
    """(answer, default metric). 'answer' list -> contains_all; 'answers' list -> contains_any."""
    for key, list_metric in (("answer", "contains_all"), ("answers", "contains_any")):
        if not _present(row, key) or row[key] == [] or row[key] == "":
            continue
        value = row[key]
        if isinstance(value, str):
            return value, "contains_all"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value), "contains_all"
        if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float)) for v in value):
            return [str(v) for v in value], list_metric
        raise PromptSourceError(f"{where}: '{key}' must be a string or a list of strings, got {value!r:.60}; fix that field")
    return None, None


def record_from_row(row: Any, *, default_id: str, where: str, source: str) -> PromptRecord:
    """Convert one raw row (JSON object, parquet/dataset row) into a PromptRecord.

    Accepted shapes: ``messages`` (trailing assistant turns, an SFT set's reference reply, are
    dropped and kept as ``meta["reference"]``); ``prompt`` (+ optional ``system``); ``context`` + ``question``
    (kvpress schema, + optional ``system``). Optional: ``id``, ``task``, ``answer`` (str or list:
    all must appear), ``answers`` (list: any is acceptable), ``metric``, ``answer_prefix``,
    ``max_new_tokens``. Other fields go to ``meta``. ``None`` values count as absent.
    """
    if not isinstance(row, dict):
        raise PromptSourceError(f"{where}: expected a JSON object, got {type(row).__name__}; "
                                f"each record must be an object with {ACCEPTED_FIELDS}")
    system = _check_str(row, "system", where)
    context = _check_str(row, "context", where)
    question = _check_str(row, "question", where)
    reference = None
    if _present(row, "messages"):
        messages = _check_messages(row["messages"], where)
        if len(messages) < len(row["messages"]):
            reference = row["messages"][len(messages)]["content"]
    elif _present(row, "prompt"):
        prompt = _check_str(row, "prompt", where)
        messages = [{"role": "user", "content": prompt}]
    elif context is not None and question is not None:
        messages = [{"role": "user", "content": join_context_question(context, question)}]
    else:
        have = sorted(k for k in row if _present(row, k))
        half = " (has 'context' but no 'question')" if context is not None else (
            " (has 'question' but no 'context')" if question is not None else "")
        raise PromptSourceError(f"{where}: record has none of the accepted fields{half}; it has {have}; "
                                f"give it {ACCEPTED_FIELDS}")
    if system is not None and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system}] + messages
    if context is None or question is None:
        context = question = None

    answer, metric = _answer(row, where)
    explicit = _check_str(row, "metric", where)
    if explicit is not None:
        if explicit not in METRICS:
            raise PromptSourceError(f"{where}: unknown metric {explicit!r}; use one of {', '.join(METRICS)}")
        metric = explicit
    elif metric is None:
        metric = "agreement"

    task = row.get("task")
    if task is not None and not isinstance(task, str):
        task = str(task)
    rid = str(row["id"]) if _present(row, "id") else default_id
    meta: dict = {key: value for key, value in row.items() if key not in _KNOWN_FIELDS and value is not None}
    for key in ("answer_prefix", "max_new_tokens"):
        if _present(row, key):
            meta[key] = row[key]
    if reference is not None:
        meta["reference"] = reference
    meta["source"] = source
    return PromptRecord(id=rid, messages=messages, task=task, answer=answer, context=context,
                        question=question, metric=metric, meta=meta)
