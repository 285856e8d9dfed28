"""The stack-config engine: pydantic v2 models are the schema, every problem is reported at once.

Each settings class is a frozen :class:`Section` (a pydantic model, unknown keys forbidden)
whose fields are declared with :func:`opt`. The field's Python type decides how the raw stack
value is parsed; ``opt`` adds the description (docs/reference.md's table, JSON Schema), allowed choices and a
value check. Keys are camelCase in stack config (aliases) and snake_case in Python (both accepted
when constructing a model in code). Rules that relate several fields of one model live in the
model's :meth:`Section.problems`; rules across sections are the settings module's business.

:func:`validate_section` collects every problem of one section (pydantic's field errors, then the
``problems`` of every model that parsed) as :class:`ConfigError` values; the settings loader
raises them together as one :class:`ConfigErrors`.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal, cast

import annotated_types
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, RootModel, ValidationError
from pydantic.alias_generators import to_camel

from config.failed import Failed, UnknownValue, known, mark_failed  # noqa: F401  (UnknownValue: part of this module's interface)
from config.field_types import INT64, Bool, Float, Int, _as_number, _fail, _unquoted_number  # noqa: F401  (the field types: part of this module's interface)
from config.secrets import REDACTED, UNSHOWN, looks_secret, offline_secret, strings_in  # noqa: F401  (REDACTED, looks_secret: part of this module's interface)

PROJECT = "training-platform"

Check = Callable[[Any], str | None]


class ConfigError(ValueError):
    """One invalid stack-config value: key path, bad value, what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key = key
        self.value = value
        self.allowed = allowed
        super().__init__(_line(key, value, allowed))


class ConfigErrors(ConfigError):
    """Every problem of one config, one line each; ``key``/``value``/``allowed`` are the first's."""

    def __init__(self, errors: Iterable[ConfigError]):
        self.errors = list(errors)
        if not self.errors:
            raise ValueError("ConfigErrors needs at least one error")
        first = self.errors[0]
        self.key, self.value, self.allowed = first.key, first.value, first.allowed
        ValueError.__init__(self, "\n".join(str(e) for e in self.errors))

    @property
    def keys(self) -> list[str]:
        return [e.key for e in self.errors]


def _line(key: str, value: Any, allowed: str) -> str:
    full = key if ":" in key else f"{PROJECT}:{key}"  # aws:region and other namespaces as they are
    if not full.isprintable():  # a key with a newline or control character stays on its one line
        full = full.encode("unicode_escape").decode("ascii")
    shown = repr(value)
    if looks_secret(key, value):
        shown = REDACTED
        for text in sorted(strings_in(value), key=len, reverse=True):  # nor inside the explanation
            allowed = allowed.replace(text, REDACTED) if len(text) > 2 else allowed
    return " ".join(f"invalid config {full} = {shown}: {allowed}".splitlines())


def camel(name: str) -> str:
    return to_camel(name)


def unknown_key_hint(key: str, allowed: list[str]) -> str:
    close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
    hint = f"unknown key; did you mean '{close[0]}'? " if close else "unknown key; "
    return hint + "allowed keys: " + ", ".join(allowed)


# --- field declarations ----------------------------------------------------------------------

class SchemaCheck:
    """A value check (returns the "allowed" text for a bad value) with its JSON Schema keywords."""

    def __init__(self, check: Check, schema: dict[str, Any]):
        self.check = check
        self.schema = schema

    def __call__(self, value: Any) -> str | None:
        return self.check(value)


