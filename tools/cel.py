"""CEL validation rules of CRDs (``x-kubernetes-validations``), evaluated offline as the API server does.

The grammar, parser and tree interpreter come from cel-python (``celpy``). The API server runs
cel-go, and cel-python 0.5.0 differs from it where CRD rules depend on it; this module overrides the
interpreter there (``_Evaluator`` and ``FUNCTIONS``) so that rules behave as in cel-go:

- ``has(a.f)`` evaluates ``a`` and propagates its error (cel-python returns false instead, so
  ``has(self.missing.f)`` hid the error);
- ``filter``/``map``/``exists_one`` propagate an error of the predicate (cel-python kept the element or
  raised past ``||``/``&&``); ``all``/``exists`` absorb errors only when another element decides;
- ``==``/``!=``/``in`` use heterogeneous equality (``1 == 'a'`` is false, ``1 == 1.0`` true) instead of
  raising; ``<``/``>`` compare int, uint and double with each other;
- ``int()`` parses strings like Go's ``strconv.ParseInt`` (no spaces, underscores, hex or decimals) and
  range-checks doubles; ``bool()``/``uint()``/``double()``/``string()`` are strict likewise;
- list indexes must be in range (cel-python accepted negative indexes);
- ``size(null)`` and ``?:``, ``&&``, ``||``, ``!`` on non-bools are errors.

Values are converted with the schema, as the API server does: ``integer`` -> int, ``number`` -> double,
``x-kubernetes-int-or-string`` -> int or string, ``date-time``/``duration``/``byte`` strings -> timestamp,
duration, bytes; lists of ``x-kubernetes-list-type`` set/map compare without regard to order; escaped
property names (``__dash__``, ``__dot__``, ``__slash__``, ``__underscores__``, ``__{keyword}__``) work.

Kubernetes CEL libraries: the strings extension (``split``, ``lowerAscii``, ``indexOf``, ...), regex
(``find``, ``findAll``), lists (``isSorted``, ``sum``, ``min``, ``max``, ``indexOf``), URLs (``url``,
``isURL`` and getters), quantities (``quantity``, ``isQuantity`` and methods) and optionals (for
``optionalOldSelf``). Not implemented (a rule that uses them is reported, never passed): ``format``,
``ip``/``cidr``, ``semver``, the optional syntax ``.?f``/``[?i]``.
"""

from __future__ import annotations

import base64
import copy
import fractions
import functools
import math
import operator
import re
import urllib.parse
from typing import Any, cast

import lark
import re2
from celpy import celtypes
from celpy.celparser import CELParser
from celpy.evaluation import Activation, CELEvalError, Evaluator, NameContainer

__all__ = ["CELError", "Program", "apply_defaults", "compile_rule", "evaluate", "rule_problems", "to_cel"]

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


# --- semantics of cel-go --------------------------------------------------------------------------------


def _is_bool(v) -> bool:
    return isinstance(v, bool)  # BoolType is an int subclass, so test it first everywhere


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_bool_value(v) -> bool:
    return isinstance(v, (bool, celtypes.BoolType))


def _num(v):
    return float(v) if isinstance(v, float) else int(v)


