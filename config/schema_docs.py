"""The stack config's reference, read from the models: one row per key (docs/reference.md's table)."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from config.schema import _map_item_model, _model_type, _strip_annotated, _unwrap_optional, choices_of


def describe(cls: type[BaseModel], prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) rows for every leaf field, for documentation."""
    rows = []
    if (item := _map_item_model(cls)) is not None:  # a map section: its value's keys under <name>
        return describe(item, prefix + getattr(cls, "KEY_NAME", "<name>") + ".")
    for name, f in cls.model_fields.items():
        key = f"{prefix}{f.alias or name}"
        tp, _ = _unwrap_optional(_strip_annotated(f.annotation))
        sub = _model_type(tp)
        if sub is not None:
            rows.extend(describe(sub, key + "."))
            continue
        doc = f.description or ""
        choices = choices_of(cls, name)
        if choices:
            doc += " (" + " | ".join(map(str, choices)) + ")"
        default = f.get_default(call_default_factory=True)
        rows.append((key, doc_type(tp), repr_default(default), doc))
    return rows


def doc_type(tp: Any) -> str:
    tp = _strip_annotated(tp)
    origin = typing.get_origin(tp)
    if origin is list:
        return "list of " + doc_type(typing.get_args(tp)[0]) + "s"
    if origin is dict:
        return "map of " + doc_type(typing.get_args(tp)[1]) + "s"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "object"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, getattr(tp, "__name__", str(tp)))


def repr_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


