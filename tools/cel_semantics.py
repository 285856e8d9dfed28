"""cel-go's semantics where cel-python differs: equality, ordering, membership, logic, indexing and the conversions."""

from __future__ import annotations

import math
import re

from celpy import celtypes
from celpy.evaluation import CELEvalError

from tools.cel_values import INT64_MAX, INT64_MIN, UINT64_MAX, OptionalValue, Quantity, UnorderedList, URLValue, _err, _no_overload

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


