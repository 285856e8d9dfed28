"""The Kubernetes CEL library as the API server has it: strings, regexes, lists, quantities, URLs and optionals."""

from __future__ import annotations

import fractions
import functools
import operator
import urllib.parse

import re2
from celpy import celtypes
from celpy.evaluation import CELEvalError

from tools.cel_semantics import _and, _bool, _double, _eq, _errors, _in, _index, _int, _is_bool_value, _is_num, _ne, _not, _or, _ordering, _size, _string, _uint, cel_equal
from tools.cel_values import INT64_MAX, INT64_MIN, OptionalValue, Quantity, URLValue, _err, _no_overload, _OptionalNamespace


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

