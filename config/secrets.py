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
        return bool(_SECRET_VALUE.search(value)) or secret_shape(value, key.rsplit(".", 1)[-1]) is not None  # one rule with a job's values
    if isinstance(value, dict):
        return any(looks_secret(str(k), v) for k, v in value.items())
    if isinstance(value, list | tuple):
        # a flag named like a credential makes the value after it one (["--wandb-key", "..."])
        return any(looks_secret(key, v) for v in value) or any(isinstance(v, str) and v.startswith("-") and bool(_SECRET_KEY.search(v.lstrip("-"))) for v in value)
    return False


def shown(value: Any, key: str = "") -> str:
    """``value`` as an error line may echo it: its repr, or :data:`REDACTED` when it may be a
    credential (:func:`looks_secret`). trainctl and the portal echo every value through it."""
    return REDACTED if looks_secret(key, value) else repr(value)


def unshown_in(text: str, value: Any, key: str = "") -> str:
    """``text`` (an explanation that may quote ``value``) with ``value`` masked when it may be a credential."""
    if looks_secret(key, value):
        for part in sorted(strings_in(value), key=len, reverse=True):
            text = text.replace(part, REDACTED) if len(part) > 2 else text
    return text


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
    "creds", "cred", "auth", "authorization", "bearer",
})
# ...and a single word ending in one of these (a vendor's prefix glued on: PGPASSWORD (libpq), HFTOKEN,
# MYSQL_PWD's kin REDISPASSWORD); short words (key, pass, pw) only as whole words (MONKEY, BYPASS, COMPASS are not)
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "token", "secret", "apikey", "accesskey", "secretkey", "privatekey", "credentials", "credential", "auth")
# ...unless its last word says the value only points at one: HF_TOKEN_FILE, SECRET_NAME, KEY_PREFIX, TOKEN_URL
REFERENCE_WORDS = frozenset({"file", "path", "dir", "name", "id", "prefix", "field", "len", "length", "size", "type", "url", "uri", "endpoint", "header", "env", "var", "ref", "arn", "region"})
# a last word saying the value is an identifier: a 32-hex-digit value is a uuid4().hex (WANDB_RUN_ID, TRACE_ID)
ID_WORDS = frozenset({"id", "uuid", "run"})
# a value that switches something on or off is no credential (HF_HUB_DISABLE_IMPLICIT_TOKEN=1)
_SWITCH = re.compile(r"^(|0|1|true|false|yes|no|on|off|none|null)$", re.IGNORECASE)
# a reference to another variable, expanded by Kubernetes ($(VAR)) or a shell ($VAR, ${VAR}): no value
ENV_REFERENCE = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|\([A-Za-z_][A-Za-z0-9_]*\)|[A-Za-z_][A-Za-z0-9_]*)$")
_WORD_SPLIT = re.compile(r"[-_.\s]+|(?<=[a-z0-9])(?=[A-Z])")
# Known token prefixes: GitLab (glpat-), PyPI (pypi-), npm (npm_), Google API keys (AIza), Stripe's secret and
# restricted keys, Slack app tokens (xapp-), JSON Web Tokens (two base64url parts starting {" = eyJ)
_PREFIXED = re.compile(
    r"\b(glpat-[A-Za-z0-9_-]{20,}|pypi-[A-Za-z0-9_-]{16,}|npm_[A-Za-z0-9]{30,}|AIza[0-9A-Za-z_-]{30,}|[sr]k_(live|test)_[0-9A-Za-z]{16,}|xapp-[A-Za-z0-9-]{10,}"
    r"|sk-(proj-|ant-)?[A-Za-z0-9_-]{20,}|eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.|dapi[0-9a-f]{32})"
    # Slack's incoming webhooks carry their secret in the path; an HTTP Authorization value
    r"|hooks\.slack\.com/(services|workflows|triggers)/[A-Za-z0-9_/-]{8,}|\b(?i:bearer)\s+[A-Za-z0-9_\-.~+/=:]{8,}|\bBasic\s+[A-Za-z0-9+/]{12,}={0,2}(?!\S)"
)
# 32 or more hex digits (an MD5-sized key and up: W&B's 40, a 64-digit secret) unless a digest says what it is
_LONG_HEX = re.compile(r"(?<![0-9A-Za-z])(?<!sha1:)(?<!sha256:)(?<!sha512:)(?<!md5:)[0-9a-fA-F]{32,}(?![0-9A-Za-z])")
DIGEST_WORDS = frozenset({"sha", "sha1", "sha256", "sha512", "md5", "hash", "digest", "checksum", "commit", "revision", "rev", "etag", "oid"})
_HEX_RUN = re.compile(r"[0-9a-fA-F]{32,}")
_UUID_HEX = re.compile(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")  # uuid4().hex, str(uuid4())
_RUN = re.compile(r"[A-Za-z0-9+/_=-]{24,}")  # base64 and base64url characters


def words(name: str) -> list[str]:
    return [w.lower() for w in _WORD_SPLIT.split(name) if w]


def name_says_secret(name: str) -> bool:
    """A variable or key named like a credential (see :data:`SECRET_WORDS`); ``PWD`` alone is the
    shell's working directory."""
    found = words(name)
    if not found or name in ("PWD", "OLDPWD") or found[-1] in REFERENCE_WORDS:
        return False
    return any(w in SECRET_WORDS or w.endswith(SECRET_SUFFIXES) for w in found)


# A named credential's value must itself be one (the rule of :func:`named_secret_value`): at least
# NAMED_MIN_CHARS characters, and not a plain word (letters of one case, at most PLAIN_WORD_MAX of them: timestamp,
# id, final, FINAL, Final; a longer run of letters, xxxxxxxxxxxx or hunterhunter, counts as a credential), a number
# (2048, 0.5, -1), an absolute path (/var/run/secrets/x: where a mounted secret is), or, for a name whose
# last word is TOKEN, a tokenizer's token (<pad>, </s>, <|endoftext|>, [MASK]). So SORT_KEY=timestamp,
# PRIMARY_KEY=id, TOKEN_LIMIT=2048, EVAL_PASS=final, SECRET_MOUNT=/var/run/secrets/x, PAD_TOKEN=<pad> pass;
# DB_PASS=hunter2hunter2, DB_PWD=x1y2z3, MY_SECRET=s3cr3t, API_KEY_2=abc-def-ghi do not. The cost: a
# password that is one plain word, or shorter than NAMED_MIN_CHARS, passes by its name (its shape still counts).
NAMED_MIN_CHARS = 6
PLAIN_WORD_MAX = 10
_PLAIN_WORD = re.compile(rf"(?=.{{1,{PLAIN_WORD_MAX}}}$)([a-z]+|[A-Z]+|[A-Z][a-z]+)")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_ABS_PATH = re.compile(r"/[A-Za-z0-9_./-]*")
_TOKENIZER_TOKEN = re.compile(r"<\|?/?[A-Za-z0-9_.-]{1,20}\|?>|\[[A-Za-z0-9_.-]{1,20}\]")


def named_secret_value(name: str, value: str) -> bool:
    """``value`` is what a credential-named ``name`` holds: not empty, a switch or a reference, and
    shaped like a credential by the rule above."""
    value = value.strip()
    if not name_says_secret(name) or _SWITCH.fullmatch(value) or ENV_REFERENCE.fullmatch(value):
        return False
    if len(value) < NAMED_MIN_CHARS or _PLAIN_WORD.fullmatch(value) or _NUMBER.fullmatch(value) or _ABS_PATH.fullmatch(value):
        return False
    return not (words(name)[-1] == "token" and _TOKENIZER_TOKEN.fullmatch(value))


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
    named = words(name)
    digest = bool(DIGEST_WORDS & set(named))  # GIT_COMMIT, MODEL_SHA256: its hex is what the name says
    if _SECRET_VALUE.search(_HEX_RUN.sub("", value) if digest else value) or _PREFIXED.search(value):
        return "it has the shape of a token, key or password (a known token format, a private key, or a URL with a password or a token parameter)"
    # a random key of 32 hex digits and more uses most of the 16 (a run like 'a' * 64, a bucket or job name, is none)
    long_hex = any(len(set(m.group().lower())) >= 8 for m in _LONG_HEX.finditer(value))
    if long_hex and not digest and not (named and named[-1] in ID_WORDS and _UUID_HEX.fullmatch(value)):
        return "it holds a long hex string (32 or more hex digits), the shape of an API key"
    if any(_high_entropy(m.group()) for m in _RUN.finditer(value)):
        return "it holds a random-looking base64 string, the shape of a token"
    return None
