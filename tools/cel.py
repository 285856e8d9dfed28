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

import copy
import functools
import re
from typing import Any, cast

import lark
from celpy import celtypes
from celpy.celparser import CELParser
from celpy.evaluation import Activation, CELEvalError, Evaluator, NameContainer

from tools.cel_library import FUNCTIONS
from tools.cel_semantics import _MISSING, _and, _is_bool_value, _or
from tools.cel_values import _CEL_TYPES, OPTIONAL, VALIDATIONS, CELError, ObjectValue, OptionalValue, Quantity, _err, _no_overload, _type_name, _Unsupported, to_cel, to_python  # noqa: F401  (VALIDATIONS, Quantity, to_python: part of this module's interface)

__all__ = ["CELError", "Program", "apply_defaults", "compile_rule", "evaluate", "rule_problems", "to_cel"]


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
