"""The JSON Schema of a stack file (``Pulumi.<stack>.yaml``), generated from the settings models.

Editors that speak the YAML language server read it through the stack files' first line
(``# yaml-language-server: $schema=./schema/stack-config.schema.json``): completion, hover
docs and errors for every ``training-platform:*`` key as you type. The schema checks what a
schema can (types, choices, patterns, ranges, unknown keys); the rules across fields and
sections stay in ``config/settings.py`` and run on every render.

Usage: python -m tools.config_json_schema [--write | --check] [schema/stack-config.schema.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any

from config import aws_facts
from config.schema import PROJECT
from config.settings import StackConfig

DEFAULT_PATH = "schema/stack-config.schema.json"


def _untitled(node: Any) -> Any:
    """Drop pydantic's titles (the Python names, title-cased): the descriptions say more."""
    if isinstance(node, dict):
        return {k: _untitled(v) for k, v in node.items() if not (k == "title" and isinstance(v, str))}
    if isinstance(node, list):
        return [_untitled(v) for v in node]
    return node


# A value Pulumi holds encrypted (``pulumi config set --secret --path '<key>.<name>'``): the CLI takes
# one in place of any value (sdk/go/common/resource/config object.go, isSecureValue) and decrypts it
# before the program reads it, so wherever the settings take a string, a secure value is allowed too
# (a whole section made secure is refused by the render: tools/mock_config.py).
SECURE = {
    "type": "object",
    "description": "a secret, encrypted by Pulumi (pulumi config set --secret --path ...)",
    "properties": {"secure": {"type": "string"}},
    "required": ["secure"],
    "additionalProperties": False,
}


# keys whose values are data or names, not schemas of values
_NOT_SCHEMAS = ("propertyNames", "properties", "patternProperties", "$defs", "default", "examples", "enum", "const", "required")


def _secure_strings(node: Any) -> Any:
    """``node`` with every string value's schema also taking a secure value ({secure: <ciphertext>});
    not a key's (``propertyNames``): a key is never secure."""
    if isinstance(node, list):
        return [_secure_strings(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _NOT_SCHEMAS else _secure_strings(v) for k, v in node.items()}
    for k in ("properties", "patternProperties", "$defs"):
        if isinstance(node.get(k), dict):
            out[k] = {name: _secure_strings(v) for name, v in node[k].items()}
    if isinstance(out.get("anyOf"), list):  # one level: {anyOf: [{anyOf: [string, secure]}, null]} is {anyOf: [string, secure, null]}
        out["anyOf"] = [m for v in out["anyOf"] for m in (v["anyOf"] if isinstance(v, dict) and set(v) == {"anyOf"} else [v])]
    if node.get("type") == "string":
        keep = {k: out.pop(k) for k in ("default", "description") if k in out}
        return {"anyOf": [out, {"$ref": "#/$defs/SecureValue"}], **keep}
    return out


def schema() -> dict[str, Any]:
    models = _secure_strings(_untitled(StackConfig.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")))
    sections = {f"{PROJECT}:{key}": spec for key, spec in models["properties"].items()}
    # the CLI's old form of a key, <namespace>:config:<name>, is the same key (config_key)
    old_form = {f"{PROJECT}:config:{key}": {**spec, "description": f"{spec.get('description', key)} (the old form of {PROJECT}:{key}; give one of the two)"} for key, spec in models["properties"].items()}
    # Pulumi puts a key without a namespace in the project's (``network`` is ``training-platform:network``),
    # and keeps one of the two at random when both are given: one form per key (config/stack_file.py config_key)
    bare = {key: {**spec, "description": f"{spec.get('description', key)} (the same as {PROJECT}:{key}; give one of the two)"} for key, spec in models["properties"].items()}
    forms = {key: [key, f"{PROJECT}:{key}", f"{PROJECT}:config:{key}"] for key in models["properties"]}
    one_form = {form: {"not": {"anyOf": [{"required": [other]} for other in keys if other != form]}} for keys in forms.values() for form in keys}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"{PROJECT} stack file (Pulumi.<stack>.yaml)",
        "description": "Generated from config/settings.py by tools/config_json_schema.py (make schema); do not edit.",
        "type": "object",
        "properties": {
            "config": {
                "type": "object",
                "description": "Stack configuration: the project's keys (training-platform:<section>) and other namespaces (aws:, pulumi:, kubernetes:...).",
                "properties": {
                    # not required: like the AWS provider, the program falls back to AWS_REGION
                    "aws:region": {"description": "the AWS region to deploy to (any of pulumi_aws.Region; config/aws_facts.yaml adds zones and GPU offers for some); unset = $AWS_REGION", "enum": list(aws_facts.all_regions())},
                    **sections,
                    **bare,
                    **old_form,
                },
                "dependentSchemas": one_form,
                # any other provider's namespace; a training-platform key that is not a section is an error
                "patternProperties": {f"^(?!{PROJECT}:)[A-Za-z0-9][A-Za-z0-9_.-]*:.+$": {}},
                "additionalProperties": False,
            },
        },
        "required": ["config"],
        "$defs": {**models.get("$defs", {}), "SecureValue": SECURE},
    }


def render() -> str:
    return json.dumps(schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=DEFAULT_PATH)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    path = pathlib.Path(args.path)
    text = render()
    if args.write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return 0
    if args.check:
        if not path.is_file() or path.read_text() != text:
            print(f"{path}: out of date; run make schema", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
