"""Built-in RULER-style tasks over real text: the synthetic-fact tasks, and ``TASKS``, the registry of
every task (those asking about the text itself are in :mod:`.text_tasks`). One small function per task.

A task function gets a :class:`TaskContext` (seeded rng, token target, token counter) and returns
a :class:`Draft`: ``render(size) -> (context, question)`` whose length grows with ``size``
(haystack lines, or list entries for ``freq_words``). The generator picks ``size`` to hit the
token target. All random choices are drawn before rendering, so a draft is deterministic.

Tasks with checkable answers also record, in ``meta["critical_chars"]``, the character spans
of the facts the answer needs in the final context (:func:`fact_spans`): ``lkv collect`` turns
them into token spans of the prompt (``critical_spans``) for ``lkv eval``'s critical recall.
"""

from __future__ import annotations

import random
import re
from typing import Callable

from .corpus import vocabulary
from .drafts import Draft, TaskContext, haystack_draft
from .text_tasks import chat, explain, list_task, passage_qa, summarise

_ADJECTIVES = (
    "amber", "brave", "calm", "crimson", "dusty", "eager", "fuzzy", "gentle", "golden", "hollow",
    "icy", "jolly", "lucky", "misty", "noble", "olive", "plain", "quiet", "rapid", "silver",
    "tidy", "urban", "vivid", "wooden", "young", "zesty", "bitter", "cosmic", "distant", "frozen",
)
_NOUNS = (
    "anchor", "badger", "candle", "dolphin", "engine", "falcon", "garden", "harbor", "island", "jacket",
    "kettle", "lantern", "meadow", "needle", "orchard", "pebble", "quarry", "rocket", "saddle", "tunnel",
    "umbrella", "violin", "walnut", "yacht", "zeppelin", "beacon", "compass", "glacier", "lobster", "pigeon",
)


def _depth(rng: random.Random) -> float:
    return round(rng.uniform(0.02, 0.98), 4)


def _keys(rng: random.Random, k: int) -> list[str]:
    pairs = rng.sample([(a, n) for a in _ADJECTIVES for n in _NOUNS], k)
    return [f"{a}-{n}" for a, n in pairs]


def _distinct(k: int, draw: Callable[[], str]) -> list[str]:
    out: list[str] = []
    while len(out) < k:
        value = draw()
        if value not in out:
            out.append(value)
    return out


def _needle(key: str, number: str) -> str:
    return f"The special magic number for {key} is {number}."


def _magic_numbers(rng: random.Random, k: int) -> list[str]:
    return _distinct(k, lambda: str(rng.randint(1_000_000, 9_999_999)))


def _names_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- tasks with checkable answers

def needle(ctx: TaskContext) -> Draft:
    """One magic-number sentence at a seeded depth; answer: the number."""
    (key,), (number,) = _keys(ctx.rng, 1), _magic_numbers(ctx.rng, 1)
    depth = _depth(ctx.rng)
    question = f"What is the special magic number for {key} mentioned in the text above? Answer with the number only."
    text = _needle(key, number)
    return haystack_draft(ctx, question, [(depth, text)], facts=[(f"number for {key}", text, number)],
                           answer=number, metric="contains_all", meta={"key": key, "depths": [depth]})


def multi_needle(ctx: TaskContext) -> Draft:
    """2-4 magic numbers with different keys; the question asks for all of them (contains_all)."""
    k = ctx.rng.randint(2, 4)
    keys, numbers = _keys(ctx.rng, k), _magic_numbers(ctx.rng, k)
    depths = [_depth(ctx.rng) for _ in range(k)]
    question = (f"What are the special magic numbers for {_names_list(keys)} mentioned in the text above? "
                "Answer with the numbers only, in that order, separated by commas.")
    inserts = [(d, _needle(key, num)) for d, key, num in zip(depths, keys, numbers)]
    facts = [(f"number for {key}", _needle(key, num), num) for key, num in zip(keys, numbers)]
    return haystack_draft(ctx, question, inserts, facts=facts, answer=numbers, metric="contains_all",
                           meta={"keys": keys, "depths": depths})


