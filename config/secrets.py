"""What may be a secret in stack config, so that no error line prints it back."""

from __future__ import annotations

import re
from typing import Any

# A key named like a credential, or a value shaped like one (Hugging Face, GitHub, Slack, OpenAI-style
# tokens, AWS access key ids, PEM keys), is never printed back: an error shows <redacted> instead.
# W&B API keys are 40 hex digits (wandb's own check, wandb/sdk/lib/apikey.py); a URL's user
# information (https://user:password@host) carries a password (SNS accepts such endpoints).
_SECRET_KEY = re.compile(r"(token|secret|passw(or)?d|pwd|api[-_]?key|[-_]key|credentials?|private[-_]?key|auth)$", re.IGNORECASE)  # the name ends so
_SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|sk-[A-Za-z0-9_-]{20,}|A[KS]IA[0-9A-Z]{16}|[0-9a-f]{40})\b"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----|://[^/\s@]+@|(^|[\s/])[^/\s@:]+:[^/\s@]+@(?!sha256:)"
    r"|[?&;](?i:access_token|id_token|token|api[_-]?key|key|sig|signature|secret|password|x-amz-security-token|x-amz-signature|code)="
)
# Keys whose every value may hold a secret: webhook URLs carry their secret in the path (a chat's
# incoming-webhook token), so they are never printed back.
_SECRET_BEARING = re.compile(r"(^|\.)httpsEndpoints(\[\d+\])?$")
REDACTED = "<redacted>"


class _Unshown:
    """A value an error line does not print (a misspelt key's: never judged, it may be anything)."""

    def __repr__(self) -> str:
        return "<not shown>"


UNSHOWN = _Unshown()


def looks_secret(key: str, value: Any) -> bool:
    if _SECRET_BEARING.search(key):
        return True
    if _SECRET_KEY.search(key.rsplit(".", 1)[-1].rsplit(":", 1)[-1]):
        return True
    if isinstance(value, str):
        name, eq, rest = value.partition("=")  # --flag=value, NAME=value: the name says it too
        if eq and re.fullmatch(r"-{0,2}[A-Za-z_][A-Za-z0-9_.-]*", name) and rest and _SECRET_KEY.search(name.lstrip("-")):
            return True
        return bool(_SECRET_VALUE.search(value))
    if isinstance(value, dict):
        return any(looks_secret(str(k), v) for k, v in value.items())
    if isinstance(value, list | tuple):
        # a flag named like a credential makes the value after it one (["--wandb-key", "..."])
        return any(looks_secret(key, v) for v in value) or any(isinstance(v, str) and v.startswith("-") and bool(_SECRET_KEY.search(v.lstrip("-"))) for v in value)
    return False


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value, *value.split("=", 1)[1:]]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings_in(str(k)), *strings_in(v))]
    if isinstance(value, list | tuple):
        return [s for v in value for s in strings_in(v)]
    return []



OFFLINE_SECRET = "[secret]"
"""What the offline render (tools/mock_config.py) hands the program for a ``secure:`` config value,
whose ciphertext only the Pulumi CLI decrypts: a secret whose value is unknown there. Value checks
pass it by (Pulumi's preview judges the real value); the program registers it as an unknown secret
(infra/project_config.py ``config_secret``), as ``pulumi preview`` shows a value it cannot know."""


def offline_secret(value: Any) -> bool:
    return isinstance(value, str) and value == OFFLINE_SECRET
