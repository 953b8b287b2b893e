"""Map a dataset's own columns onto lkv's record fields: one source of a mixture, per its schema.

    - data: "hf:nvidia/ChatQA2-Long-SFT-data:long_sft@train"
      count: 50000
      columns: {reference: answer}                   # lkv field <- dataset column
      extract: {question: '^(User: )?(?P<prompt>.*?)(\\s*Assistant:)?\\s*$'}
    - data: "hf:openai/gsm8k:main@train"
      count: 3000
      shots: 4                                       # the first 4 rows become worked examples
      shot_template: "Question: {question}\\nAnswer: {answer}"
      template: "Question: {question}\\nAnswer:"

Applied to each raw row in this order: ``columns`` copies a column to an lkv field (``prompt``,
``context``, ``question``, ``messages``, ``answer``, ...; a field that lkv does not know goes to the
record's metadata); ``extract`` matches a regular expression against a column and sets its named
groups as fields; ``template`` formats the row (``str.format``: ``{col}``, ``{col[key]}``,
``{col[0]}``; a list column as lettered options with ``{col:options}``, ``A. ...`` one per line, or
numbered from 0 with ``{col:numbered}``) into ``prompt``; ``shots`` puts the first N rows, each formatted by ``shot_template``,
before every later prompt (fixed few-shot examples; those N rows are not prompts themselves).
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .records import PromptSourceError

MAPPING_KEYS = ("columns", "extract", "template", "shots", "shot_template")


class _Row(dict):
    """A row for formatting whose missing keys name the row's columns."""

    def __missing__(self, key):
        raise PromptSourceError(f"no column {key!r} in the row; its columns are {sorted(self)}")


class _Formatter(string.Formatter):
    """``str.format`` plus the ``options`` / ``numbered`` specs that lay a list out one item per line."""

    def format_field(self, value, format_spec):
        if format_spec in ("options", "numbered") and isinstance(value, (list, tuple)):
            marks = [chr(65 + i) if format_spec == "options" else str(i) for i in range(len(value))]
            return "\n".join(f"{mark}. {item}" for mark, item in zip(marks, value))
        return super().format_field(value, format_spec)


def _check_template(text: Any, where: str) -> str:
    if not isinstance(text, str) or not text:
        raise PromptSourceError(f"{where}: must be a non-empty format string such as \"{{question}}\"")
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]
    except ValueError as exc:
        raise PromptSourceError(f"{where}: not a valid format string ({exc}); double literal braces as {{{{ }}}}") from None
    if not fields:
        raise PromptSourceError(f"{where}: names no column; write e.g. \"{{content}}\\n\\nExplain this code.\"")
    return text


@dataclass(frozen=True)
class RowMapping:
    """How one source's rows become lkv rows (see the module docstring)."""

    columns: dict[str, str] = field(default_factory=dict)
    extract: dict[str, re.Pattern] = field(default_factory=dict)
    template: str | None = None
    shots: int = 0
    shot_template: str | None = None

    @classmethod
    def from_entry(cls, entry: dict, where: str) -> RowMapping | None:
        """The mapping of a mixture entry, or None when it has none; bad options fail with one line."""
        if not any(key in entry for key in MAPPING_KEYS):
            return None
        columns = entry.get("columns") or {}
        if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
            raise PromptSourceError(f"{where}.columns: must map lkv fields to column names, e.g. {{context: document}}")
        extract = {}
        for column, pattern in (entry.get("extract") or {}).items():
            try:
                extract[column] = re.compile(pattern, re.DOTALL)
            except (re.error, TypeError) as exc:
                raise PromptSourceError(f"{where}.extract.{column}: not a regular expression ({exc})") from None
            if not extract[column].groupindex:
                raise PromptSourceError(f"{where}.extract.{column}: has no named group; write (?P<prompt>...)")
        template = entry.get("template")
        if template is not None:
            _check_template(template, f"{where}.template")
        shots = entry.get("shots", 0)
        if isinstance(shots, bool) or not isinstance(shots, int) or shots < 0:
            raise PromptSourceError(f"{where}.shots: {shots!r} must be a non-negative integer")
        shot_template = entry.get("shot_template")
        if shots and shot_template is None:
            raise PromptSourceError(f"{where}: shots={shots} needs a shot_template, e.g. \"Q: {{question}}\\nA: {{answer}}\"")
        if shot_template is not None:
            _check_template(shot_template, f"{where}.shot_template")
        if shots and template is None:
            raise PromptSourceError(f"{where}: shots={shots} needs a template for the question after the examples")
        return cls(columns=dict(columns), extract=extract, template=template, shots=shots, shot_template=shot_template)

    def _fields(self, row: Any, where: str) -> dict:
        if not isinstance(row, dict):
            raise PromptSourceError(f"{where}: expected an object, got {type(row).__name__}")
        out = dict(row)
        for lkv_field, column in self.columns.items():
            if column not in row:
                raise PromptSourceError(f"{where}: no column {column!r} (mapped to {lkv_field!r}); "
                                        f"its columns are {sorted(row)}; fix `columns`")
            out.pop(column, None)
        out.update({lkv_field: row[column] for lkv_field, column in self.columns.items()})
        for column, pattern in self.extract.items():
            match = pattern.search(str(out.get(column, "")))
            if match is None:
                raise PromptSourceError(f"{where}: column {column!r} does not match extract pattern "
                                        f"{pattern.pattern!r}; loosen the pattern")
            out.update({k: v for k, v in match.groupdict().items() if v is not None})
        return out

    def _format(self, template: str, row: dict, where: str) -> str:
        try:
            return _Formatter().vformat(template, (), _Row(row))
        except PromptSourceError as exc:
            raise PromptSourceError(f"{where}: {exc}; fix the template") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise PromptSourceError(f"{where}: cannot format {template!r} with this row "
                                    f"({type(exc).__name__}: {exc}); fix the template") from None

    def rows(self, rows: Iterator[tuple[Any, str, str]]) -> Iterator[tuple[dict, str, str]]:
        """Map (row, default id, location) triples; the first ``shots`` rows become the examples."""
        examples: list[str] = []
        for row, default_id, where in rows:
            mapped = self._fields(row, where)
            if len(examples) < self.shots:
                examples.append(self._format(self.shot_template, mapped, where))
                continue
            if self.template is not None:
                mapped["prompt"] = "\n\n".join([*examples, self._format(self.template, mapped, where)])
                mapped.pop("messages", None)
            yield mapped, default_id, where
