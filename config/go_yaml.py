"""YAML read the way Pulumi's CLI reads a stack file: gopkg.in/yaml.v3 decoding into ``any``
(pulumi/pulumi sdk/go/common/encoding/marshal.go, ``yamlMarshaler.Unmarshal``), not PyYAML's YAML 1.1.

What yaml.v3 (its ``resolve.go``) makes of a plain, unquoted scalar, and so what the program gets:

* booleans: ``true``/``True``/``TRUE``, ``false``/``False``/``FALSE``; ``yes``, ``no``, ``on``,
  ``off``, ``y``, ``n`` stay strings (YAML 1.2's core schema);
* null: empty, ``~``, ``null``/``Null``/``NULL``;
* integers: what Go's ``strconv.ParseInt(s, 0, 64)`` reads once every ``_`` is removed: ``+5``,
  ``0x1F``, ``0o17``, ``0b101`` and, kept from YAML 1.1, ``0777`` as octal (511); above int64 a
  uint64;
* floats: ``[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?`` (``1.30`` is the number 1.3,
  ``1e3`` is 1000.0), and ``.inf``/``.nan`` (which Pulumi then cannot hold: refused here);
* a date or time (``2024-01-02``): yaml.v3 makes it a Go ``time.Time`` and Pulumi its Go text
  (``2024-01-02 00:00:00 +0000 UTC``): refused here, quote it;
* everything else a string. Quoted and block scalars are strings.

Explicit tags: ``!!str``, ``!!int``, ``!!float``, ``!!bool``, ``!!null`` resolve the text as above and
must agree (``!!float 1`` is 1.0); ``!!binary`` is its decoded text; other tags are ignored (a
scalar's text, a sequence, a mapping), as yaml.v3 does when decoding into ``any``.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import math
import re
from typing import Any

import yaml

_WORDS: dict[str, Any] = {
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), None),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), math.nan),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), math.inf),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), -math.inf),
}
_FLOAT_RE = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
# yaml.v3 parseTimestamp: YYYY- first, then one of Go's layouts 2006-1-2T15:4:5.999999999Z07:00
# (also with t), 2006-1-2 15:4:5.999999999, 2006-1-2
_TIMESTAMP_RE = re.compile(
    r"^(?P<y>\d{4})-(?P<mo>\d{1,2})-(?P<d>\d{1,2})"
    r"([Tt](?P<h>\d{1,2}):(?P<mi>\d{1,2}):(?P<s>\d{1,2})(\.\d+)?(Z|[+-](?P<oh>\d{2}):(?P<om>\d{2}))| (?P<h2>\d{1,2}):(?P<mi2>\d{1,2}):(?P<s2>\d{1,2})(\.\d+)?)?$"
)
_DIGITS = {2: "01", 8: "01234567", 10: "0123456789", 16: "0123456789abcdef"}
INT64 = (-(2**63), 2**63 - 1)

STR, INT, FLOAT, BOOL, NULL, TIMESTAMP = "str", "int", "float", "bool", "null", "timestamp"
_CORE = "tag:yaml.org,2002:"
_PLAIN = "tag:pulumi.yaml.v3,plain"  # a plain scalar, resolved when constructed


class GoYamlRefused(yaml.MarkedYAMLError):
    """A value Pulumi's CLI would not load or would turn into something else; ``problem`` is one line."""

    def __init__(self, problem: str, node: yaml.Node):
        super().__init__(problem=problem, problem_mark=node.start_mark)


def _go_int(text: str) -> int | None:
    """Go's strconv.ParseInt(text, 0, 64), then ParseUint(text, 0, 64); None where both fail."""
    sign, body = (-1 if text[:1] == "-" else 1), text[1:] if text[:1] in "+-" else text
    low = body.lower()
    if low[:2] in ("0x", "0b", "0o"):
        base, digits = {"x": 16, "b": 2, "o": 8}[low[1]], low[2:]
    elif len(body) > 1 and body[0] == "0":
        base, digits = 8, low[1:]
    else:
        base, digits = 10, low
    if not digits or any(c not in _DIGITS[base] for c in digits):
        return None
    value = sign * int(digits, base)
    if INT64[0] <= value <= INT64[1]:
        return value
    if text[:1] not in "+-" and value < 2**64:  # ParseUint takes no sign
        return value
    return None


