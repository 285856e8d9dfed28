"""Policy pack entry point for `pulumi preview --policy-pack policy`.

Every rule in ``rules.py`` becomes a mandatory stack validation. Pack config:
``allowPublicEndpointAnywhere`` (boolean, default false).
"""

import os
import sys

from pulumi_policy import EnforcementLevel, PolicyPack, StackValidationPolicy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]  # rules.py, and the repository's config/cidrs.py (standard library only)
from rules import RULES, Resource  # noqa: E402


def _resources(args) -> list[Resource]:
    out = []
    for r in args.resources:
        deps = {k: [d.urn for d in v] for k, v in (getattr(r, "property_dependencies", None) or {}).items()}
        out.append(Resource(r.resource_type, r.name, r.urn, dict(r.props or {}), deps))
    return out


def _validation(rule):
    def validate(args, report_violation):
        config = dict(getattr(args, "get_config", lambda: {})() or {})
        for v in rule.check(_resources(args), config):
            report_violation(v.message, v.urn)

    return validate


PolicyPack(
    name="training-platform",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=[StackValidationPolicy(name=rule.name, description=rule.description, validate=_validation(rule)) for rule in RULES],
)
