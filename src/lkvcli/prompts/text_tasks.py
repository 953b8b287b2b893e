"""Built-in tasks that ask about the text itself: a question on a passage, a summary, an
explanation, a list, a chat-style request (the open-ended ones are scored by agreement with the
full-cache answer)."""

from __future__ import annotations

import re
from typing import Sequence

from .corpus import speakers, speeches
from .drafts import Draft, TaskContext, haystack_draft


def _definitions(lines: Sequence[str]) -> list[tuple[str, int]]:
    """(name, line index) of every top-level ``def`` / ``class`` in ``lines``."""
    found = []
    for i, line in enumerate(lines):
        m = re.match(r"(?:def|class) ([A-Za-z_][A-Za-z0-9_]*)", line)
        if m:
            found.append((m[1], i))
    return found


def _qa_item(lines: list[str], domain: str, u: float) -> tuple[str, str, int, int] | None:
    """(question, answer, char start, char end of the answer's evidence) of an extractive question about
    ``lines`` near relative position ``u``, or None when the passage has nothing to ask."""
    text = "\n".join(lines)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)
    unique = lambda s: text.count(s) == 1  # noqa: E731
    items = []
    if domain == "plays":
        for label, start, _ in speeches(lines):
            first = lines[start].strip()
            if len(first) >= 20 and unique(first):
                items.append((f'In the passage above, who says "{first}"? Answer with the name only.',
                              label.rstrip("."), offsets[start - 1], offsets[start - 1] + len(label.rstrip("."))))
    elif domain == "code":
        defs = _definitions(lines) + [("", len(lines))]
        for (name, i), (_, end) in zip(defs, defs[1:]):
            body = [j for j in range(i + 1, end) if len(lines[j].strip()) >= 20 and unique(lines[j].strip())
                    and not lines[j].strip().startswith(("#", '"', "'"))]
            if body:
                line = lines[body[0]].strip()
                at = offsets[i] + lines[i].index(name)
                items.append((f"Which function or class in the code above contains the line `{line}`? "
                              "Answer with its name only.", name, at, at + len(name)))
    else:
        for i, line in enumerate(lines):
            words = [w for w in re.findall(r"\b[a-z]{7,14}\b", line) if len(re.findall(rf"\b{w}\b", text)) == 1]
            if words and len(line.split()) >= 8 and not line.lstrip().startswith(("#", "|", "`", "<", "!", "[")):
                word = max(words, key=lambda w: (len(w), w))
                sentence = re.sub(rf"\b{word}\b", "____", line.strip())
                at = offsets[i] + re.search(rf"\b{word}\b", line).start()
                items.append((f'Which word fills the blank in this line of the passage above: "{sentence}"? '
                              "Answer with the word only.", word, at, at + len(word)))
    if not items:
        return None
    return items[min(len(items) - 1, int(u * len(items)))]


def passage_qa(ctx: TaskContext) -> Draft:
    """An extractive question about the passage itself, at a seeded relative position: who says a line
    (plays), which definition contains a line (code), which word fills a blank (docs); answer: that name
    or word, whose occurrence in the passage is the critical fact."""
    u = ctx.rng.random()

    def question(lines: list[str]) -> str:
        item = _qa_item(lines, ctx.domain, u)
        return item[0] if item else "What is the passage above about? Answer in one sentence."

    def describe(context: str) -> dict:
        item = _qa_item(context.split("\n"), ctx.domain, u)
        if item is None:
            raise ValueError("passage_qa: the passage has nothing to ask about")
        _, answer, start, end = item
        return {"answer": answer, "critical_chars": [{"fact": "answer", "text": answer, "chars": [start, end]}]}

    return haystack_draft(ctx, question, answer="", metric="contains_all", meta={"position": round(u, 4)},
                           describe=describe)


# ---------------------------------------------------------------- open-ended tasks (metric "agreement")

def summarise(ctx: TaskContext) -> Draft:
    """Summarise a real passage (code: what it does)."""
    question = ("Summarise what the code above does in a few sentences." if ctx.domain == "code" else
                "Summarise the passage above in a few sentences.")
    return haystack_draft(ctx, question)