def cel_equal(a, b) -> bool:
    """cel-go's heterogeneous equality: values of different types are unequal, numbers compare by value."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, celtypes.BoolType) or isinstance(b, celtypes.BoolType) or _is_bool(a) or _is_bool(b):
        return _is_bool_value(a) and _is_bool_value(b) and bool(a) == bool(b)
    if _is_num(a) or _is_num(b):
        return _is_num(a) and _is_num(b) and _num(a) == _num(b)
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and str.__eq__(a, b)
    if isinstance(a, bytes) or isinstance(b, bytes):
        return isinstance(a, bytes) and isinstance(b, bytes) and bytes(a) == bytes(b)
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return False
        if isinstance(a, UnorderedList) or isinstance(b, UnorderedList):
            unused = list(b)
            for x in a:
                for i, y in enumerate(unused):
                    if cel_equal(x, y):
                        del unused[i]
                        break
                else:
                    return False
            return True
        return all(cel_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) != len(b):
            return False
        for k, v in a.items():
            found = _map_lookup(b, k)
            if found is _MISSING or not cel_equal(v, found):
                return False
        return True
    if isinstance(a, OptionalValue) and isinstance(b, OptionalValue):
        return a.present == b.present and (not a.present or cel_equal(a.value, b.value))
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return a.value == b.value
    if isinstance(a, URLValue) and isinstance(b, URLValue):
        return a.text == b.text
    for cls in (celtypes.TimestampType, celtypes.DurationType):
        if isinstance(a, cls) or isinstance(b, cls):
            return isinstance(a, cls) and isinstance(b, cls) and a == b
    if isinstance(a, type) or isinstance(b, type):
        return a is b
    return False


_MISSING = object()


def _map_lookup(m: dict, key):
    if isinstance(key, str):
        return dict.get(m, key, _MISSING)
    for k, v in m.items():
        if cel_equal(k, key):
            return v
    return _MISSING


def _errors(*args):
    for a in args:
        if isinstance(a, CELEvalError):
            return a
    return None


def _eq(a, b):
    return _errors(a, b) or celtypes.BoolType(cel_equal(a, b))


def _ne(a, b):
    return _errors(a, b) or celtypes.BoolType(not cel_equal(a, b))


def _ordering(name: str, op):
    def compare(a, b):
        if err := _errors(a, b):
            return err
        if _is_bool_value(a) and _is_bool_value(b):
            return celtypes.BoolType(op(bool(a), bool(b)))
        if _is_bool_value(a) or _is_bool_value(b):
            return _no_overload(name, a, b)
        if _is_num(a) and _is_num(b):
            return celtypes.BoolType(op(_num(a), _num(b)))
        for cls in (str, bytes, celtypes.TimestampType, celtypes.DurationType):
            if isinstance(a, cls) and isinstance(b, cls):
                return celtypes.BoolType(op(a, b))
        return _no_overload(name, a, b)

    return compare


def _in(item, container):
    if err := _errors(item, container):
        return err
    if isinstance(container, list):
        return celtypes.BoolType(any(cel_equal(item, x) for x in container))
    if isinstance(container, dict):
        return celtypes.BoolType(_map_lookup(container, item) is not _MISSING)
    return _no_overload("@in", item, container)


def _and(a, b):
    for x in (a, b):
        if _is_bool_value(x) and not x:
            return celtypes.BoolType(False)
    if err := _errors(a, b):
        return err
    if not (_is_bool_value(a) and _is_bool_value(b)):
        return _no_overload("_&&_", a, b)
    return celtypes.BoolType(True)


def _or(a, b):
    for x in (a, b):
        if _is_bool_value(x) and x:
            return celtypes.BoolType(True)
    if err := _errors(a, b):
        return err
    if not (_is_bool_value(a) and _is_bool_value(b)):
        return _no_overload("_||_", a, b)
    return celtypes.BoolType(False)


def _not(a):
    if err := _errors(a):
        return err
    if not _is_bool_value(a):
        return _no_overload("!_", a)
    return celtypes.BoolType(not a)


def _index(container, key):
    if err := _errors(container, key):
        return err
    if isinstance(container, list):
        if _is_bool_value(key) or not _is_num(key) or (isinstance(key, float) and not key.is_integer()):
            return _no_overload("_[_]", container, key)
        i = int(key)
        if not 0 <= i < len(container):
            return _err(f"index out of range: {i}")
        return list.__getitem__(container, i)
    if isinstance(container, dict):
        found = _map_lookup(container, key)
        return _err(f"no such key: {key}") if found is _MISSING else found
    return _no_overload("_[_]", container, key)


def _size(v):
    if isinstance(v, (str, bytes, list, dict)):
        return celtypes.IntType(len(v))
    return _no_overload("size", v)


def _int(v):
    if _is_bool_value(v):
        return _no_overload("int", v)
    if isinstance(v, celtypes.UintType) or (isinstance(v, int) and not isinstance(v, celtypes.IntType)):
        return celtypes.IntType(v) if INT64_MIN <= v <= INT64_MAX else _err("integer overflow")
    if isinstance(v, celtypes.IntType):
        return v
    if isinstance(v, float):
        if math.isnan(v) or v <= INT64_MIN or v >= 2.0**63:
            return _err("integer overflow")
        return celtypes.IntType(math.trunc(v))
    if isinstance(v, str):
        if not re.fullmatch(r"[+-]?[0-9]+", v) or not INT64_MIN <= int(v) <= INT64_MAX:
            return _err(f"cannot convert {str(v)!r} to int")
        return celtypes.IntType(int(v))
    if isinstance(v, celtypes.TimestampType):
        return celtypes.IntType(math.floor(v.timestamp()))
    return _no_overload("int", v)


def _uint(v):
    if _is_bool_value(v):
        return _no_overload("uint", v)
    if isinstance(v, int):
        return celtypes.UintType(v) if 0 <= v <= UINT64_MAX else _err("unsigned integer overflow")
    if isinstance(v, float):
        if math.isnan(v) or v < 0 or v >= 2.0**64:
            return _err("unsigned integer overflow")
        return celtypes.UintType(math.trunc(v))
    if isinstance(v, str):
        if not re.fullmatch(r"[0-9]+", v) or int(v) > UINT64_MAX:
            return _err(f"cannot convert {str(v)!r} to uint")
        return celtypes.UintType(int(v))
    return _no_overload("uint", v)


_FLOAT_RE = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)", re.IGNORECASE)


def _double(v):
    if _is_bool_value(v):
        return _no_overload("double", v)
    if _is_num(v):
        return celtypes.DoubleType(float(v))
    if isinstance(v, str):
        if not _FLOAT_RE.fullmatch(v):
            return _err(f"cannot convert {str(v)!r} to double")
        return celtypes.DoubleType(float(v))
    return _no_overload("double", v)


def _bool(v):
    if _is_bool_value(v):
        return celtypes.BoolType(bool(v))
    if isinstance(v, str):
        if v in ("1", "t", "T", "TRUE", "true", "True"):
            return celtypes.BoolType(True)
        if v in ("0", "f", "F", "FALSE", "false", "False"):
            return celtypes.BoolType(False)
        return _err(f"cannot convert {str(v)!r} to bool")
    return _no_overload("bool", v)


def _string(v):
    if _is_bool_value(v):
        return celtypes.StringType("true" if v else "false")
    if isinstance(v, str):
        return celtypes.StringType(v)
    if isinstance(v, int):
        return celtypes.StringType(str(int(v)))
    if isinstance(v, float):
        return celtypes.StringType(repr(float(v)).replace("inf", "+Inf").replace("nan", "NaN").replace("-+Inf", "-Inf"))
    if isinstance(v, bytes):
        try:
            return celtypes.StringType(bytes(v).decode("utf-8"))
        except UnicodeDecodeError:
            return _err("invalid UTF-8 in bytes")
    if isinstance(v, (celtypes.TimestampType, celtypes.DurationType)):
        return celtypes.StringType(str(v))
    if isinstance(v, URLValue):
        return celtypes.StringType(v.text)
    return _no_overload("string", v)


def _strings(name: str, *args):
    """Type check of a string function's arguments: an error value, or None when all are strings."""
    if err := _errors(*args):
        return err
    if not all(isinstance(a, str) for a in args):
        return _no_overload(name, *args)
    return None


