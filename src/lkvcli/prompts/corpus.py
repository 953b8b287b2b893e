"""The real texts that built-in prompts are made of, by domain, and helpers to slice them.

- ``plays``: vendored public-domain Shakespeare, ``prompts/texts/*.txt`` (``texts/SOURCES.json``);
  a haystack starts at a speech.
- ``code``: the Python standard library's own modules (this interpreter's ``.py`` files); a
  haystack starts at a top-level ``def`` / ``class``.
- ``docs``: technical prose that installed packages ship: the long descriptions (README) in the
  ``METADATA`` of lkv's own dependencies; a haystack starts at a paragraph.

``code`` and ``docs`` are read from the installation, so their prompts depend on the Python and
package versions (recorded in each prompt's ``haystack`` metadata). Everything here is
deterministic for one installation: files, starts and vocabulary are sorted.
"""

from __future__ import annotations

import bisect
import json
import platform
import random
import re
import sysconfig
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Sequence

_LABEL = re.compile(r"^[A-Z][A-Za-z' -]{0,28}[A-Za-z]\.?$")
_HEADING = re.compile(r"^(act|scene)\b", re.IGNORECASE)
_VOCAB_WORD = re.compile(r"(?<![A-Za-z'])[a-z]{4,10}(?![A-Za-z'])")


DOMAINS = ("plays", "code", "docs")
# lkv's dependencies and theirs (installed wherever lkv is; those missing are skipped): READMEs in their METADATA
DOC_PACKAGES = ("accelerate", "click", "datasets", "filelock", "fsspec", "gguf", "huggingface_hub", "jinja2",
                "markdown-it-py", "matplotlib", "networkx", "numpy", "packaging", "peft", "psutil", "pygments",
                "pytest", "pyyaml", "regex", "rich", "safetensors", "sympy", "tokenizers", "torch", "tqdm",
                "transformers", "typer")


@dataclass(frozen=True)
class Document:
    file: str
    title: str
    lines: tuple[str, ...]
    starts: tuple[int, ...]          # where a haystack may start (plays: speaker labels after the first heading)
    cum_words: tuple[int, ...]       # cum_words[i] = words in lines[:i]


def _document(file: str, title: str, lines: Sequence[str], starts: Sequence[int]) -> Document:
    cum = [0]
    for line in lines:
        cum.append(cum[-1] + len(line.split()))
    return Document(file, title, tuple(lines), tuple(starts), tuple(cum))


def is_speaker_label(lines: Sequence[str], i: int) -> bool:
    """A short capitalised line after a blank line and followed by the speech, e.g. 'Ham.' or 'FIRST WITCH.'."""
    line = lines[i]
    return (
        bool(_LABEL.match(line))
        and len(line.split()) <= 4
        and (i == 0 or lines[i - 1] == "")
        and i + 1 < len(lines)
        and lines[i + 1] != ""
        and not _HEADING.match(line)
    )


def speeches(lines: Sequence[str]) -> list[tuple[str, int, int]]:
    """(label, first text line, end) of every speech that is complete within ``lines``."""
    out = []
    for i in range(len(lines)):
        if is_speaker_label(lines, i):
            end = i + 1
            while end < len(lines) and lines[end] != "":
                end += 1
            if end < len(lines):  # the last speech may be cut by the slice
                out.append((lines[i], i + 1, end))
    return out


def speakers(lines: Sequence[str]) -> list[str]:
    """Speaker labels (without the final '.') in order of first appearance."""
    seen: dict[str, None] = {}
    for i in range(len(lines)):
        if is_speaker_label(lines, i):
            seen.setdefault(lines[i].rstrip("."), None)
    return list(seen)


def _texts_dir():
    return resources.files("lkvcli.prompts").joinpath("texts")


@lru_cache(maxsize=1)
def load_plays() -> tuple[Document, ...]:
    root = _texts_dir()
    titles = {f["file"]: f["title"] for f in json.loads(root.joinpath("SOURCES.json").read_text("utf-8"))["files"]}
    plays = []
    for entry in sorted((e for e in root.iterdir() if e.name.endswith(".txt")), key=lambda e: e.name):
        lines = entry.read_text("utf-8").split("\n")
        first = next((i for i, line in enumerate(lines) if _HEADING.match(line)), 0)
        starts = [i for i in range(first, len(lines)) if is_speaker_label(lines, i)]
        plays.append(_document(entry.name, titles.get(entry.name, entry.name), lines, starts))
    return tuple(plays)