def explain(ctx: TaskContext) -> Draft:
    """Explain the longest complete speech of the passage, or what its main speaker wants (seeded choice);
    code: what its first top-level definition does; docs: what the passage describes."""
    variant = ctx.rng.choice(("speech", "want"))
    if ctx.domain != "plays":
        def other(lines: list[str]) -> str:
            names = _definitions(lines)
            if ctx.domain == "code" and names:
                return f"Explain briefly, in plain English, what `{names[0][0]}` in the code above does and how."
            return "Explain briefly, in plain English, what the passage above describes and how to use it."
        return haystack_draft(ctx, other, meta={"variant": "definition" if ctx.domain == "code" else "passage"})

    def question(lines: list[str]) -> str:
        found = speeches(lines)
        if not found:
            return "Explain briefly, in plain modern English, what happens in the passage above."
        if variant == "speech":
            label, start, end = max(found, key=lambda s: (s[2] - s[1], -s[1]))
            first = lines[start].strip()
            return (f'Explain briefly, in plain modern English, what the speech above that begins "{first}" '
                    f'(spoken by {label.rstrip(".")}) means.')
        lines_by = {}
        for label, start, end in found:
            lines_by[label] = lines_by.get(label, 0) + end - start
        label = max(lines_by, key=lambda lab: (lines_by[lab], lab))
        return (f"Based on the passage above, what does {label.rstrip('.')} want, and why? "
                "Answer in a few sentences.")

    return haystack_draft(ctx, question, meta={"variant": variant})


def list_task(ctx: TaskContext) -> Draft:
    """List the characters who speak, or the main events (seeded choice); code: the top-level
    definitions; docs: the main points."""
    variant = ctx.rng.choice(("speakers", "events"))
    if ctx.domain == "code":
        return haystack_draft(ctx, "List the functions and classes defined at the top level of the code above, "
                               "one name per line.", meta={"variant": "definitions"},
                               describe=lambda context: {"definitions": [n for n, _ in
                                                                         _definitions(context.split("\n"))]})
    if ctx.domain == "docs":
        return haystack_draft(ctx, "List the main points of the passage above as short bullet points.",
                               meta={"variant": "points"})
    question = ("List the characters who speak in the passage above, one per line."
                if variant == "speakers" else
                "List the main events of the passage above as short bullet points.")
    return haystack_draft(ctx, question, meta={"variant": variant},
                           describe=lambda context: {"speakers": speakers(context.split("\n"))})


CHAT_REQUESTS = {  # seeded choice per record; {speaker} / {name} come from the final passage
    "plays": ("Write a two-line text message that {speaker} might send a friend right after the scene above.",
              "In two friendly sentences, tell me whether I would enjoy the scene above, and why.",
              "Give the scene above a catchy title and a one-line tagline."),
    "code": ("I'm new to Python. In two friendly sentences, what could I use the code above for?",
             "Suggest a clearer name for `{name}` in the code above, and say why in one sentence.",
             "Write a one-line commit message for a change that adds the code above."),
    "docs": ("In two friendly sentences, tell a colleague whether the package described above would help them, "
             "and why.",
             "Write a one-line announcement of the package described above for a team chat.",
             "Give three keywords for the passage above, comma-separated."),
}


def chat(ctx: TaskContext) -> Draft:
    """A short chat-style instruction about the passage (a message in a character's voice, a title, a
    commit message, a team-chat announcement ...); open-ended. ``min_tokens``/``max_tokens`` set how
    short: ``builtin:tasks=chat,min_tokens=200,max_tokens=400``."""
    request = ctx.rng.choice(CHAT_REQUESTS[ctx.domain])

    def question(lines: list[str]) -> str:
        if "{" not in request:
            return request
        names = speakers(lines) if ctx.domain == "plays" else [n for n, _ in _definitions(lines)]
        if not names:  # nobody to name in this passage: the first request that needs no name
            return next(r for r in CHAT_REQUESTS[ctx.domain] if "{" not in r)
        return request.format(speaker=names[0], name=names[0])

    return haystack_draft(ctx, question, meta={"request": CHAT_REQUESTS[ctx.domain].index(request)})
