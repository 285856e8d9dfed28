"""What may be a secret in stack config, so that no error line prints it back."""

from __future__ import annotations

import math
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


# --- a job's values: a credential by its name, or by its shape ------------------------------------------

# A name says its value is a credential when one of its words (split at '_', '-', '.' and lower-to-upper
# case changes) is one of these: DB_PASS, API_KEY, HF_TOKEN_2, wandbApiKey. Whole words only: MAX_TOKENS,
# TOKENIZERS_PARALLELISM, MONKEY are not.
SECRET_WORDS = frozenset({
    "pass", "passwd", "password", "passphrase", "pwd", "pw", "secret", "token", "key", "apikey", "accesskey", "secretkey", "privatekey", "credential", "credentials",
    "creds", "cred",
})
# ...unless its last word says the value only points at one: HF_TOKEN_FILE, SECRET_NAME, KEY_PREFIX, TOKEN_URL
REFERENCE_WORDS = frozenset({"file", "path", "dir", "name", "id", "prefix", "field", "len", "length", "size", "type", "url", "uri", "endpoint", "header", "env", "var", "ref", "arn", "region"})
# a value that switches something on or off is no credential (HF_HUB_DISABLE_IMPLICIT_TOKEN=1)
_SWITCH = re.compile(r"^(|0|1|true|false|yes|no|on|off|none|null)$", re.IGNORECASE)
# a reference to another variable, expanded by Kubernetes ($(VAR)) or a shell ($VAR, ${VAR}): no value
ENV_REFERENCE = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|\([A-Za-z_][A-Za-z0-9_]*\)|[A-Za-z_][A-Za-z0-9_]*)$")
_WORD_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")
# Known token prefixes: GitLab (glpat-), PyPI (pypi-), npm (npm_), Google API keys (AIza), Stripe's secret and
# restricted keys, Slack app tokens (xapp-), JSON Web Tokens (two base64url parts starting {" = eyJ)
_PREFIXED = re.compile(
    r"\b(glpat-[A-Za-z0-9_-]{20,}|pypi-[A-Za-z0-9_-]{16,}|npm_[A-Za-z0-9]{30,}|AIza[0-9A-Za-z_-]{30,}|[sr]k_(live|test)_[0-9A-Za-z]{16,}|xapp-[A-Za-z0-9-]{10,}"
    r"|sk-(proj-|ant-)?[A-Za-z0-9_-]{20,}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.)"
)
# 32 or more hex digits (an MD5-sized key and up: W&B's 40, a 64-digit secret) unless a digest says what it is
_LONG_HEX = re.compile(r"(?<![0-9A-Za-z])(?<!sha1:)(?<!sha256:)(?<!sha512:)(?<!md5:)[0-9a-fA-F]{32,}(?![0-9A-Za-z])")
DIGEST_WORDS = frozenset({"sha", "sha1", "sha256", "sha512", "md5", "hash", "digest", "checksum", "commit", "revision", "rev", "etag", "oid"})
_HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")
_RUN = re.compile(r"[A-Za-z0-9+/_=-]{24,}")  # base64 and base64url characters


def words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


def name_says_secret(name: str) -> bool:
    """A variable or key named like a credential (see :data:`SECRET_WORDS`); ``PWD`` alone is the
    shell's working directory."""
    found = words(name)
    if not found or name in ("PWD", "OLDPWD") or found[-1] in REFERENCE_WORDS:
        return False
    return any(w in SECRET_WORDS for w in found)


def named_secret_value(name: str, value: str) -> bool:
    """``value`` is what a credential-named ``name`` holds: not empty, a switch or a reference."""
    return name_says_secret(name) and not _SWITCH.fullmatch(value.strip()) and not ENV_REFERENCE.fullmatch(value.strip())


def _high_entropy(run: str) -> bool:
    """A random-looking token of base64 characters: letters of both cases (or 32 and more
    characters) and digits, the character class changing at almost every other character and about
    4 bits or more per character (words, paths and model names change class seldom)."""
    chars = [c for c in run if c.isalnum()]
    if len(chars) < 20:
        return False
    kinds = ["u" if c.isupper() else "l" if c.islower() else "d" for c in chars]
    if "d" not in kinds or "l" not in kinds or ("u" not in kinds and len(chars) < 32):
        return False
    changes = sum(a != b for a, b in zip(kinds, kinds[1:], strict=False)) / (len(kinds) - 1)
    counts = {c: chars.count(c) for c in set(chars)}
    entropy = -sum(n / len(chars) * math.log2(n / len(chars)) for n in counts.values())
    return changes >= 0.45 and entropy >= 3.8


def secret_shape(value: str, name: str = "") -> str | None:
    """What makes ``value`` look like a credential, or None: a known token's shape, a URL with a
    password or a token parameter, a long hex string (not when ``name`` says it is a digest), a
    random-looking base64 token. The reason never holds the value."""
    digest = bool(DIGEST_WORDS & set(words(name)))  # GIT_COMMIT, MODEL_SHA256: its hex is what the name says
    if _SECRET_VALUE.search(_HEX_RUN.sub("", value) if digest else value) or _PREFIXED.search(value):
        return "it has the shape of a token, key or password (a known token format, a private key, or a URL with a password or a token parameter)"
    if _LONG_HEX.search(value) and not digest:
        return "it holds a long hex string (32 or more hex digits), the shape of an API key"
    if any(_high_entropy(m.group()) for m in _RUN.finditer(value)):
        return "it holds a random-looking base64 string, the shape of a token"
    return None