def _field_check(choices: tuple | None, check: Check | None) -> Callable[[Any], Any]:
    """The value check of a field. A list is judged item by item and every bad item is reported,
    each by its index and value (one line each), not only the first."""

    def problem_of(item: Any) -> str | None:
        if choices is not None and item not in choices:
            close = difflib.get_close_matches(str(item), [str(c) for c in choices], n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return hint + "allowed: " + ", ".join(map(str, choices))
        return check(item) if check is not None else None

    def run(value: Any) -> Any:
        if value is None or offline_secret(value):  # a secure value offline: unknown, judged by Pulumi's preview
            return value
        if isinstance(value, list) and any(offline_secret(v) for v in value):
            run([v for v in value if not offline_secret(v)])
            return value
        if isinstance(value, list):
            found = [(f"[{i}]", item, why) for i, item in enumerate(value) if (why := problem_of(item))]
            if found:
                raise _fail(found[0][2], suffix=found[0][0], value=found[0][1], items=found)
        elif problem := problem_of(value):
            raise _fail(problem)
        return value

    return run


def opt(default: Any, doc: str, *, choices: tuple | None = None, check: Check | None = None, ge: int | None = None, le: int | None = None) -> Any:
    """Declare a settings field: default, description, allowed choices, value check.

    Typed ``Any`` like :func:`pydantic.Field`: it stands in for the field's default. ``check``
    returns the "allowed" text for a bad value (None when fine); a ``schema`` attribute on it (a
    dict) goes into the JSON Schema, as do the choices (``enum``).
    """
    extra: dict[str, Any] = dict(getattr(check, "schema", None) or {})
    if choices is not None:
        extra["enum"] = list(choices)
    top = {"default": list(default)} if isinstance(default, list) and all(isinstance(v, str | int) for v in default) else {}
    kwargs: dict[str, Any] = {"description": doc, "json_schema_extra": _schema_extra(extra, top)}
    # bounds are pydantic's own (Field ge/le: validation and JSON Schema minimum/maximum)
    kwargs.update({k: v for k, v in (("ge", ge), ("le", le)) if v is not None})
    if isinstance(default, list):
        info = Field(default_factory=lambda d=default: list(d), **kwargs)
    elif isinstance(default, BaseModel):
        info = Field(default_factory=lambda d=default: d, **kwargs)
    else:
        info = Field(default, **kwargs)
    if choices is not None and all(isinstance(c, str) for c in choices):
        info.metadata.append(BeforeValidator(_unquoted_number(choices)))
    if choices is not None or check is not None:
        info.metadata.append(AfterValidator(_field_check(choices, check)))
    info.metadata.append(_Choices(choices))
    return info


class _Choices:
    """Field metadata: the allowed values (documentation); pydantic ignores unknown metadata."""

    def __init__(self, choices: tuple | None):
        self.choices = choices


def _schema_extra(extra: dict[str, Any], top: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """Put the constraints where they apply: on a list's items, beside ``null`` for optionals;
    ``top`` (a list default: a factory's value pydantic leaves out) and a list's ``minItems`` on the field itself."""

    def apply(schema: dict[str, Any]) -> None:
        schema.update(top)
        target = schema
        if schema.get("type") == "array":
            schema.update({k: extra[k] for k in ("minItems",) if k in extra})
            target = schema.setdefault("items", {})
        elif "anyOf" in schema:
            target = next((s for s in schema["anyOf"] if s.get("type") != "null"), schema)
        target.update({k: v for k, v in extra.items() if k != "minItems" or target is schema})

    return apply


def choices_of(cls: type[BaseModel], name: str) -> tuple | None:
    """The allowed values of a field: its ``Literal`` annotation (of the field, its list items or
    its optional value), else the ``choices`` given to :func:`opt`."""
    info = cls.model_fields[name]
    literal = _literal_values(info.annotation)
    if literal is not None:
        return literal
    for m in info.metadata:
        if isinstance(m, _Choices):
            return m.choices
    return None


def _literal_values(tp: Any) -> tuple | None:
    tp, _ = _unwrap_optional(_strip_annotated(tp))
    if typing.get_origin(tp) is list:
        tp = _strip_annotated(typing.get_args(tp)[0])
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


class Section(BaseModel):
    """Base of every settings model: frozen, unknown keys refused, camelCase keys."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        populate_by_name=True,
        alias_generator=to_camel,
        coerce_numbers_to_str=True,  # an unquoted YAML number such as `version: 1.34`
    )

    def problems(self, path: str) -> Iterator[ConfigError]:
        """Rules across this model's fields (run only when every field parsed)."""
        return iter(())


# --- validation: every problem at once -------------------------------------------------------


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _strip_annotated(tp: Any) -> Any:
    while typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _model_type(tp: Any) -> type[Section] | None:
    tp, _ = _unwrap_optional(_strip_annotated(tp))
    return tp if isinstance(tp, type) and issubclass(tp, Section) else None


def _list_item_model(tp: Any) -> type[Section] | None:
    tp, _ = _unwrap_optional(_strip_annotated(tp))
    if typing.get_origin(tp) is list:
        return _model_type(typing.get_args(tp)[0])
    return None


def _map_item_model(cls: Any) -> type[Section] | None:
    """The value model of a map section (a ``RootModel[dict[str, <Section>]]`` such as ``tenants``)."""
    if isinstance(cls, type) and issubclass(cls, RootModel):
        tp = _strip_annotated(cls.model_fields["root"].annotation)
        if typing.get_origin(tp) is dict:
            return _model_type(typing.get_args(tp)[1])
    return None


def keys_of(cls: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in cls.model_fields.items()]


def _field_by_key(cls: type[BaseModel], key: str) -> tuple[str, Any] | None:
    for name, f in cls.model_fields.items():
        if key in (f.alias, name):
            return name, f
    return None


def _model_at(cls: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that holds the value at ``loc`` (a pydantic error location)."""
    current: Any = cls
    for part in loc:
        if isinstance(part, int):
            continue
        if (item := _map_item_model(current)) is not None:  # a map's key (a team name): its value's model
            current = item
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        found = _field_by_key(current, str(part))
        if found is None:
            return None
        ann = found[1].annotation
        current = _model_type(ann) or _list_item_model(ann) or ann
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _key(path: str, loc: Iterable[Any]) -> str:
    key = path
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key


_TYPE_TEXT = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "string_type": "expected a string",
    "bool_type": "expected a boolean (true/false)",
    "bool_parsing": "expected a boolean (true/false)",
    "list_type": "expected a list",
    "dict_type": "expected an object (a map of keys to values)",
}


def _bounds(cls: type[BaseModel], loc: tuple) -> tuple[int | None, int | None]:
    """The field's own bounds (Field ge/le), without the int64 range every Int has."""
    names = [p for p in loc if isinstance(p, str)]
    model = _model_at(cls, tuple(names[:-1])) if names else None
    info = model.model_fields.get(_field_name(model, names[-1])) if model is not None and names else None
    lo = hi = None
    for m in info.metadata if info is not None else ():
        if isinstance(m, annotated_types.Ge) and m.ge != INT64[0]:
            lo = m.ge
        if isinstance(m, annotated_types.Le) and m.le != INT64[1]:
            hi = m.le
    return cast(int | None, lo), cast(int | None, hi)


def _field_name(model: type[BaseModel], alias: str) -> str:
    return next((n for n, f in model.model_fields.items() if f.alias == alias or n == alias), alias)


def _from_pydantic(cls: type[BaseModel], path: str, err: Any) -> ConfigError:
    loc = tuple(err["loc"])
    key, value, kind = _key(path, loc), err.get("input"), err["type"]
    ctx = err.get("ctx") or {}
    if kind == "config":
        return ConfigError(key + ctx.get("suffix", ""), ctx.get("value", value), ctx["allowed"])
    if kind == "extra_forbidden":
        parent = _model_at(cls, loc[:-1])
        # a misspelt key's value is not judged, so it is not shown unless it is a plain number or boolean
        shown = value if isinstance(value, bool | int | float) or value is None else UNSHOWN
        return ConfigError(key, shown, unknown_key_hint(str(loc[-1]), keys_of(parent) if parent else []))
    if kind in ("model_type", "model_attributes_type"):
        model = _model_at(cls, loc)
        allowed = "expected an object with keys " + ", ".join(keys_of(model)) if model else "expected an object"
        return ConfigError(key, value, allowed)
    if kind == "literal_error":
        names = [p for p in loc if isinstance(p, str)]
        model = _model_at(cls, tuple(names[:-1])) if names else None
        allowed_values = choices_of(model, _field_name(model, names[-1])) if model is not None and names else None
        if allowed_values:
            close = difflib.get_close_matches(str(value), [str(c) for c in allowed_values], n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            return ConfigError(key, value, hint + "allowed: " + ", ".join(map(str, allowed_values)))
    if kind in ("less_than_equal", "greater_than_equal"):
        lo, hi = _bounds(cls, loc)
        if kind == "less_than_equal" and hi is None:
            return ConfigError(key, value, f"allowed: at most {INT64[1]} (a 64-bit integer, as the Kubernetes API holds)")
        if kind == "greater_than_equal" and lo is None:
            return ConfigError(key, value, f"allowed: at least {INT64[0]} (a 64-bit integer, as the Kubernetes API holds)")
        return ConfigError(key, value, f"allowed: an integer from {lo} to {hi}" if hi is not None else f"allowed: an integer >= {lo}")
    allowed = _TYPE_TEXT.get(kind, str(err["msg"]))
    if value is None:
        allowed += ", not null"
    return ConfigError(key, value, allowed)


def _errors_of(cls: type[BaseModel], path: str, err: Any) -> list[ConfigError]:
    """The lines of one pydantic error: one, or one per bad item of a list (``_field_check``)."""
    items = (err.get("ctx") or {}).get("items") if err["type"] == "config" else None
    if items:
        key = _key(path, tuple(err["loc"]))
        return [ConfigError(key + suffix, item, why) for suffix, item, why in items]
    return [_from_pydantic(cls, path, err)]


def validate_section(cls: type[Section], raw: Any, path: str) -> tuple[Section | None, list[ConfigError]]:
    """Parse one section. Returns the model (None when a field is invalid) and every problem:
    pydantic's field errors, then the cross-field ``problems`` of each model that parsed."""
    if raw is None:
        raw = {}
    try:
        obj = cls.model_validate(raw, by_alias=True, by_name=False)  # stack files use the camelCase keys
    except ValidationError as exc:
        found = [line for e in exc.errors(include_url=False) for line in _errors_of(cls, path, e)]
        return None, found + list(_problems_of_parts(cls, raw, path))
    return obj, list(problems_of(obj, path))


def repaired_section(cls: type[Section], raw: Any) -> Section | None:
    """The section with each invalid value replaced by :class:`Failed` (parsed with the value
    left out, then marked), or None when that does not parse either. Lets the rules across
    sections run beside a section's own field errors, so one mistake does not hide the others,
    while no rule judges a default the user never gave in place of the value that failed."""
    import copy

    data = copy.deepcopy(raw) if isinstance(raw, Mapping) else {}
    failed: list[tuple[str, ...]] = []
    parsed: dict[tuple[str, ...], list[tuple[int, Any]]] = {}  # a list of values with bad items: the items that passed
    for _ in range(20):
        try:
            obj = cls.model_validate(data, by_alias=True, by_name=False)
        except ValidationError as exc:
            removed = False
            for err in exc.errors(include_url=False):
                loc = [p for p in err["loc"] if not isinstance(p, int)]  # a bad list item: drop the whole list
                node: Any = data
                for i, part in enumerate(loc):
                    if not isinstance(node, dict) or part not in node:
                        break
                    # the bad value, or the list whose item holds it (tenants.<team>.s3[0].bucket): dropped whole
                    if i == len(loc) - 1 or isinstance(node[part], list):
                        parts = tuple(str(p) for p in loc[: i + 1])
                        bad = _bad_items(err) if i == len(loc) - 1 else None
                        if bad is not None and isinstance(node[part], list):
                            parsed[parts] = [(n, v) for n, v in enumerate(node[part]) if n not in bad]
                        del node[part]
                        failed.append(parts)
                        removed = True
                        break
                    node = node[part]
            if not removed:
                return None
            continue
        for parts in failed:
            obj = mark_failed(obj, parts, ".".join(parts), parsed.get(parts))
        return obj
    return None


def _bad_items(err: Any) -> set[int] | None:
    """The indexes of the bad items of a list a field check refused item by item (``_field_check``),
    None when the error is not one of those."""
    items = (err.get("ctx") or {}).get("items") if err["type"] == "config" else None
    if not items or not all(re.fullmatch(r"\[\d+\]", suffix) for suffix, _, _ in items):
        return None
    return {int(suffix[1:-1]) for suffix, _, _ in items}


def _problems_of_parts(cls: type[Section], raw: Any, path: str) -> Iterator[ConfigError]:
    """When ``raw`` does not parse as a whole: the cross-field rules of the nested objects (and
    list items) that parse on their own. Their field errors are already reported by the whole."""
    if not isinstance(raw, Mapping):
        return
    for key, value in raw.items():
        field = _field_by_key(cls, str(key))
        if field is None:
            continue
        parts: list[tuple[str, Any]] = []
        sub = _model_type(field[1].annotation)
        if sub is not None:
            parts = [(f"{path}.{key}", value)]
        else:
            sub = _list_item_model(field[1].annotation)
            if sub is not None and isinstance(value, list):
                parts = [(f"{path}.{key}[{i}]", item) for i, item in enumerate(value)]
        for part_path, part in parts:
            assert sub is not None
            try:
                obj = sub.model_validate({} if part is None else part, by_alias=True, by_name=False)
            except ValidationError:
                yield from _problems_of_parts(sub, part, part_path)
                continue
            yield from problems_of(obj, part_path)


def problems_of(obj: Section, path: str) -> Iterator[ConfigError]:
    """``obj.problems`` and those of every model nested in it, depth first, children first. A
    model's rules stop where they read a value that failed its own check (:class:`Failed`)."""
    if isinstance(obj, Failed):
        return
    for name, f in type(obj).model_fields.items():
        value = getattr(obj, name)
        key = f"{path}.{f.alias or name}"
        if isinstance(value, Section):
            yield from problems_of(value, key)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, Section):
                    yield from problems_of(item, f"{key}[{i}]")
    yield from known(obj.problems(path))


def to_raw(obj: Any) -> Any:
    """Settings object back to camelCase config (the inverse of parsing)."""
    if isinstance(obj, BaseModel):
        return obj.model_dump(by_alias=True, mode="json")
    if isinstance(obj, list):
        return [to_raw(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_raw(v) for k, v in obj.items()}
    return obj