def _is_timestamp(text: str) -> bool:
    """A date or time yaml.v3 reads as one: a layout of :data:`_TIMESTAMP_RE` that Go's
    ``time.Parse`` also takes, its values in range (month 1-12, a day of that month, hour 0-23,
    minute and second 0-59, a zone offset of at most 24:60). ``2024-13-45`` is no date, so
    yaml.v3 keeps it as text (its parseTimestamp fails and resolve falls through to a string)."""
    m = _TIMESTAMP_RE.match(text)
    if not m:
        return False
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    year, month, day = g["y"], g["mo"], g["d"]
    if not 1 <= month <= 12 or not 1 <= day <= calendar.monthrange(year or 2000, month)[1]:  # year 0 is a leap year, as 2000
        return False
    hour, minute, second = g.get("h", g.get("h2", 0)), g.get("mi", g.get("mi2", 0)), g.get("s", g.get("s2", 0))
    return hour <= 23 and minute <= 59 and second <= 59 and g.get("oh", 0) <= 24 and g.get("om", 0) <= 60


def resolve(text: str) -> tuple[str, Any]:
    """(kind, value) of a plain scalar, as yaml.v3's ``resolve("", text)``."""
    if text in _WORDS:
        value = _WORDS[text]
        return (BOOL if isinstance(value, bool) else NULL if value is None else FLOAT), value
    hint = text[0]
    if hint == ".":
        if "_" not in text:  # Go's ParseFloat takes no underscores without a base prefix
            try:
                value = float(text)
            except ValueError:
                return STR, text
            if not math.isinf(value):  # out of range: Go's ParseFloat fails
                return FLOAT, value
    elif hint in "0123456789+-":
        if _is_timestamp(text):
            return TIMESTAMP, text
        plain = text.replace("_", "")
        number = _go_int(plain) if plain else None
        if number is not None:
            return INT, number
        if _FLOAT_RE.match(plain) and not math.isinf(value := float(plain)):
            return FLOAT, value
    return STR, text


def _checked(kind: str, value: Any, node: yaml.Node) -> Any:
    if kind == TIMESTAMP:
        raise GoYamlRefused(f"{value} is a YAML timestamp, which Pulumi turns into Go's time text (such as '2024-01-02 00:00:00 +0000 UTC'); quote it for the text as written", node)
    if kind == FLOAT and not math.isfinite(value):
        raise GoYamlRefused(f"{node.value} is not a finite number, which Pulumi cannot hold in config (JSON); quote it for a string", node)
    return value


class GoYamlLoader(yaml.SafeLoader):
    """SafeLoader whose scalars resolve as yaml.v3 decodes them into ``any`` (module docstring)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> str:
        if kind is yaml.ScalarNode and implicit[0]:
            return _CORE + "merge" if value == "<<" else _PLAIN
        return super().resolve(kind, value, implicit)

    def construct_plain(self, node: yaml.ScalarNode) -> Any:
        return _checked(*resolve(node.value), node)

    def construct_tagged(self, node: yaml.ScalarNode) -> Any:
        wanted = node.tag[len(_CORE):]
        kind, value = resolve(node.value) if node.value else (NULL, None)
        if kind == INT and wanted == FLOAT:
            kind, value = FLOAT, float(value)  # pyright: ignore[reportArgumentType]  (an INT: a number)
        if kind != wanted:
            raise GoYamlRefused(f"cannot decode !!{kind} `{node.value}` as a !!{wanted}", node)
        return _checked(kind, value, node)

    def construct_go_str(self, node: yaml.ScalarNode) -> str:
        return node.value

    def construct_go_binary(self, node: yaml.ScalarNode) -> str:
        try:
            return base64.b64decode("".join(node.value.split()), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise GoYamlRefused("!!binary value contains invalid base64 data", node) from None

    def construct_go_timestamp(self, node: yaml.ScalarNode) -> Any:
        return _checked(TIMESTAMP, node.value, node)

    def construct_other(self, node: yaml.Node) -> Any:
        """Any other tag: ignored, as yaml.v3 decoding into ``any`` does."""
        if isinstance(node, yaml.SequenceNode):
            return self.construct_yaml_seq(node)
        if isinstance(node, yaml.MappingNode):
            return self.construct_yaml_map(node)
        return self.construct_scalar(node)  # pyright: ignore[reportArgumentType]  (neither a sequence nor a mapping: a scalar)


GoYamlLoader.yaml_constructors = {
    **{tag: fn for tag, fn in yaml.SafeLoader.yaml_constructors.items() if tag in (_CORE + "seq", _CORE + "map")},
    _PLAIN: GoYamlLoader.construct_plain,
    **{_CORE + kind: GoYamlLoader.construct_tagged for kind in (INT, FLOAT, BOOL, NULL)},
    _CORE + STR: GoYamlLoader.construct_go_str,
    _CORE + "binary": GoYamlLoader.construct_go_binary,
    _CORE + TIMESTAMP: GoYamlLoader.construct_go_timestamp,
    None: GoYamlLoader.construct_other,
}


def load(text: str) -> Any:
    """One YAML document, as Pulumi's CLI reads it (no checks beyond that)."""
    loader = GoYamlLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
