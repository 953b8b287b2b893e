"""The settings of ``lkv eval`` (recipe section ``eval``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from ..config import Validated
from ..errors import LkvError
from ..evict import DEFAULT_BUDGETS, parse_budget
from ..scorers import available, get_scorer

PARTS = ("prediction", "answers", "overhead")


@dataclass
class EvalConfig(Validated):
    """Settings of ``lkv eval`` (recipe section ``eval``)."""

    targets: list[str] = field(default_factory=list)
    model: str | None = None  # default: the model the targets were collected with
    adapter: str | None = None  # training run folder or bundle (needed by the lookahead method)
    methods: list[str] | None = None  # default: every method (lookahead only with an adapter)
    budgets: list[str] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    out: str = "results"
    overwrite: bool = False  # replace a results folder written with other settings
    mode: Literal["whole", "context"] = "whole"
    split: Literal["auto", "validation", "all"] = "auto"  # auto: the adapter run's validation records if known
    limit: int | None = None
    max_new_tokens: int | None = None  # default: each record's collected response length
    decode_batch: int = 32  # (method, budget) answers of one record decoded together, at most
    overhead_prompts: int = 2
    overhead_repeats: int = 3
    scorers: dict = field(default_factory=dict)  # per-method options, e.g. {"snapkv": {"window": 64}}
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False

    def validate(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad or not self.parts:
            raise LkvError(f"unknown part {bad[0] if bad else '(none)'!r}; parts: {', '.join(PARTS)}")
        if not self.budgets:
            raise LkvError("no budgets given; pass --budgets 64,128 (entries per head) or 0.1 (ratio of the prompt)")
        for b in self.budgets:
            parse_budget(b)
        for name in self.methods or []:
            if name != "full":
                get_scorer(name, **self.scorers.get(name, {}))  # unknown names and options fail here
        unknown = sorted(set(self.scorers) - set(available()))
        if unknown:
            raise LkvError(f"scorers: unknown method {unknown[0]!r}; known methods: {', '.join(available())}")
        for name, value in (("limit", self.limit), ("max_new_tokens", self.max_new_tokens)):
            if value is not None and value < 1:
                raise LkvError(f"{name} must be at least 1")
        if self.decode_batch < 1:
            raise LkvError(f"decode_batch must be at least 1, not {self.decode_batch}")
        if self.overhead_prompts < 1 or self.overhead_repeats < 1:
            raise LkvError("overhead_prompts and overhead_repeats must be at least 1")

    def check_data(self) -> None:
        """Targets are given (checked when the evaluation starts)."""
        if not self.targets:
            raise LkvError("no targets given; pass --targets FOLDER (written by `lkv collect`)")

    def method_names(self, has_adapter: bool) -> list[str]:
        names = [m for m in (self.methods or available()) if m != "full"]
        if self.methods is None and not has_adapter:
            names = [m for m in names if m != "lookahead"]
        return names


def config_dict(config: EvalConfig) -> dict:
    return asdict(config)
