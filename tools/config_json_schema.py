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


def schema() -> dict[str, Any]:
    models = _untitled(StackConfig.model_json_schema(by_alias=True, ref_template="#/$defs/{model}"))
    sections = {f"{PROJECT}:{key}": spec for key, spec in models["properties"].items()}
    # Pulumi puts a key without a namespace in the project's (``network`` is ``training-platform:network``),
    # and keeps one of the two at random when both are given: one form per key (config/stack_file.py config_key)
    bare = {key: {**spec, "description": f"{spec.get('description', key)} (the same as {PROJECT}:{key}; give one of the two)"} for key, spec in models["properties"].items()}
    one_form = {key: {"not": {"required": [f"{PROJECT}:{key}"]}} for key in models["properties"]}
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
                },
                "dependentSchemas": one_form,
                # any other provider's namespace; a training-platform key that is not a section is an error
                "patternProperties": {f"^(?!{PROJECT}:)[A-Za-z0-9][A-Za-z0-9_.-]*:.+$": {}},
                "additionalProperties": False,
            },
        },
        "required": ["config"],
        "$defs": models.get("$defs", {}),
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
