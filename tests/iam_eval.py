"""An evaluator of resource-based policies (key, topic, queue, file-system policies) for the
tests, implementing IAM's rules for the parts of the policy language this project writes.

Rules applied (IAM User Guide, "Policy evaluation logic" and "IAM JSON policy elements"):
* an explicit Deny that matches wins; otherwise a matching Allow is needed (default deny);
* a statement matches when its Principal, Action and Resource match and every condition holds:
  condition operators are ANDed, keys within an operator are ANDed, and the values of one key
  are ORed; a key missing from the request makes every operator false except ``Null`` (true
  for "true") and the ``...IfExists`` forms (true);
* ``"Principal": "*"`` and ``{"AWS": "*"}`` match every principal, anonymous ones included;
  an account's root ARN (``arn:<partition>:iam::<account>:root``) matches every IAM principal
  of that account (the policy delegates to the account's own IAM policies); a ``Service``
  principal matches only that service;
* Action and Resource values may use ``*`` and ``?`` wildcards; action names are
  case-insensitive.

Anything else (NotPrincipal, NotAction, NotResource, an operator not listed) raises, so a test
never silently passes on a policy the evaluator does not understand.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Request:
    """One call: who (``{"AWS": arn}``, ``{"Service": "x.amazonaws.com"}``, or ``None`` for an
    anonymous caller), what (``service:Action``), on which resource, and the request context."""

    principal: dict[str, str] | None
    action: str
    resource: str = "*"
    context: dict[str, str] = field(default_factory=dict)


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _wildcard(pattern: str, value: str, *, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    return re.fullmatch(fnmatch.translate(pattern), value) is not None


_ROOT = re.compile(r"arn:([\w-]+):iam::(\d{12}):root")


def _principal_matches(spec, who: dict[str, str] | None) -> bool:
    if spec == "*":
        return True
    if not isinstance(spec, dict):
        raise AssertionError(f"the evaluator does not know the principal {spec!r}")
    for kind, values in spec.items():
        for value in _as_list(values):
            if kind == "AWS" and value == "*":
                return True
            if who is None or kind not in who:
                continue
            if kind == "AWS":
                root = _ROOT.fullmatch(value)
                caller = who["AWS"].split(":")
                if value == who["AWS"] or (root and len(caller) > 4 and caller[1] == root.group(1) and caller[4] == root.group(2)):
                    return True
            elif kind == "Service":
                if value == who["Service"]:
                    return True
            else:
                raise AssertionError(f"the evaluator does not know the principal type {kind!r}")
    return False


def _condition_holds(op: str, key: str, wanted: list, ctx: dict[str, str]) -> bool:
    base, if_exists = (op[: -len("IfExists")], True) if op.endswith("IfExists") else (op, False)
    if base == "Null":
        return (key not in ctx) == (str(wanted[0]).lower() == "true")
    if key not in ctx:
        return if_exists
    have = ctx[key]
    if base in ("StringEquals", "ArnEquals"):
        return have in [str(w) for w in wanted]
    if base == "StringEqualsIgnoreCase":
        return have.lower() in [str(w).lower() for w in wanted]
    if base in ("StringLike", "ArnLike"):
        return any(_wildcard(str(w), have) for w in wanted)
    if base == "Bool":
        return have.lower() in [str(w).lower() for w in wanted]
    raise AssertionError(f"the evaluator does not know the {op} operator")


def matches(statement: dict, request: Request) -> bool:
    for unsupported in ("NotPrincipal", "NotAction", "NotResource"):
        if unsupported in statement:
            raise AssertionError(f"the evaluator does not know {unsupported}")
    if not _principal_matches(statement.get("Principal"), request.principal):
        return False
    if not any(_wildcard(a, request.action, case=False) for a in _as_list(statement["Action"])):
        return False
    if not any(_wildcard(r, request.resource) for r in _as_list(statement.get("Resource", "*"))):
        return False
    return all(_condition_holds(op, key, _as_list(want), request.context) for op, tests in statement.get("Condition", {}).items() for key, want in tests.items())


def allowed(policy: dict, request: Request) -> bool:
    """IAM's decision for ``request`` under the resource policy ``policy`` alone."""
    statements = _as_list(policy["Statement"])
    if any(s["Effect"] == "Deny" and matches(s, request) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and matches(s, request) for s in statements)


def identity_allowed(policy: dict, request: Request) -> bool:
    """IAM's decision for ``request`` under the identity policy ``policy`` alone (a role's own
    policy: its statements name no Principal, the role is the caller)."""
    statements = _as_list(policy["Statement"])
    for s in statements:
        if "Principal" in s:
            raise AssertionError("an identity policy names no Principal")
    return allowed({"Statement": [{**s, "Principal": "*"} for s in statements]}, request)