def _hex_id(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}-{rng.getrandbits(16):04x}"


def _kv_block(pairs: list[tuple[str, str]]) -> str:
    body = ",\n".join(f' "{k}": "{v}"' for k, v in pairs)
    return "{\n" + body + "\n}"


def kv_lookup(ctx: TaskContext) -> Draft:
    """A JSON block of 20-60 hex key -> value pairs in the text (shrunk to <= half the target); ask one value."""
    n = ctx.rng.randint(20, 60)
    ids = _distinct(2 * n, lambda: _hex_id(ctx.rng))
    pairs = list(zip(ids[:n], ids[n:]))
    while n > 2 and ctx.count(_kv_block(pairs[:n])) > ctx.target // 2:
        n = max(2, n * 3 // 4)
    pairs = pairs[:n]
    key, value = pairs[ctx.rng.randrange(n)]
    depth = _depth(ctx.rng)
    question = (f'What is the value for the key "{key}" in the JSON object in the text above? '
                "Answer with the value only.")
    block = _kv_block(pairs)
    return haystack_draft(ctx, question, [(depth, block)], facts=[(f"value of {key}", block, value)],
                           answer=value, metric="contains_all", meta={"key": key, "n_pairs": n, "depths": [depth]})


def _var_name(rng: random.Random) -> str:
    return "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5))


def var_tracking(ctx: TaskContext) -> Draft:
    """A chain VAR A = v, VAR B = VAR A, ... (3-5 vars) plus a distractor chain; ask for all vars holding v."""
    n_main, n_other = ctx.rng.randint(3, 5), ctx.rng.randint(2, 4)
    names = _distinct(n_main + n_other, lambda: _var_name(ctx.rng))
    values = _distinct(2, lambda: str(ctx.rng.randint(10_000, 99_999)))
    inserts = []
    for chain, value in ((names[:n_main], values[0]), (names[n_main:], values[1])):
        depths = sorted(_depth(ctx.rng) for _ in chain)
        rhs = [value] + [f"VAR {prev}" for prev in chain[:-1]]
        inserts += [(d, f"VAR {var} = {r}") for d, var, r in zip(depths, chain, rhs)]
    facts = [(f"VAR {var}", text, text) for var, (_, text) in zip(names, inserts[:n_main])]
    question = (f"Which variables in the text above are assigned the value {values[0]}, directly or through "
                "other variables? Answer with the variable names only, separated by commas.")
    return haystack_draft(ctx, question, inserts, facts=facts, answer=names[:n_main], metric="contains_all",
                           meta={"value": values[0], "distractors": names[n_main:]})


def freq_words(ctx: TaskContext) -> Draft:
    """A numbered list of real words in which 3 words appear most often (RULER common words); ask for them.

    ``size`` is the list length. The top words appear ``max(low + 3, 3% of size)`` times each,
    every other word at most ``low`` times (``low`` = 2, raised when the vocabulary runs out).
    Critical facts: every occurrence of a top word.
    """
    words = list(vocabulary())
    ctx.rng.shuffle(words)
    top, pool = words[:3], words[3:]
    shuffle_seed = ctx.rng.getrandbits(64)

    def render(size: int) -> tuple[str, str]:
        low = 2
        while True:
            high = max(low + 3, round(size * 0.03))
            rest = max(size - 3 * high, 0)
            if rest <= low * len(pool):
                break
            low += 1
        distinct = -(-rest // low)
        items = [w for w in top for _ in range(high)]
        items += [w for w in pool[:distinct] for _ in range(low)][:rest]
        random.Random(shuffle_seed + size).shuffle(items)
        context = "\n".join(f"{i}. {w}" for i, w in enumerate(items, start=1))
        return context, question

    question = ("Which 3 words appear most often in the numbered list above? "
                "Answer with the three words only, separated by commas.")
    def describe(context: str) -> dict:
        found = re.finditer(rf"^\d+\. ({'|'.join(top)})$", context, re.M)
        return {"critical_chars": [{"fact": m[1], "text": m[1], "chars": [m.start(1), m.end(1)]} for m in found]}

    return Draft(render, max_size=max(ctx.target, 40), min_size=20, answer=top, metric="contains_all",
                 describe=describe)


def multi_kv(ctx: TaskContext) -> Draft:
    """A JSON block of 20-60 hex key -> value pairs; 2-3 keys are asked, and each has a distractor key that
    differs only in its last 4 digits (shrunk to <= half the target); answer: the asked values."""
    k, n = ctx.rng.randint(2, 3), ctx.rng.randint(20, 60)
    ids = _distinct(2 * n, lambda: _hex_id(ctx.rng))  # n keys and n values, all different
    asked = ids[:k]
    near = [key[:-4] + f"{(int(key[-4:], 16) + ctx.rng.randint(1, 0xFFFE)) % 0x10000:04x}" for key in asked]
    keys, values = asked + near + ids[k:n - k], ids[n:]
    pairs = list(zip(keys, values))
    while len(pairs) > 2 * k and ctx.count(_kv_block(pairs)) > ctx.target // 2:
        pairs = pairs[:max(2 * k, len(pairs) * 3 // 4)]
    order = list(range(len(pairs)))
    ctx.rng.shuffle(order)
    pairs = [pairs[i] for i in order]
    answer = [dict(pairs)[key] for key in asked]
    depth = _depth(ctx.rng)
    question = (f"What are the values for the keys {_names_list([chr(34) + key + chr(34) for key in asked])} in the "
                "JSON object in the text above? Answer with the values only, in that order, separated by commas.")
    block = _kv_block(pairs)
    facts = [(f"value of {key}", block, value) for key, value in zip(asked, answer)]
    return haystack_draft(ctx, question, [(depth, block)], facts=facts, answer=answer, metric="contains_all",
                           meta={"keys": asked, "distractors": near, "n_pairs": len(pairs), "depths": [depth]})


_ITEMS = ("crates", "lanterns", "coins", "barrels", "maps", "keys", "bells", "scrolls")


def counting(ctx: TaskContext) -> Draft:
    """2-4 reports of what one team found, at seeded depths, among 2-3 reports of other teams; answer: the total."""
    keys, item = _keys(ctx.rng, 3), ctx.rng.choice(_ITEMS)
    main = [ctx.rng.randint(2, 9) for _ in range(ctx.rng.randint(2, 4))]
    other = [(ctx.rng.choice(keys[1:]), ctx.rng.randint(2, 9)) for _ in range(ctx.rng.randint(2, 3))]
    reports = [(keys[0], n) for n in main] + other
    inserts = sorted((_depth(ctx.rng), f"Report: the {key} team found {n} {item}.") for key, n in reports)
    facts = [(f"{keys[0]} report", text, text) for _, text in inserts if f"the {keys[0]} team" in text]
    question = (f"How many {item} did the {keys[0]} team find in total, adding up every report in the text above? "
                "Answer with the number only.")
    return haystack_draft(ctx, question, inserts, facts=facts, answer=str(sum(main)), metric="contains_all",
                           meta={"key": keys[0], "counts": main, "distractors": other})


TASKS: dict[str, Callable[[TaskContext], Draft]] = {
    "needle": needle,
    "multi_needle": multi_needle,
    "kv_lookup": kv_lookup,
    "var_tracking": var_tracking,
    "freq_words": freq_words,
    "summarise": summarise,
    "explain": explain,
    "list": list_task,
    "multi_kv": multi_kv,
    "counting": counting,
    "passage_qa": passage_qa,
    "chat": chat,
}
CLOSED_TASKS = ("needle", "multi_needle", "kv_lookup", "var_tracking", "freq_words", "multi_kv", "counting",
                "passage_qa")
OPEN_TASKS = ("summarise", "explain", "list", "chat")
# the original eight, what `builtin:` uses unless `tasks=` says otherwise (existing targets keep their prompts)
DEFAULT_TASKS = ("needle", "multi_needle", "kv_lookup", "var_tracking", "freq_words", "summarise", "explain", "list")