@functools.lru_cache(maxsize=512)
def _regex(pattern: str):
    return re2.compile(pattern)


def _with_regex(name: str, text, pattern, fn):
    if err := _strings(name, text, pattern):
        return err
    try:
        compiled = _regex(str(pattern))
    except re2.error as ex:
        return _err(f"invalid regular expression {str(pattern)!r}: {ex}")
    return fn(compiled)


def _matches(text, pattern):
    return _with_regex("matches", text, pattern, lambda r: celtypes.BoolType(r.search(str(text)) is not None))


def _find(text, pattern):
    def first(r):
        m = r.search(str(text))
        return celtypes.StringType(m.group(0) if m else "")

    return _with_regex("find", text, pattern, first)


def _find_all(text, pattern, limit=None):
    if limit is not None and not isinstance(limit, int):
        return _no_overload("findAll", text, pattern, limit)

    def every(r):
        found = [celtypes.StringType(m.group(0)) for m in r.finditer(str(text))]
        if limit is not None and limit >= 0:
            found = found[: int(limit)]
        return celtypes.ListType(found)

    return _with_regex("findAll", text, pattern, every)


def _string_fn(name: str, fn, arity: tuple[int, ...]):
    """A string method: receiver and string arguments checked, then ``fn`` on plain ``str``."""

    def method(*args):
        if len(args) not in arity:
            return _no_overload(name, *args)
        if err := _strings(name, *args):
            return err
        return fn(*(str(a) for a in args))

    method.__name__ = name
    return method


def _split(text, sep, limit=None):
    if err := _strings("split", text, sep):
        return err
    if limit is not None and (_is_bool_value(limit) or not isinstance(limit, int)):
        return _no_overload("split", text, sep, limit)
    text, sep = str(text), str(sep)
    n = -1 if limit is None else int(limit)
    if n == 0:
        return celtypes.ListType()
    if sep == "":
        parts = list(text)
        if n > 0 and len(parts) > n:
            parts = parts[: n - 1] + ["".join(parts[n - 1 :])]
    else:
        parts = text.split(sep) if n < 0 else text.split(sep, n - 1)
    return celtypes.ListType(celtypes.StringType(p) for p in parts)


def _checked_int(name: str, *args):
    for a in args:
        if _is_bool_value(a) or not isinstance(a, int):
            return _no_overload(name, *args)
    return None


def _index_of(target, item, offset=None):
    if isinstance(target, list):
        if offset is not None:
            return _no_overload("indexOf", target, item, offset)
        return celtypes.IntType(next((i for i, x in enumerate(target) if cel_equal(x, item)), -1))
    if err := _strings("indexOf", target, item) or (offset is not None and _checked_int("indexOf", offset)):
        return err
    start = 0 if offset is None else int(offset)
    if not 0 <= start <= len(target):
        return _err(f"index out of range: {start}")
    return celtypes.IntType(str(target).find(str(item), start))


def _last_index_of(target, item, offset=None):
    if isinstance(target, list):
        if offset is not None:
            return _no_overload("lastIndexOf", target, item, offset)
        return celtypes.IntType(next((i for i in range(len(target) - 1, -1, -1) if cel_equal(target[i], item)), -1))
    if err := _strings("lastIndexOf", target, item) or (offset is not None and _checked_int("lastIndexOf", offset)):
        return err
    end = len(target) if offset is None else int(offset)
    if not 0 <= end <= len(target):
        return _err(f"index out of range: {end}")
    return celtypes.IntType(str(target).rfind(str(item), 0, end + len(item)))


