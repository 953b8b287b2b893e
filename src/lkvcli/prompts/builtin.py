"""The ``builtin:`` prompt generator: RULER-style tasks over vendored real text.

Spec: ``builtin:`` or ``builtin:KEY=VAL,KEY=VAL`` with keys
``n`` (prompts, default 8), ``min_tokens`` / ``max_tokens`` (length of the user message,
default 1000 / 2000), ``tasks`` (``+``-separated task names, or ``all`` / ``default`` / ``closed`` /
``open``; default ``default``, the eight original tasks), ``texts`` (``+``-separated text domains
of :mod:`lkvcli.prompts.corpus`, ``plays`` / ``code`` / ``docs``, or ``all``; default ``plays``) and
``seed`` (overrides the ``seed`` argument). With several domains, each task meets them in turn.

Lengths are of the user message text (chat-template tokens not included), counted with
``len(tokenizer(text, add_special_tokens=False).input_ids)`` when a tokenizer is given; without
one they are *estimated* as ceil(words / 0.75) (1 token ~ 0.75 words).
Each prompt's target is drawn uniformly in [min_tokens, max_tokens] and the text is trimmed
(line by line) to the largest size that stays within the target.

Tasks are assigned round-robin over a seeded shuffle of the task list, so the mix is balanced;
each record depends only on (seed, index, task, min_tokens, max_tokens, domain, tokenizer), so the
same options give byte-identical prompts, and ``limit`` / a smaller ``n`` give a prefix. Records
over ``plays`` keep the ids and seeds they had before domains existed; others carry the domain in
their id (``needle-code-0-3``).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Callable

from .corpus import DOMAINS
from .drafts import Draft, TaskContext
from .records import PromptRecord, PromptSourceError, join_context_question
from .tasks import CLOSED_TASKS, DEFAULT_TASKS, OPEN_TASKS, TASKS

MIN_TOKENS_FLOOR = 200
TOLERANCE = 0.05
_KEYS = ("n", "min_tokens", "max_tokens", "tasks", "texts", "seed")
_GROUPS = {"all": tuple(TASKS), "default": DEFAULT_TASKS, "closed": CLOSED_TASKS, "open": OPEN_TASKS}


@dataclass(frozen=True)
class BuiltinOptions:
    n: int = 8
    min_tokens: int = 1000
    max_tokens: int = 2000
    tasks: tuple[str, ...] = DEFAULT_TASKS
    texts: tuple[str, ...] = ("plays",)
    seed: int | None = None


def _int(key: str, value: str, minimum: int) -> int:
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise PromptSourceError(f"builtin: {key}={value} is not valid; {key} must be an integer >= {minimum}")
    return number


def _tasks(value: str) -> tuple[str, ...]:
    out: list[str] = []
    for name in value.split("+"):
        name = name.strip()
        if name in _GROUPS:
            out += _GROUPS[name]
        elif name in TASKS:
            out.append(name)
        else:
            accepted = ", ".join([*TASKS, *_GROUPS])
            raise PromptSourceError(f"builtin: unknown task {name!r} in tasks={value!r}; accepted: {accepted} "
                                    "(join several with '+')")
    return tuple(out)


def _texts(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in value.split("+")))
    if "all" in names:
        return DOMAINS
    bad = [n for n in names if n not in DOMAINS]
    if bad:
        raise PromptSourceError(f"builtin: unknown text domain {bad[0]!r} in texts={value!r}; accepted: "
                                f"{', '.join(DOMAINS)}, all (join several with '+')")
    return names


def parse_options(text: str) -> BuiltinOptions:
    """Parse the part after ``builtin:`` (may be empty)."""
    values: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (s.strip() for s in item.partition("="))
        if key not in _KEYS:
            raise PromptSourceError(f"builtin: unknown option {key!r}; accepted options: {', '.join(_KEYS)} "
                                    "(e.g. builtin:n=16,min_tokens=500,max_tokens=1000,tasks=needle+summarise)")
        if not sep or not value:
            raise PromptSourceError(f"builtin: option {key!r} has no value; write {key}=VALUE")
        if key in values:
            raise PromptSourceError(f"builtin: option {key!r} given twice; keep one")
        if key == "tasks":
            values[key] = _tasks(value)
        elif key == "texts":
            values[key] = _texts(value)
        elif key == "seed":
            values[key] = _int(key, value, -(2**63))
        elif key == "n":
            values[key] = _int(key, value, 1)
        else:
            values[key] = _int(key, value, MIN_TOKENS_FLOOR)
    opts = BuiltinOptions(**values)
    if opts.min_tokens > opts.max_tokens:
        raise PromptSourceError(f"builtin: min_tokens={opts.min_tokens} is above max_tokens={opts.max_tokens}; "
                                "make min_tokens <= max_tokens")
    return opts


def derived_rng(*parts: Any) -> random.Random:
    """A Random seeded from a stable hash of ``parts`` (independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def token_counter(tokenizer) -> Callable[[str], int]:
    """Tokens in a text: the tokenizer's count, or the estimate ceil(words / 0.75) without one."""
    if tokenizer is None:
        return lambda text: -(-4 * len(text.split()) // 3)  # ceil(words / 0.75)

    def count(text: str) -> int:
        encoded = tokenizer(text, add_special_tokens=False)
        ids = getattr(encoded, "input_ids", None)
        return len(encoded["input_ids"] if ids is None else ids)

    return count


def fit(draft: Draft, count: Callable[[str], int], target: int, lo_tokens: int, hi_tokens: int
        ) -> tuple[int, str, str, int]:
    """Largest size whose message has <= target tokens (one more if that is still in range and
    brings the prompt up to ``lo_tokens``). Returns (size, context, question, tokens)."""
    cache: dict[int, tuple[str, str, int]] = {}

    def measure(size: int) -> tuple[str, str, int]:
        if size not in cache:
            context, question = draft.render(size)
            cache[size] = (context, question, count(join_context_question(context, question)))
        return cache[size]

    lo, hi = draft.min_size, max(draft.max_size, draft.min_size)
    if measure(lo)[2] > target:
        best = lo
    elif measure(hi)[2] <= target:
        best = hi
    else:  # invariant: tokens(lo) <= target < tokens(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if measure(mid)[2] <= target:
                lo = mid
            else:
                hi = mid
        best = lo
    if measure(best)[2] < lo_tokens and best < draft.max_size and measure(best + 1)[2] <= hi_tokens:
        best += 1
    return (best, *measure(best))


def generate(opts: BuiltinOptions, *, tokenizer=None, seed: int = 0, limit: int | None = None) -> list[PromptRecord]:
    seed = opts.seed if opts.seed is not None else seed
    count = token_counter(tokenizer)
    order = list(opts.tasks)
    derived_rng("lkv-builtin-order", seed, "+".join(order)).shuffle(order)
    n = opts.n if limit is None else min(opts.n, limit)
    records = []
    for index in range(n):
        task = order[index % len(order)]
        domain = opts.texts[index // len(order) % len(opts.texts)]  # every task meets every domain in turn
        plays = domain == "plays"  # the original prompts keep their seeds and ids
        rng = derived_rng("lkv-builtin", seed, index, task, opts.min_tokens, opts.max_tokens, *([] if plays else [domain]))
        target = rng.randint(opts.min_tokens, opts.max_tokens)
        draft = TASKS[task](TaskContext(rng=rng, target=target, count=count, domain=domain))
        size, context, question, tokens = fit(draft, count, target, opts.min_tokens, opts.max_tokens)
        if not (opts.min_tokens * (1 - TOLERANCE) <= tokens <= opts.max_tokens * (1 + TOLERANCE)):
            raise PromptSourceError(f"builtin: task {task!r} (index {index}) came out at {tokens} tokens, outside "
                                    f"[{opts.min_tokens}, {opts.max_tokens}]; widen the range or raise min_tokens")
        meta = {
            "source": "builtin", "seed": seed, "index": index, "target_tokens": target,
            "prompt_tokens": tokens, "token_count": "tokenizer" if tokenizer is not None else "estimate_words/0.75",
            "size": size, **draft.meta,
        }
        answer = draft.answer
        if draft.describe is not None:
            meta.update(draft.describe(context))
            answer = meta.pop("answer", answer)  # tasks whose answer depends on the final passage
        records.append(PromptRecord(
            id=f"{task}-{seed}-{index}" if plays else f"{task}-{domain}-{seed}-{index}",
            messages=[{"role": "user", "content": join_context_question(context, question)}],
            task=task, answer=answer, context=context, question=question, metric=draft.metric,
            meta=meta if plays else {**meta, "domain": domain},
        ))
    return records
