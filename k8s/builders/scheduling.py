"""Kubernetes' rules for whether a pod may be placed on a node: taints and tolerations, nodeSelector,
and required node affinity (the scheduler's TaintToleration, NodeSelector and NodeAffinity filters;
the DaemonSet controller runs the same predicates to decide which nodes get a daemon pod).

From the API reference (core/v1) and k8s.io/component-helpers/scheduling/corev1:

* a toleration tolerates a taint when its effect is empty or equal, its key is equal or empty with
  ``operator: Exists`` (empty key and Exists: every taint), and, for ``Equal`` (the default), its
  value equals the taint's; only ``NoSchedule`` and ``NoExecute`` taints keep a pod off
  (``PreferNoSchedule`` is a preference);
* nodeSelector: every entry must be a label of the node with that value;
* ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms``: the terms are ORed, a term's
  ``matchExpressions`` ANDed; ``In`` / ``NotIn`` / ``Exists`` / ``DoesNotExist`` / ``Gt`` / ``Lt``
  (``NotIn`` and ``DoesNotExist`` hold for a node without the label); a term without expressions
  matches nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
INSTANCE_TYPE = "node.kubernetes.io/instance-type"


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    op = toleration.get("operator") or "Equal"
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if key and key != taint.get("key"):
        return False
    if not key and op != "Exists":
        return False
    return op == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated(tolerations: Sequence[Mapping[str, Any]], taints: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The node's taints that keep a pod with ``tolerations`` off it."""
    return [t for t in taints if t.get("effect") in BLOCKING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)]


def selector_misses(node_selector: Mapping[str, str], labels: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(node_selector.items()) if labels.get(k) != v]


def expression_holds(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    raise ValueError(f"unknown node selector operator {op!r}")


def required_terms(affinity: Mapping[str, Any] | None) -> list[Mapping[str, Any]] | None:
    """The required node-affinity terms; None when the pod has none (it may go anywhere)."""
    required = ((affinity or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return None
    return list(required.get("nodeSelectorTerms") or [])


def failing_expressions(term: Mapping[str, Any], labels: Mapping[str, str]) -> list[Mapping[str, Any]] | None:
    """The term's expressions the node fails; None when the term cannot match at all (no expressions)."""
    if term.get("matchFields"):
        raise ValueError("matchFields terms are not evaluated here (they select nodes by name)")
    exprs = list(term.get("matchExpressions") or [])
    if not exprs:
        return None
    return [e for e in exprs if not expression_holds(e, labels)]


def affinity_misses(affinity: Mapping[str, Any] | None, labels: Mapping[str, str]) -> list[list[Mapping[str, Any]]] | None:
    """None when the node satisfies the pod's required node affinity; else, per term, the
    expressions it fails (an empty term: an empty list)."""
    terms = required_terms(affinity)
    if terms is None:
        return None
    misses = []
    for term in terms:
        failing = failing_expressions(term, labels)
        if failing == []:
            return None
        misses.append(failing or [])
    return misses


def describe(expr: Mapping[str, Any], labels: Mapping[str, str]) -> str:
    values = list(expr.get("values") or [])
    shown = ", ".join(values[:4]) + (f", ... ({len(values)} values)" if len(values) > 4 else "")
    have = labels.get(expr["key"], "<unset>")
    return f"{expr['key']} {expr['operator']}" + (f" [{shown}]" if values else "") + f" (node: {have})"
