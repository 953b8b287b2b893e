"""Configuration as validated dataclasses, loaded from recipe YAML with command-line overrides.

A recipe is a YAML file with one section per command (``collect``, ``train``, ``eval``,
``export``) plus optional shared top-level keys (``model``, ``device``, ``dtype``, ...)
that apply to every section that has such a field. Overrides are ``key=value`` strings
(``lr=1e-3``, ``lora.rank=16``); values are parsed as YAML scalars.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .errors import LkvError

T = TypeVar("T")


class Validated:
    """Dataclass mixin: :meth:`validate` runs whenever an instance is built (``Config(**meta)`` read
    from a file, ``dataclasses.replace``, a recipe), so a config in hand is a valid one."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise LkvError naming the first bad field; subclasses check their own fields."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _coerce(value: Any, tp, where: str):
    """Check (and gently convert) one value against a type annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except LkvError as exc:
                errors.append(str(exc))
        raise LkvError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(map(str, typing.get_args(tp)))
            raise LkvError(f"{where}: {value!r} is not one of {choices}")
        return value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise LkvError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise LkvError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise LkvError(f"{where}: expected a mapping of {_type_name(tp)} fields, got {value!r}")
        return from_dict(tp, value, where)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise LkvError(f"{where}: expected true or false, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise LkvError(f"{where}: expected a number, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise LkvError(f"{where}: expected an integer, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise LkvError(f"{where}: expected a string, got {value!r}")
    return value


def from_dict(cls: type[T], data: dict, where: str = "") -> T:
    """Build a dataclass from a mapping: unknown fields and wrong types fail with one line naming the field."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise LkvError(f"unknown field {prefix + unknown[0]!r}; known fields: {', '.join(sorted(names))}")
    kwargs = {}
    for name, value in data.items():
        field_where = f"{where}.{name}" if where else name
        kwargs[name] = _coerce(value, hints[name], field_where)
    try:
        return cls(**kwargs)  # a Validated config checks itself here
    except TypeError as exc:
        raise LkvError(f"{where or cls.__name__}: {exc}") from exc


def to_dict(obj) -> dict:
    return dataclasses.asdict(obj)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise LkvError(f"override {text!r} must look like key=value (for example lr=1e-3)")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``key=value`` overrides (dotted keys for nested sections) to a plain mapping."""
    data = dict(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            node[part] = dict(child) if isinstance(child, dict) else {}
            node = node[part]
        node[path[-1]] = value
    return data


def read_recipe(path: str | Path | None) -> dict:
    """Read a recipe YAML file into a mapping (empty when no recipe is given)."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise LkvError(f"recipe {path} not found; give a YAML file (see recipes/)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise LkvError(f"recipe {path} is not valid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise LkvError(f"recipe {path} must be a mapping of sections (collect, train, eval, export)")
    return data


SECTIONS = ("collect", "train", "eval", "export")


def section(recipe: dict, name: str, cls: type) -> dict:
    """One command's section, with shared top-level keys filled in where the section lacks them."""
    fields = {f.name for f in dataclasses.fields(cls)}
    shared = {k: v for k, v in recipe.items() if k not in SECTIONS and k in fields and k != "name"}
    body = recipe.get(name) or {}
    if not isinstance(body, dict):
        raise LkvError(f"recipe section {name!r} must be a mapping")
    return {**shared, **body}


def load_config(cls: type[T], recipe_path, section_name: str, cli_values: dict, overrides: list[str]) -> T:
    """Recipe section < explicit CLI options < ``key=value`` overrides, validated into ``cls``."""
    data = section(read_recipe(recipe_path), section_name, cls)
    data.update({k: v for k, v in cli_values.items() if v is not None})
    data = apply_overrides(data, overrides)
    return from_dict(cls, data)
