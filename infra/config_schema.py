"""A small typed-config engine: frozen dataclasses are the schema.

Each settings class is a frozen dataclass whose fields are declared with :func:`opt`. The
field's Python type decides how the raw stack value is checked (``str``, ``int``, ``bool``,
``list[str]``, ``Optional[...]`` or a nested settings class); ``opt`` adds the description
(used for the README's config table), allowed choices and a value check. Keys are camelCase in
stack config and snake_case in Python. Every error is one :class:`ConfigError` that names the
full key path, the bad value and what is allowed; unknown keys are errors with a suggestion.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable
from typing import Any

PROJECT = "training-platform"

Check = Callable[[Any], str | None]


class ConfigError(ValueError):
    """One invalid stack-config value: key path, bad value, what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(f"invalid config {PROJECT}:{key} = {value!r}: {allowed}")


def opt(default: Any, doc: str, *, choices: tuple | None = None, check: Check | None = None) -> Any:
    """Declare a settings field: default, description, allowed choices, value check.

    Typed ``Any`` like :func:`dataclasses.field`: it stands in for the field's default.
    """
    meta = {"doc": doc, "choices": choices, "check": check}
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda d=default: list(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: d, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _type_name(tp: Any) -> str:
    if dataclasses.is_dataclass(tp):
        return "an object"
    if typing.get_origin(tp) is list:
        return "a list of " + _type_name(typing.get_args(tp)[0]) + "s"
    return {str: "a string", int: "an integer", bool: "a boolean (true/false)"}.get(tp, str(tp))


def _coerce_scalar(tp: Any, value: Any, key: str) -> Any:
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif tp is int:
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            return value
        elif isinstance(value, float) and value.is_integer():
            return int(value)
        elif isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # an unquoted YAML number such as `version: 1.34`
    else:  # pragma: no cover - schema authoring error
        raise TypeError(f"unsupported settings type {tp!r} at {key}")
    raise ConfigError(key, value, f"expected {_type_name(tp)}")


def _parse_value(tp: Any, value: Any, key: str) -> Any:
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(key, value, f"expected {_type_name(inner)}, not null")
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return parse(inner, value, key)
    if typing.get_origin(inner) is list:
        if not isinstance(value, list):
            raise ConfigError(key, value, f"expected {_type_name(inner)}")
        (item_tp,) = typing.get_args(inner)
        return [_parse_value(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
    return _coerce_scalar(inner, value, key)


def parse(cls: type, raw: Any, path: str) -> Any:
    """Turn a raw config mapping into an instance of the settings class ``cls``."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(path, raw, "expected an object with keys " + ", ".join(keys_of(cls)))
    hints = typing.get_type_hints(cls)
    by_key = {camel(f.name): f for f in dataclasses.fields(cls) if f.init}
    for k in raw:
        if k not in by_key:
            raise ConfigError(f"{path}.{k}", raw[k], unknown_key_hint(str(k), list(by_key)))
    values = {}
    for k, f in by_key.items():
        if k not in raw:
            continue
        key = f"{path}.{k}"
        value = _parse_value(hints[f.name], raw[k], key)
        choices = f.metadata.get("choices")
        if choices is not None:
            items = value if isinstance(value, list) else [value]
            for i, item in enumerate(items):
                if item is not None and item not in choices:
                    where = f"{key}[{i}]" if isinstance(value, list) else key
                    raise ConfigError(where, item, "allowed: " + ", ".join(map(str, choices)))
        check = f.metadata.get("check")
        if check is not None and value is not None:
            problem = check(value)
            if problem:
                raise ConfigError(key, value, problem)
        values[f.name] = value
    obj = cls(**values)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path)
    return obj


def keys_of(cls: type) -> list[str]:
    return [camel(f.name) for f in dataclasses.fields(cls) if f.init]


def unknown_key_hint(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"unknown key; did you mean '{close[0]}'? " if close else "unknown key; "
    return hint + "allowed keys: " + ", ".join(allowed)


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) rows for every leaf field, for documentation."""
    rows = []
    hints = typing.get_type_hints(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        key = f"{prefix}{camel(f.name)}"
        tp, _ = _unwrap_optional(hints[f.name])
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, key + "."))
            continue
        doc = f.metadata.get("doc", "")
        choices = f.metadata.get("choices")
        if choices:
            doc += " (" + " | ".join(map(str, choices)) + ")"
        rows.append((key, doc_type(tp), repr_default(getattr(defaults, f.name)), doc))
    return rows


def doc_type(tp: Any) -> str:
    if typing.get_origin(tp) is list:
        return "list of " + doc_type(typing.get_args(tp)[0]) + "s"
    return {str: "string", int: "integer", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def repr_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def to_raw(obj: Any) -> Any:
    """Settings object back to camelCase config (the inverse of :func:`parse`)."""
    if dataclasses.is_dataclass(obj):
        return {camel(f.name): to_raw(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
    if isinstance(obj, list):
        return [to_raw(v) for v in obj]
    return obj
