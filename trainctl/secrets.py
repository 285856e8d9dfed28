"""Secrets kept out of a job's command: a TrainJob's command and args are stored in plain text
(in the API server's storage, ``kubectl get -o yaml``, every tool that lists the job; locally in the
job's ``objects.yaml``), so an argument that looks like a credential is refused before anything is
written, and the refusal never shows it.

An argument looks like a credential when

- its value has the shape of one (``config.secrets.secret_shape``, the rule of a job's env values:
  Hugging Face, GitHub, GitLab, PyPI, Slack, OpenAI-style tokens, JWTs, AWS access key ids, PEM private
  keys, long hex strings, random-looking base64 strings, ...), or is a URL with a password
  (``https://user:password@host``);
- or a flag or variable named like one gives it a literal value: ``--hf-token X``,
  ``--api-key=X``, ``WANDB_API_KEY=X``. A reference to the environment (``$HF_TOKEN``,
  ``$(HF_TOKEN)``, ``${HF_TOKEN}``) is no secret, nor a short or non-token-like value
  (``--pad-token '<pad>'``).
"""

from __future__ import annotations

import re

from config.secrets import secret_shape

# a flag or variable name that says its value is a credential (its last word: ...token, ...secret, ...)
_NAME = re.compile(r"(^|[-_])(token|secret|pass|passw(or)?d|pwd|key|api[-_]?key|access[-_]?key|secret[-_]?key|private[-_]?key|auth[-_]?key|wandb[-_]?key|credentials?)$", re.IGNORECASE)
# an HTTP Authorization value anywhere in an argument (a header flag, or a shell line running curl)
_AUTH_HEADER = re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9_\-.~+/=:]{8,}", re.IGNORECASE)
_FLAG = re.compile(r"^--?([A-Za-z][A-Za-z0-9_-]*)$")
_ASSIGN = re.compile(r"^(--?)?([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_ENV_REF = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|\([A-Za-z_][A-Za-z0-9_]*\)|[A-Za-z_][A-Za-z0-9_]*)$")
_TOKENISH = re.compile(r"^[A-Za-z0-9_\-.~+/=:]{8,}$")  # what a key or token given on a command line looks like
_PASSWORD_NAME = re.compile(r"(^|[-_])(pass|passw(or)?d|pwd)$", re.IGNORECASE)  # any value of these is one (short ones too)
_URL_PASSWORD = re.compile(r"://[^/\s@:]*:[^/\s@]+@")
_GIT_SHA = re.compile(r"^[0-9a-f]{40}$")
_REVISION = re.compile(r"(revision|commit|sha|hash|ref)$", re.IGNORECASE)

HINT = (
    "a job's command is stored in plain text in the TrainJob (anyone who can read the job sees it): keep the value in a Kubernetes Secret "
    "and have your code read it from the environment or a file (for Hugging Face downloads the platform's initializers take the Secret "
    "named by trainjobs.hfTokenSecret); nothing was created"
)


def _literal(value: str, name: str) -> bool:
    """A value given as it is (not a reference to the environment) that may be the credential ``name`` says."""
    if _ENV_REF.fullmatch(value):
        return False
    return bool(value.strip()) if _PASSWORD_NAME.search(name) else bool(_TOKENISH.fullmatch(value))


def _shaped(value: str, flag: str | None) -> bool:
    if _URL_PASSWORD.search(value) or _AUTH_HEADER.search(value):
        return True
    # the one rule of a job's values (config/secrets.py secret_shape); the flag before names the value
    # (a 40-hex value after --revision/--commit is a git commit, not a key)
    if secret_shape(value, flag or "") is None:
        return False
    return not (_GIT_SHA.fullmatch(value) and flag is not None and _REVISION.search(flag))


def command_problems(command: list[str]) -> list[str]:
    """One line for each argument of ``command`` that looks like a secret, naming its position
    (and the flag it follows), never its value."""
    problems = []
    prev_flag: str | None = None
    for i, arg in enumerate(command):
        where = f"argument {i + 1} of the command"
        named = None
        if (m := _ASSIGN.fullmatch(arg)) and _NAME.search(m.group(2)) and _literal(m.group(3), m.group(2)):
            named = f"{where} ({m.group(1) or ''}{m.group(2)}=...)"
        elif prev_flag is not None and _NAME.search(prev_flag) and _literal(arg, prev_flag):
            named = f"{where} (the value of --{prev_flag})"
        elif _shaped(arg.split("=", 1)[1] if _ASSIGN.fullmatch(arg) else arg, prev_flag):
            named = f"{where}{f' (after --{prev_flag})' if prev_flag else ''}"
        if named is not None:
            problems.append(f"{named} looks like a secret (a token, key or password): {HINT}")
        flag = _FLAG.fullmatch(arg)
        prev_flag = flag.group(1) if flag else None
    return problems
