"""Values that failed their own check, in a section parsed without them (config/schema.py
``repaired_section``): :class:`Failed` stands for such a value, and a rule that reads it stops
(:func:`known`) instead of judging the field's default, which the user never gave."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pydantic import BaseModel, RootModel


class UnknownValue(Exception):
    """A rule used a value that failed its own check (already reported): it cannot judge."""


class Failed:
    """Stands, in a repaired section (:func:`config.schema.repaired_section`), for a value that failed its
    field's check: not its default, which the user never gave. Every use of it (a comparison,
    arithmetic, iteration, truth, an attribute) raises :class:`UnknownValue`, so a rule that reads
    it says nothing (:func:`known`, :func:`config.schema.problems_of`) instead of judging a default in its place."""

    __slots__ = ("key",)

    def __init__(self, key: str):
        self.key = key

    def _unknown(self, *args: Any, **kwargs: Any) -> Any:
        raise UnknownValue(self.key)

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = _unknown  # type: ignore[assignment]
    __bool__ = __len__ = __iter__ = __contains__ = __getitem__ = __str__ = __format__ = _unknown  # type: ignore[assignment]
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __floordiv__ = __rfloordiv__ = __mod__ = _unknown
    __neg__ = __int__ = __float__ = __index__ = _unknown

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnknownValue(self.key)

    def __repr__(self) -> str:
        return f"<failed {self.key}>"


class FailedList(Failed):
    """A list of values some of whose items failed their check: :class:`Failed` to every rule, and
    ``parsed``, the items that passed with their indexes, for the checks made item against item
    (duplicates: :func:`config.checks.duplicate_errors`), so one bad item does not hide a repeated one."""

    __slots__ = ("parsed",)

    def __init__(self, key: str, parsed: list[tuple[int, Any]]):
        super().__init__(key)
        self.parsed = parsed

    def __repr__(self) -> str:
        return f"<failed {self.key}: {len(self.parsed)} items passed>"


def known(lines: Iterable[Any]) -> Iterator[Any]:
    """The lines of a rule up to where it reads a :class:`Failed` value: a rule on a value that
    failed its own check is not run on a stand-in for it."""
    try:
        yield from lines
    except UnknownValue:
        return
    except TypeError as exc:  # a C function (re.fullmatch, ipaddress) handed a Failed: no dunder to raise from
        if f"'{Failed.__name__}'" not in str(exc):
            raise


def mark_failed(obj: Any, parts: tuple[str, ...], key: str, parsed: list[tuple[int, Any]] | None = None) -> Any:
    """``obj`` with the value at ``parts`` (config keys) replaced by :class:`Failed`: a field of
    a model, an entry of a map (a team of ``tenants``, of ``portal.teams``, a variable of ``env``);
    a value inside a list marks the whole list, a :class:`FailedList` holding ``parsed`` (the
    items that passed, by index) where they are given."""
    if isinstance(obj, RootModel):
        return obj.model_copy(update={"root": mark_failed(obj.root, parts, key, parsed)})
    marker = Failed(key) if parsed is None else FailedList(key, parsed)
    if isinstance(obj, dict):
        inner = obj.get(parts[0])
        return {**obj, parts[0]: marker if len(parts) == 1 or inner is None else mark_failed(inner, parts[1:], key, parsed)}
    if not isinstance(obj, BaseModel) or (name := _field_name(obj, parts[0])) is None:
        return obj  # an unknown key: reported, and no field to mark
    child = getattr(obj, name)
    marked = mark_failed(child, parts[1:], key, parsed) if len(parts) > 1 and isinstance(child, BaseModel | dict) else marker
    return obj.model_copy(update={name: marked})


def _field_name(obj: BaseModel, key: str) -> str | None:
    return next((name for name, f in type(obj).model_fields.items() if key in (f.alias, name)), None)
