"""The value types of stack-config fields (integers, numbers, booleans as Pulumi's YAML gives them)
and the one failure every field check raises; config/schema.py declares fields with them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_core import PydanticCustomError


def _fail(allowed: str, *, suffix: str = "", **value: Any) -> PydanticCustomError:
    return PydanticCustomError("config", "{allowed}", {"allowed": allowed, "suffix": suffix, **value})


def _reject_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("config", "{allowed}", {"allowed": "expected an integer"})
    return value


def _bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise PydanticCustomError("config", "{allowed}", {"allowed": "expected a boolean (true/false)"})


INT64 = (-(2**63), 2**63 - 1)
Int = Annotated[int, BeforeValidator(_reject_bool), Field(ge=INT64[0], le=INT64[1])]
"""An integer (YAML ``5``, ``5.0`` or ``"5"``); ``true`` is not 1; within int64 (what the
Kubernetes API and its CRDs hold)."""


def _reject_bool_number(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("config", "{allowed}", {"allowed": "expected a number"})
    return value


Float = Annotated[float, BeforeValidator(_reject_bool_number)]
"""A number (YAML ``400``, ``12.5`` or ``"12.5"``); ``true`` is not 1."""

Bool = Annotated[bool, BeforeValidator(_bool)]
"""A boolean: ``true``/``false`` (also as strings), not 1/0 or yes/no."""


def _unquoted_number(choices: tuple) -> Callable[[Any], Any]:
    """A text choice written as an unquoted number: YAML (and Pulumi, which passes the number on)
    reads ``version: 1.30`` as the number 1.3; say so, and to quote it."""

    def run(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or str(value) in choices:
            return value
        meant = [c for c in choices if _as_number(c) == value]
        written = f" or {value}0" if isinstance(value, float) and value != int(value) else ""
        if meant:
            raise _fail(f"the number {value}: YAML reads an unquoted {meant[0]} as {value} (and Pulumi passes the number on); quote it: \"{meant[0]}\"", value=value)
        raise _fail(f"the number {value}: YAML reads an unquoted {value}{written} as a number (and Pulumi passes {value} on); "
                    "write it quoted, one of: " + ", ".join(f'"{c}"' for c in choices), value=value)

    return run


def _as_number(text: str) -> float | None:
    return float(text) if re.fullmatch(r"[0-9]+(\.[0-9]*)?", text) else None