def _substring(text, start, end=None):
    if err := _strings("substring", text) or _checked_int("substring", start, *([] if end is None else [end])):
        return err
    stop = len(text) if end is None else int(end)
    if not 0 <= int(start) <= stop <= len(text):
        return _err(f"substring out of range: [{start}:{stop}] of a string of {len(text)}")
    return celtypes.StringType(str(text)[int(start) : stop])


def _char_at(text, i):
    if err := _strings("charAt", text) or _checked_int("charAt", i):
        return err
    if not 0 <= int(i) <= len(text):
        return _err(f"index out of range: {i}")
    return celtypes.StringType(str(text)[int(i) : int(i) + 1])


def _replace(text, old, new, limit=None):
    if err := _strings("replace", text, old, new) or (limit is not None and _checked_int("replace", limit)):
        return err
    return celtypes.StringType(str(text).replace(str(old), str(new), -1 if limit is None else int(limit)))


def _join(items, sep=None):
    if err := _errors(items, sep):
        return err
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items) or not (sep is None or isinstance(sep, str)):
        return _no_overload("join", items, *([] if sep is None else [sep]))
    return celtypes.StringType(("" if sep is None else str(sep)).join(str(x) for x in items))


def _lower_ascii(s: str):
    return celtypes.StringType(s.translate(str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")))


def _upper_ascii(s: str):
    return celtypes.StringType(s.translate(str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")))


def _comparable_list(name: str, items):
    if err := _errors(items):
        return err
    if not isinstance(items, list):
        return _no_overload(name, items)
    for i in range(1, len(items)):
        r = _ordering(name, operator.lt)(items[i - 1], items[i])
        if isinstance(r, CELEvalError):
            return r
    return None


def _is_sorted(items):
    if err := _comparable_list("isSorted", items):
        return err
    return celtypes.BoolType(all(not _ordering("isSorted", operator.gt)(items[i - 1], items[i]) for i in range(1, len(items))))


def _sum(items):
    if err := _comparable_list("sum", items):
        return err
    if not items:
        return celtypes.IntType(0)
    total = items[0]
    for x in items[1:]:
        try:
            total = total + x
        except (TypeError, ValueError) as ex:
            return _err(f"sum: {ex}")
    return total


def _extreme(name: str, pick):
    def fn(items):
        if err := _comparable_list(name, items):
            return err
        if not items:
            return _err(f"{name} of an empty list")
        best = items[0]
        for x in items[1:]:
            if pick(x, best):
                best = x
        return best

    fn.__name__ = name
    return fn


def _quantity(text):
    if err := _strings("quantity", text):
        return err
    q = Quantity.parse(str(text))
    return q if q is not None else _err(f"invalid quantity: {str(text)!r}")


def _is_quantity(text):
    return _strings("isQuantity", text) or celtypes.BoolType(Quantity.parse(str(text)) is not None)


def _quantity_method(name: str, fn, other: bool = False):
    def method(q, *args):
        if err := _errors(q, *args):
            return err
        if not isinstance(q, Quantity) or len(args) != (1 if other else 0):
            return _no_overload(name, q, *args)
        if other:
            arg = args[0]
            if _is_num(arg) and not isinstance(arg, float):
                arg = Quantity(fractions.Fraction(int(arg)), str(int(arg)))
            if not isinstance(arg, Quantity):
                return _no_overload(name, q, *args)
            return fn(q, arg)
        return fn(q)

    method.__name__ = name
    return method


def _as_integer(q: Quantity):
    if q.value.denominator != 1 or not INT64_MIN <= q.value <= INT64_MAX:
        return _err(f"cannot convert quantity {q.text!r} to an int64")
    return celtypes.IntType(int(q.value))


def _quantity_of(value: fractions.Fraction) -> Quantity:
    return Quantity(value, str(value.numerator) if value.denominator == 1 else str(float(value)))


QUANTITY_METHODS = {
    "isInteger": _quantity_method("isInteger", lambda q: celtypes.BoolType(q.value.denominator == 1 and INT64_MIN <= q.value <= INT64_MAX)),
    "asInteger": _quantity_method("asInteger", _as_integer),
    "asApproximateFloat": _quantity_method("asApproximateFloat", lambda q: celtypes.DoubleType(float(q.value))),
    "sign": _quantity_method("sign", lambda q: celtypes.IntType((q.value > 0) - (q.value < 0))),
    "add": _quantity_method("add", lambda q, o: _quantity_of(q.value + o.value), other=True),
    "sub": _quantity_method("sub", lambda q, o: _quantity_of(q.value - o.value), other=True),
    "isGreaterThan": _quantity_method("isGreaterThan", lambda q, o: celtypes.BoolType(q.value > o.value), other=True),
    "isLessThan": _quantity_method("isLessThan", lambda q, o: celtypes.BoolType(q.value < o.value), other=True),
    "compareTo": _quantity_method("compareTo", lambda q, o: celtypes.IntType((q.value > o.value) - (q.value < o.value)), other=True),
}


def _url(text):
    if err := _strings("url", text):
        return err
    u = URLValue.parse(str(text))
    return u if u is not None else _err(f"URL parse error during conversion from string: {str(text)!r}")


def _is_url(text):
    return _strings("isURL", text) or celtypes.BoolType(URLValue.parse(str(text)) is not None)


def _url_method(name: str, fn):
    def method(u, *args):
        if err := _errors(u, *args):
            return err
        if not isinstance(u, URLValue) or args:
            return _no_overload(name, u, *args)
        return fn(u.parts)

    method.__name__ = name
    return method


def _host(p: urllib.parse.SplitResult) -> str:
    return p.netloc.rsplit("@", 1)[-1]


def _query(p: urllib.parse.SplitResult):
    out: dict = {}
    for k, v in urllib.parse.parse_qsl(p.query, keep_blank_values=True):
        out.setdefault(celtypes.StringType(k), celtypes.ListType()).append(celtypes.StringType(v))
    return celtypes.MapType(out)


URL_METHODS = {
    "getScheme": _url_method("getScheme", lambda p: celtypes.StringType(p.scheme)),
    "getHost": _url_method("getHost", lambda p: celtypes.StringType(_host(p))),
    "getHostname": _url_method("getHostname", lambda p: celtypes.StringType(p.hostname or "")),
    "getPort": _url_method("getPort", lambda p: celtypes.StringType("" if p.port is None else str(p.port))),
    "getEscapedPath": _url_method("getEscapedPath", lambda p: celtypes.StringType(p.path)),
    "getQuery": _url_method("getQuery", _query),
}


def _optional_ns(name: str, fn):
    def method(ns, *args):
        if not isinstance(ns, _OptionalNamespace) or len(args) != 1 and name != "none" or args and name == "none":
            return _no_overload(name, ns, *args)
        return fn(*args)

    method.__name__ = name
    return method


def _zero(v) -> bool:
    return v is None or (not isinstance(v, (OptionalValue, Quantity, URLValue, celtypes.TimestampType, celtypes.DurationType)) and not v)


def _optional_method(name: str, fn, arity: int = 0):
    def method(opt, *args):
        if err := _errors(opt, *args):
            return err
        if not isinstance(opt, OptionalValue) or len(args) != arity:
            return _no_overload(name, opt, *args)
        return fn(opt, *args)

    method.__name__ = name
    return method


OPTIONAL_FUNCTIONS = {
    "none": _optional_ns("none", lambda: OptionalValue()),
    "of": _optional_ns("of", lambda v: OptionalValue(v)),
    "ofNonZeroValue": _optional_ns("ofNonZeroValue", lambda v: OptionalValue() if _zero(v) else OptionalValue(v)),
    "hasValue": _optional_method("hasValue", lambda o: celtypes.BoolType(o.present)),
    "value": _optional_method("value", lambda o: o.value if o.present else _err("optional.none() dereference")),
    "orValue": _optional_method("orValue", lambda o, d: o.value if o.present else d, 1),
    "or": _optional_method("or", lambda o, other: o if o.present else other, 1),
}


# Functions by name (methods get the receiver first); they override cel-python's base functions.
FUNCTIONS = {
    "_==_": _eq,
    "_!=_": _ne,
    "_<_": _ordering("_<_", operator.lt),
    "_<=_": _ordering("_<=_", operator.le),
    "_>_": _ordering("_>_", operator.gt),
    "_>=_": _ordering("_>=_", operator.ge),
    "_in_": _in,
    "_&&_": _and,
    "_||_": _or,
    "!_": _not,
    "_[_]": _index,
    "size": _size,
    "int": _int,
    "uint": _uint,
    "double": _double,
    "bool": _bool,
    "string": _string,
    "contains": _string_fn("contains", lambda s, t: celtypes.BoolType(t in s), (2,)),
    "startsWith": _string_fn("startsWith", lambda s, t: celtypes.BoolType(s.startswith(t)), (2,)),
    "endsWith": _string_fn("endsWith", lambda s, t: celtypes.BoolType(s.endswith(t)), (2,)),
    "matches": _matches,
    "find": _find,
    "findAll": _find_all,
    "split": _split,
    "lowerAscii": _string_fn("lowerAscii", _lower_ascii, (1,)),
    "upperAscii": _string_fn("upperAscii", _upper_ascii, (1,)),
    "trim": _string_fn("trim", lambda s: celtypes.StringType(s.strip()), (1,)),
    "reverse": _string_fn("reverse", lambda s: celtypes.StringType(s[::-1]), (1,)),
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _substring,
    "charAt": _char_at,
    "replace": _replace,
    "join": _join,
    "isSorted": _is_sorted,
    "sum": _sum,
    "min": _extreme("min", lambda x, best: _ordering("min", operator.lt)(x, best)),
    "max": _extreme("max", lambda x, best: _ordering("max", operator.gt)(x, best)),
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    **QUANTITY_METHODS,
    "url": _url,
    "isURL": _is_url,
    **URL_METHODS,
    **OPTIONAL_FUNCTIONS,
}

# --- the interpreter ------------------------------------------------------------------------------------

_SKIP = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member"}
_RELATIONS = {"relation_lt": "_<_", "relation_le": "_<=_", "relation_gt": "_>_", "relation_ge": "_>=_", "relation_eq": "_==_", "relation_ne": "_!=_", "relation_in": "_in_"}
_PASS_THROUGH = {"expr", "conditionalor", "conditionaland", "relation", "addition", "multiplication", "unary", "member", "primary", "paren_expr"}
_MACROS = {"all", "exists", "exists_one", "existsOne", "filter", "map"}
_KEYWORDS = {"true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop", "package", "namespace", "return", "var", "void", "while"}


def _unwrap(tree):
    while isinstance(tree, lark.Tree) and tree.data in _PASS_THROUGH and len(tree.children) == 1 and isinstance(tree.children[0], lark.Tree):
        tree = tree.children[0]
    return tree


def _ident(tree) -> str | None:
    node = _unwrap(tree)
    if isinstance(node, lark.Tree) and node.data == "ident":
        return str(node.children[0])
    return None


def _unescape(name: str) -> str:
    """Kubernetes escapes property names that are not CEL identifiers."""
    if name.startswith("__") and name.endswith("__") and name[2:-2] in _KEYWORDS:
        return name[2:-2]
    return re.sub(r"__(underscores|dot|dash|slash)__", lambda m: {"underscores": "__", "dot": ".", "dash": "-", "slash": "/"}[m.group(1)], name)


def _field(target, name: str):
    """``target.name`` (or ``_MISSING``) on a map or schema object."""
    found = dict.get(target, name, _MISSING)
    if found is _MISSING and isinstance(target, ObjectValue) and "__" in name:
        found = dict.get(target, _unescape(name), _MISSING)
    return found


class _Evaluator(Evaluator):
    """cel-python's interpreter with cel-go's semantics where they differ (see the module docstring).

    Variables live in a plain dict (macro variables too) rather than in nested celpy Activations, and
    single-child grammar nodes are skipped: both only for speed.
    """

    def __init__(self, ast, activation, variables: dict | None = None):
        super().__init__(ast, activation)
        self.variables = variables or {}

    def visit(self, tree: lark.Tree) -> Any:
        while tree.data in _SKIP and len(tree.children) == 1:
            tree = cast(lark.Tree, tree.children[0])
        return getattr(self, str(tree.data))(tree)

    def sub_evaluator(self, ast):
        return type(self)(ast, self.activation, self.variables)

    def _bound(self, tree, var: str, value):
        try:
            return type(self)(tree, self.activation, {**self.variables, var: value}).visit(tree)
        except CELEvalError as ex:
            return ex

    def _binary(self, tree, ops: dict):
        if len(tree.children) != 2:
            return self.visit(tree.children[0])
        left_op, right_tree = tree.children
        left = self.visit(left_op.children[0])
        right = self.visit(right_tree)
        return self.activation.functions[ops[left_op.data]](left, right)

    def relation(self, tree):
        return self._binary(tree, _RELATIONS)

    def conditionalor(self, tree):
        if len(tree.children) != 2:
            return self.visit(tree.children[0])
        return _or(self.visit(tree.children[0]), self.visit(tree.children[1]))

    def conditionaland(self, tree):
        if len(tree.children) != 2:
            return self.visit(tree.children[0])
        return _and(self.visit(tree.children[0]), self.visit(tree.children[1]))

    # has(e.f): e must evaluate; its errors propagate (cel-python returned false), so this returns
    # an error value where the base class declares BoolType only
    def macro_has_eval(self, exprlist) -> Any:  # pyright: ignore[reportIncompatibleMethodOverride]
        args = exprlist.children
        node = _unwrap(args[0]) if len(args) == 1 else None
        if not (isinstance(node, lark.Tree) and node.data == "member_dot"):
            return _err("invalid argument to has() macro")
        target = self.visit(node.children[0])
        if isinstance(target, CELEvalError):
            return target
        if isinstance(target, dict):
            return celtypes.BoolType(_field(target, str(node.children[1])) is not _MISSING)
        return _no_overload("has", target)

    def member_dot(self, tree):
        member_tree, name = tree.children
        target = self.visit(member_tree)
        if isinstance(target, CELEvalError):
            return target
        if isinstance(target, NameContainer):
            return super().member_dot(tree)
        if isinstance(target, dict):
            found = _field(target, str(name))
            return _err(f"no such key: {name}") if found is _MISSING else found
        return _err(f"type {_type_name(target)} does not support field selection (.{name})")

    def member_dot_arg(self, tree):
        member_tree, name = tree.children[:2]
        args = tree.children[2].children if len(tree.children) == 3 else []
        var = _ident(args[0]) if args else None
        if str(name) in _MACROS and var is not None and (len(args) == 2 or (len(args) == 3 and str(name) == "map")):
            return self._macro(str(name), member_tree, var, args[1:])
        target = self.visit(member_tree)
        values = self.visit(tree.children[2]) if len(tree.children) == 3 else []
        assert isinstance(name, lark.Token)
        return self.method_eval(target, name, values)

    def _macro(self, name: str, member_tree, var: str, bodies):
        target = self.visit(member_tree)
        if isinstance(target, CELEvalError):
            return target
        if isinstance(target, dict):
            items = list(target.keys())
        elif isinstance(target, list):
            items = list(target)
        else:
            return _no_overload(name, target)
        if name in ("all", "exists"):
            decisive = name == "exists"  # the predicate value that decides the result
            error = None
            for item in items:
                r = self._bound(bodies[0], var, item)
                if _is_bool_value(r):
                    if bool(r) == decisive:
                        return celtypes.BoolType(decisive)
                elif error is None:
                    error = r if isinstance(r, CELEvalError) else _no_overload(name, r)
            return error or celtypes.BoolType(not decisive)
        if name in ("exists_one", "existsOne"):
            count = 0
            for item in items:
                r = self._bound(bodies[0], var, item)
                if not _is_bool_value(r):
                    return r if isinstance(r, CELEvalError) else _no_overload(name, r)
                count += bool(r)
            return celtypes.BoolType(count == 1)
        out = []
        predicate = bodies[0] if name == "filter" or len(bodies) == 2 else None
        for item in items:
            if predicate is not None:
                keep = self._bound(predicate, var, item)
                if not _is_bool_value(keep):
                    return keep if isinstance(keep, CELEvalError) else _no_overload(name, keep)
                if not keep:
                    continue
            if name == "filter":
                out.append(item)
            else:
                value = self._bound(bodies[-1], var, item)
                if isinstance(value, CELEvalError):
                    return value
                out.append(value)
        return celtypes.ListType(out)

    def expr(self, tree):
        if len(tree.children) != 3:
            return super().expr(tree)
        cond = self.visit(tree.children[0])
        if isinstance(cond, CELEvalError):
            return cond
        if not _is_bool_value(cond):
            return _no_overload("_?_:_", cond)
        return self.visit(tree.children[1] if cond else tree.children[2])

    def primary(self, tree):
        child = tree.children[0] if len(tree.children) == 1 else None
        if isinstance(child, lark.Tree) and child.data == "ident":
            name = str(child.children[0])
            if name in self.variables:
                return self.variables[name]
            try:
                return self.ident_value(name)
            except KeyError:
                return _Unsupported(f"undeclared reference to {name!r}")
        return super().primary(tree)

    def function_eval(self, name_token, exprlist=None):
        if str(name_token) not in self.activation.functions:
            return _Unsupported(f"undeclared reference to function {str(name_token)!r}")
        return super().function_eval(name_token, exprlist)

    def method_eval(self, object, method_ident, exprlist=None):
        if str(method_ident) not in self.activation.functions:
            return _Unsupported(f"undeclared reference to function {str(method_ident)!r}")
        return super().method_eval(object, method_ident, exprlist)


@functools.cache
def _parser():
    return CELParser()


class Program:
    """A compiled rule (compile once with :func:`compile_rule`, run many times)."""

    def __init__(self, text: str):
        self.text = text
        try:
            self.ast = _parser().parse(text)
        except Exception as ex:  # lark and celpy raise several kinds
            raise CELError(f"does not compile: {str(ex).strip().splitlines()[0] if str(ex).strip() else type(ex).__name__}", "compile") from None
        idents = {str(t.children[0]) for t in self.ast.find_data("ident")}
        self.uses_old_self = "oldSelf" in idents

    def run(self, variables: dict):
        """Evaluate with the given bindings (CEL values or plain data); return a CEL value or raise CELError."""
        bound: dict[str, Any] = {k: to_cel(v) for k, v in variables.items()}
        bound.setdefault("optional", OPTIONAL)
        activation = Activation(functions=FUNCTIONS, vars=bound)
        try:
            value = _Evaluator(self.ast, activation, bound).visit(self.ast)
        except CELEvalError as ex:
            value = ex
        except RecursionError:
            raise CELError("expression nested too deeply for the evaluator", "unsupported") from None
        except Exception as ex:  # an interpreter failure must be reported, never passed
            raise CELError(f"evaluator failure: {type(ex).__name__}: {ex}", "unsupported") from None
        if isinstance(value, CELEvalError):
            raise CELError(str(value.args[0]) if value.args else "error", "unsupported" if isinstance(value, _Unsupported) else "runtime")
        if isinstance(value, NameContainer) or callable(value) and not isinstance(value, _CEL_TYPES):
            raise CELError(f"expression is not a value: {type(value).__name__}", "unsupported")
        return value


@functools.cache
def _compiled(text: str) -> Program | CELError:
    try:
        return Program(text)
    except CELError as ex:
        return ex


def compile_rule(text: str) -> Program:
    """The compiled program of a rule (cached); raises CELError(kind='compile')."""
    result = _compiled(text)
    if isinstance(result, CELError):
        raise result
    return result


def evaluate(expression: str, **variables):
    """Evaluate a CEL expression with plain Python data bound to names; returns plain Python."""
    return to_python(compile_rule(expression).run(variables))


# --- CRD structure: defaults, the walk, transition rules ------------------------------------------------


def apply_defaults(obj, schema: dict):
    """A copy of ``obj`` with the structural schema's ``default`` values applied (as the API server does)."""
    obj = copy.deepcopy(obj)
    _default(obj, schema)
    return obj


def _default(value, schema):
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if props:
            for k, sub in props.items():
                if "default" in sub and (k not in value or (value[k] is None and not sub.get("nullable"))):
                    value[k] = copy.deepcopy(sub["default"])
            for k, v in value.items():
                if k in props:
                    _default(v, props[k])
        elif isinstance(schema.get("additionalProperties"), dict):
            for v in value.values():
                _default(v, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            _default(v, schema["items"])


def rule_problems(obj, schema: dict, old=None) -> list[str]:
    """Problems (``path: message``) of the CEL rules of a custom resource.

    Without ``old`` (create): every rule without ``oldSelf``, and ``optionalOldSelf`` rules with
    ``oldSelf`` unset. With ``old`` (update): the transition rules, at every node whose old value
    correlates (object properties, map values, items of ``x-kubernetes-list-type: map`` lists matched by
    their keys) with ``oldSelf`` bound to it. Defaults are applied to both first.
    """
    walk = _Walk(update=old is not None)
    walk.node(apply_defaults(obj, schema), schema, "", apply_defaults(old, schema) if old is not None else None, old is not None, root=True)
    return walk.problems


def _map_key(item, keys):
    return tuple(repr(item.get(k)) for k in keys) if isinstance(item, dict) else None


class _Walk:
    def __init__(self, update: bool):
        self.update = update
        self.problems: list[str] = []

    def node(self, value, schema, path, old, has_old, root=False):
        if not isinstance(schema, dict) or (self.update and not has_old):
            return
        if schema.get(VALIDATIONS):
            self.rules(schema[VALIDATIONS], value, schema, path, old, has_old, root)
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
            for k, v in value.items():
                sub = props.get(k) or extra
                if sub is None:
                    continue
                child = f"{path}.{k}" if k in props or not path else f"{path}[{k}]"
                o_has = has_old and isinstance(old, dict) and k in old
                self.node(v, sub, child.lstrip("."), old[k] if o_has else None, o_has)
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            keys = schema.get("x-kubernetes-list-map-keys") or []
            old_items = {}
            if has_old and isinstance(old, list) and schema.get("x-kubernetes-list-type") == "map" and keys:
                old_items = {_map_key(o, keys): o for o in old if isinstance(o, dict)}
            for i, v in enumerate(value):
                key = _map_key(v, keys) if old_items else None
                o_has = key is not None and key in old_items
                self.node(v, schema["items"], f"{path}[{i}]", old_items.get(key), o_has)

    def rules(self, rules, value, schema, path, old, has_old, root):
        cel_self = cel_old = None
        for rule in rules:
            text = rule.get("rule", "")
            where = (path + (rule.get("fieldPath") or "")).lstrip(".") or "<root>"
            try:
                program = compile_rule(text)
            except CELError as ex:
                if not self.update:
                    self.problems.append(f"{where}: could not evaluate rule {text!r}: {ex}")
                continue
            optional = bool(rule.get("optionalOldSelf"))
            variables = {}
            if program.uses_old_self:
                if self.update:
                    if cel_old is None:
                        cel_old = _node_value(old, schema, root)
                    variables["oldSelf"] = OptionalValue(cel_old) if optional else cel_old
                elif optional:
                    variables["oldSelf"] = OptionalValue()
                else:
                    continue  # a transition rule, checked on update only
            elif self.update:
                continue  # checked on create already
            if cel_self is None:
                cel_self = _node_value(value, schema, root)
            variables["self"] = cel_self
            try:
                result = program.run(variables)
            except CELError as ex:
                self.problems.append(f"{where}: could not evaluate rule {text!r}: {ex}")
                continue
            if not _is_bool_value(result):
                self.problems.append(f"{where}: could not evaluate rule {text!r}: it returned {_type_name(result)}, not bool")
            elif not result:
                self.problems.append(f"{where}: {_message(rule, variables)}")


def _node_value(value, schema, root):
    if root and isinstance(value, dict) and isinstance(value.get("metadata"), dict):
        # the API server exposes only metadata.name and metadata.generateName of the object to rules
        value = {**value, "metadata": {k: v for k, v in value["metadata"].items() if k in ("name", "generateName")}}
    return to_cel(value, schema)


def _message(rule: dict, variables: dict) -> str:
    if rule.get("messageExpression"):
        try:
            msg = compile_rule(rule["messageExpression"]).run(variables)
            if isinstance(msg, str) and msg.strip():
                return str(msg)
        except CELError:
            pass
    return rule.get("message") or f"failed rule: {rule.get('rule', '')}"
