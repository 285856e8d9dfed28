"""CEL values for the evaluator (tools/cel.py): errors, objects, lists, optionals, Kubernetes quantities and URLs, and the conversions between Python/JSON and CEL."""

from __future__ import annotations

import base64
import fractions
import re
import urllib.parse

from celpy import celtypes
from celpy.evaluation import CELEvalError

VALIDATIONS = "x-kubernetes-validations"
INT64_MIN, INT64_MAX, UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1


class CELError(Exception):
    """A rule that did not compile (kind ``compile``), used something this evaluator lacks
    (``unsupported``) or failed at run time on the data (``runtime``, as in cel-go)."""

    def __init__(self, message: str, kind: str = "runtime"):
        super().__init__(message)
        self.kind = kind


class _Unsupported(CELEvalError):
    """An error of the evaluator rather than of the data: an unknown function or identifier."""


def _err(message: str) -> CELEvalError:
    return CELEvalError(message)


def _no_overload(name: str, *args) -> CELEvalError:
    return CELEvalError(f"no such overload: {name}({', '.join(_type_name(a) for a in args)})")


# --- values ---------------------------------------------------------------------------------------------


class ObjectValue(celtypes.MapType):
    """An object of the schema (declared properties): field names may be escaped in rules."""


class UnorderedList(celtypes.ListType):
    """A list with ``x-kubernetes-list-type`` set or map: equality ignores the order of the items."""


class OptionalValue:
    """cel-go's ``optional_type``; ``oldSelf`` of an ``optionalOldSelf`` rule."""

    __slots__ = ("value",)
    _NONE = object()

    def __init__(self, value=_NONE):
        self.value = value

    @property
    def present(self) -> bool:
        return self.value is not OptionalValue._NONE

    def __repr__(self):
        return f"optional.of({self.value!r})" if self.present else "optional.none()"


class _OptionalNamespace:
    """The identifier ``optional`` (``optional.none()``, ``optional.of(x)``)."""


OPTIONAL = _OptionalNamespace()


class Quantity:
    """A Kubernetes resource quantity (``quantity('1Gi')``), held exactly."""

    _RE = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
    _SUFFIX = {
        "": 1, "n": fractions.Fraction(1, 10**9), "u": fractions.Fraction(1, 10**6), "m": fractions.Fraction(1, 1000),
        "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
        "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    }  # fmt: skip

    def __init__(self, value: fractions.Fraction, text: str):
        self.value, self.text = value, text

    @classmethod
    def parse(cls, text: str) -> Quantity | None:
        m = cls._RE.fullmatch(text)
        if not m:
            return None
        sign, number, suffix = m.group(1), m.group(2), m.group(3) or ""
        scale = fractions.Fraction(10) ** int(suffix[1:]) if suffix[:1] in ("e", "E") else cls._SUFFIX[suffix]
        value = fractions.Fraction(number) * scale
        return cls(-value if sign == "-" else value, text)

    def __repr__(self):
        return f"quantity({self.text!r})"


class URLValue:
    """A URL (``url('https://...')``), parsed like Go's ``url.ParseRequestURI``."""

    def __init__(self, text: str, parts: urllib.parse.SplitResult):
        self.text, self.parts = text, parts

    @classmethod
    def parse(cls, text: str) -> URLValue | None:
        if not text or any(ord(c) < 0x21 or c == "\x7f" for c in text):
            return None
        scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", text)
        if not scheme and not text.startswith("/"):
            return None
        try:
            parts = urllib.parse.urlsplit(text, allow_fragments=False)
            parts.port  # noqa: B018 -- validates the port
        except ValueError:
            return None
        return cls(text, parts)

    def __repr__(self):
        return f"url({self.text!r})"


_CEL_TYPES = (celtypes.BoolType, celtypes.IntType, celtypes.UintType, celtypes.DoubleType, celtypes.StringType, celtypes.BytesType,
              celtypes.ListType, celtypes.MapType, celtypes.TimestampType, celtypes.DurationType, OptionalValue, Quantity, URLValue)  # fmt: skip


def _type_name(v) -> str:
    if v is None:
        return "null"
    names = {celtypes.BoolType: "bool", celtypes.IntType: "int", celtypes.UintType: "uint", celtypes.DoubleType: "double",
             celtypes.StringType: "string", celtypes.BytesType: "bytes", celtypes.ListType: "list", celtypes.MapType: "map",
             celtypes.TimestampType: "timestamp", celtypes.DurationType: "duration", OptionalValue: "optional",
             Quantity: "Quantity", URLValue: "URL"}  # fmt: skip
    for cls, name in names.items():
        if isinstance(v, cls):
            return name
    return type(v).__name__


def to_cel(value, schema: dict | None = None):
    """Python data (decoded YAML/JSON) -> CEL value, typed by the structural schema node when given."""
    s = schema or {}
    if value is None:
        return None
    if isinstance(value, _CEL_TYPES):
        return value
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        if s.get("type") == "number":
            return celtypes.DoubleType(value)
        return celtypes.IntType(value) if INT64_MIN <= value <= INT64_MAX else celtypes.DoubleType(value)
    if isinstance(value, float):
        return celtypes.DoubleType(value)
    if isinstance(value, str):
        return _string_value(value, s.get("format") if s.get("type") == "string" else None)
    if isinstance(value, dict):
        props = s.get("properties")
        extra = s.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else None
        if props is not None:
            return ObjectValue({celtypes.StringType(k): to_cel(v, props.get(k) or extra) for k, v in value.items()})
        return celtypes.MapType({celtypes.StringType(k): to_cel(v, extra) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        items = s.get("items") if isinstance(s.get("items"), dict) else None
        cls = UnorderedList if s.get("x-kubernetes-list-type") in ("set", "map") else celtypes.ListType
        return cls([to_cel(v, items) for v in value])
    raise TypeError(f"cannot convert {type(value).__name__} to CEL")


def _string_value(value: str, fmt: str | None):
    try:
        if fmt == "date-time" or fmt == "date":
            return celtypes.TimestampType(value if fmt == "date-time" else value + "T00:00:00Z")
        if fmt == "duration":
            return celtypes.DurationType(value)
        if fmt == "byte":
            return celtypes.BytesType(base64.b64decode(value, validate=True))
    except (ValueError, TypeError, OverflowError):
        pass  # the OpenAPI check reports a malformed value; CEL sees the string
    return celtypes.StringType(value)


def to_python(value):
    """CEL value -> plain Python (for callers and tests)."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, (celtypes.IntType, celtypes.UintType)):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.BytesType):
        return bytes(value)
    if isinstance(value, celtypes.ListType):
        return [to_python(v) for v in value]
    if isinstance(value, celtypes.MapType):
        return {to_python(k): to_python(v) for k, v in value.items()}
    return value