@lru_cache(maxsize=1)
def load_code() -> tuple[Document, ...]:
    """Top-level modules of the standard library, 20-300 KB each (tests and private modules left out)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    version = platform.python_version()
    docs = []
    for path in sorted(root.glob("*.py")):
        if path.name.startswith(("_", "test")) or not 20_000 <= path.stat().st_size <= 300_000:
            continue
        lines = path.read_text("utf-8", errors="replace").replace("\t", "    ").split("\n")
        starts = [i for i, line in enumerate(lines) if line.startswith(("def ", "class ")) and (i == 0 or not lines[i - 1])]
        if starts:
            docs.append(_document(f"python-{version}/{path.name}", f"Python {version} {path.stem}", lines, starts))
    return tuple(docs)


@lru_cache(maxsize=1)
def load_docs() -> tuple[Document, ...]:
    """The README (long description) of each of :data:`DOC_PACKAGES` that is installed, at least 1,000 words."""
    docs = []
    for name in DOC_PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        text = dist.read_text("METADATA") or ""
        body = text.split("\n\n", 1)[1] if "\n\n" in text else ""  # after the headers
        lines = [line.rstrip() for line in body.split("\n")]
        if sum(len(line.split()) for line in lines) < 1000:
            continue
        starts = [i for i, line in enumerate(lines) if line and (i == 0 or not lines[i - 1])]
        docs.append(_document(f"{name}-{dist.version}/METADATA", f"{name} {dist.version} README", lines, starts))
    return tuple(docs)


def load_documents(domain: str = "plays") -> tuple[Document, ...]:
    """The documents of a text domain (:data:`DOMAINS`)."""
    found = {"plays": load_plays, "code": load_code, "docs": load_docs}[domain]()
    if not found:
        raise ValueError(f"no {domain} texts in this installation")
    return found


@lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
    """Sorted lowercase words (4-10 letters) that occur at least 3 times in the vendored texts."""
    counts: Counter[str] = Counter()
    for play in load_plays():
        counts.update(_VOCAB_WORD.findall("\n".join(play.lines)))
    return tuple(sorted(w for w, n in counts.items() if n >= 3))


@dataclass
class Haystack:
    """A contiguous stream of real text lines starting at a start line; spills into the next document if needed."""

    lines: list[str]
    meta: dict


def make_haystack(rng: random.Random, min_words: int, domain: str = "plays") -> Haystack:
    """Seeded document of ``domain`` and start (plays: a speech) with at least ``min_words`` words after it."""
    plays = load_documents(domain)
    k = rng.randrange(len(plays))
    play = plays[k]
    total = play.cum_words[-1]
    fits = [s for s in play.starts if total - play.cum_words[s] >= min_words]
    if fits:
        start = fits[rng.randrange(len(fits))]
    else:
        start = play.starts[0] if play.starts else 0
    lines = list(play.lines[start:])
    words = total - play.cum_words[start]
    spill = []
    while words < min_words:
        k = (k + 1) % len(plays)
        lines += [""] + list(plays[k].lines)
        words += plays[k].cum_words[-1]
        spill.append(plays[k].file)
    while lines and lines[-1] == "":
        lines.pop()
    meta = {"file": play.file, "title": play.title, "start_line": start + 1}
    if domain != "plays":
        meta["domain"] = domain
    if spill:
        meta["continues_into"] = spill
    return Haystack(lines, meta)


def passage(lines: Sequence[str], size: int) -> list[str]:
    """The first ``size`` lines, without trailing blank lines."""
    out = list(lines[:size])
    while out and out[-1] == "":
        out.pop()
    return out


def insert_paragraphs(lines: Sequence[str], inserts: Sequence[tuple[float, str]]) -> str:
    """Join ``lines`` with each insert as its own paragraph at the paragraph break nearest its depth.

    ``depth`` is a fraction of the text (0 = start, 1 = end). Inserts that land on the same break
    keep their order in ``inserts``; give them sorted by depth to keep a sequence in order.
    """
    n = len(lines)
    bounds = [0] + [i for i in range(1, n) if lines[i - 1] == "" and lines[i] != ""] + [n]
    at: dict[int, list[str]] = {}
    for depth, text in inserts:
        target = min(max(depth, 0.0), 1.0) * n
        j = bisect.bisect_left(bounds, target)
        pos = min(bounds[max(j - 1, 0): j + 1], key=lambda b: (abs(b - target), b))
        at.setdefault(pos, []).append(text)
    out: list[str] = []
    for i in range(n + 1):
        for text in at.get(i, ()):
            if out and out[-1] != "":
                out.append("")
            out += [text, ""]
        if i < n:
            out.append(lines[i])
    return "\n".join(out).strip("\n")
