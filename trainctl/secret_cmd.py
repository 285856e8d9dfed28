"""``trainctl secret set NAME KEY=VALUE|KEY=@FILE|KEY=@- ...`` and ``trainctl secret delete NAME``:
a Secret of the team's namespace that a job reads with ``--secret-env VAR=NAME/KEY`` (a
``secretKeyRef``), written without ever being read back.

A team's Role lets its members create, update and delete Secrets but not get, list, watch or
patch them (k8s/builders/tenants.py TEAM_RULES), so a Secret cannot be read back through the API.
``set`` creates the Secret and, when one of that name exists, replaces it whole with a PUT: the
API server authorizes a PUT as the verb ``update`` alone (k8s.io/apiserver v0.34
``pkg/endpoints/request/requestinfo.go``: ``MethodPut`` -> ``update``) and allows an update without
a resourceVersion for Secrets (kubernetes v1.34 ``pkg/registry/core/secret/strategy.go``
``AllowUnconditionalUpdate``: true), so no read comes first. The replaced Secret keeps none of the
old keys. Nothing prints a value: the output names the Secret and its keys.

Values: ``KEY=VALUE`` (visible in the shell's history and the process list while trainctl runs),
``KEY=@FILE`` (a file's bytes), ``KEY=@-`` (standard input, once).
"""

from __future__ import annotations

import argparse
import base64
import os
import pathlib
import stat
import sys
from collections.abc import Callable
from typing import Any

from kubernetes.client.exceptions import ApiException

from config.job_env import NAME_MAX, SECRET_NAME_RE, secret_key_problem, shown_name
from config.secrets import secret_shape
from trainctl.kube import ClusterError, KubeApi, api_message, default_namespace, not_allowed

# the API server's limit on a Secret's data (kubernetes v1.34 pkg/apis/core/types.go MaxSecretSize, 1 MiB)
MAX_SECRET_BYTES = 1024 * 1024
MANAGER = "trainctl"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"  # Kubernetes recommended labels


class SecretInputError(ValueError):
    """Bad input for ``trainctl secret``: a line per problem; nothing was written."""


def add_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("secret", help="create, replace or delete a Secret of the namespace for --secret-env (values are never read back)")
    verbs = p.add_subparsers(dest="secret_cmd", required=True, parser_class=type(p))
    s = verbs.add_parser("set", help="create the Secret, or replace it whole (no key of the old one is kept)", usage="trainctl secret set [options] NAME KEY=VALUE|KEY=@FILE|KEY=@- [...]")
    common(s)
    s.add_argument("name", metavar="NAME")
    s.add_argument("items", nargs="+", metavar="KEY=VALUE|KEY=@FILE|KEY=@-", help="a key and its value, the bytes of FILE, or standard input (-)")
    d = verbs.add_parser("delete", help="delete the Secret")
    common(d)
    d.add_argument("name", metavar="NAME")


def data_of(items: list[str], *, stdin: Any = None) -> dict[str, bytes]:
    """The Secret's data from ``KEY=VALUE``, ``KEY=@FILE`` and ``KEY=@-``; :class:`SecretInputError`
    with a line per problem (never a value). A file's size is judged before it is read (its
    ``stat``), and no file or standard input is read past what a Secret holds: at most the bytes
    left of :data:`MAX_SECRET_BYTES`, plus one to tell that there was more."""
    data: dict[str, bytes] = {}
    lines: list[str] = []
    from_stdin = None
    for i, item in enumerate(items):
        key, sep, value = item.partition("=")
        if not sep or not key:
            lines.append(f"argument {i + 1}: allowed: KEY=VALUE, KEY=@FILE or KEY=@-")
            continue
        if (why := secret_key_problem(key)) is not None:
            lines.append(f"key {shown_name(key)!r}: {why}")
            continue
        if key in data:
            lines.append(f"key {shown_name(key)}: given twice; allowed: each key once")
            continue
        if value == "@-":
            if from_stdin is not None:
                lines.append(f"key {key}: standard input (@-) is read once; allowed: one key from it")
                continue
            from_stdin = key
            data[key] = b""  # read last, once everything else is right
        elif value.startswith("@"):
            got = _read_file(key, value[1:], MAX_SECRET_BYTES - sum(len(v) for v in data.values()))
            if isinstance(got, str):
                lines.append(got)
            else:
                data[key] = got
        else:
            data[key] = value.encode()
    left = MAX_SECRET_BYTES - sum(len(v) for v in data.values())
    if from_stdin is not None and not lines and left >= 0:
        data[from_stdin] = (stdin or sys.stdin.buffer).read(left + 1)
    if sum(len(v) for v in data.values()) > MAX_SECRET_BYTES:
        lines.append(f"the values add up to more than {MAX_SECRET_BYTES} bytes, a Secret's limit")
    if lines:
        raise SecretInputError("\n".join(lines))
    return data


def _read_file(key: str, name: str, left: int) -> bytes | str:
    """The bytes of file ``name`` (``~`` expanded), or the line saying why not: its size from
    ``stat`` first (a 3 GB file is refused unread), then at most ``left + 1`` bytes (a pipe or a
    device has no size to judge beforehand)."""
    path = pathlib.Path(name).expanduser()
    shown = name if secret_shape(name) is None else "(a path shaped like a secret, not shown)"
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if stat.S_ISDIR(st.st_mode):
                return f"key {key}: {shown!r} is a directory; allowed: a file"
            if stat.S_ISREG(st.st_mode) and st.st_size > left:
                return f"key {key}: {shown!r} holds {st.st_size} bytes, more than the {max(left, 0)} bytes left of a Secret's {MAX_SECRET_BYTES}"
            raw = fh.read(max(left, 0) + 1)
    except OSError as err:
        return f"key {key}: cannot read {shown!r} ({err.strerror or err})"
    if len(raw) > left:
        return f"key {key}: {shown!r} holds more than the {max(left, 0)} bytes left of a Secret's {MAX_SECRET_BYTES}"
    return raw


def name_problem(name: str) -> str | None:
    if "=" in name or secret_shape(name) is not None:  # KEY=VALUE first (the arguments swapped), or a pasted value: never shown
        return "secret name (the argument after set) is not shown: it looks like KEY=VALUE or a value; allowed: trainctl secret set NAME KEY=VALUE|KEY=@FILE|KEY=@- (the name first)"
    if SECRET_NAME_RE.fullmatch(name) and len(name) <= NAME_MAX:
        return None
    return f"secret name {name[:NAME_MAX + 1]!r}: allowed: a DNS subdomain (lowercase letters, digits, '-', '.'), at most {NAME_MAX} characters, such as wandb"


def secret(name: str, namespace: str, data: dict[str, bytes]) -> dict:
    """The Secret (``Opaque``: the team admission policy refuses service-account token Secrets)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGER}},
        "data": {k: base64.b64encode(v).decode("ascii") for k, v in sorted(data.items())},
    }


def put(cluster: KubeApi, body: dict) -> str:
    """Create the Secret, or replace the one of that name (PUT): ``created`` or ``replaced``. The
    responses (which carry the values sent) are never decoded."""
    name, ns = body["metadata"]["name"], cluster.namespace
    try:
        cluster.core.create_namespaced_secret(ns, body, _preload_content=False)
        return "created"
    except ApiException as err:
        if err.status != 409:
            raise _refused(err, "create", name, ns) from None
    try:
        cluster.core.replace_namespaced_secret(name, ns, body, _preload_content=False)
        return "replaced"
    except ApiException as err:
        raise _refused(err, "update", name, ns) from None


def delete(cluster: KubeApi, name: str) -> bool:
    try:
        # a plain delete (Background, no dryRun): the team Secret policy refuses the deletes that would answer with the
        # Secret's data (k8s/builders/admission.py SECRET_DELETE_CHECK)
        cluster.core.delete_namespaced_secret(name, cluster.namespace, propagation_policy="Background", _preload_content=False)
        return True
    except ApiException as err:
        if err.status == 404:
            return False
        raise _refused(err, "delete", name, cluster.namespace) from None


def _refused(err: ApiException, verb: str, name: str, ns: str) -> ClusterError:
    denied = not_allowed(err, verb, "secrets", ns)
    if denied is not None:
        return denied
    return ClusterError(f"{verb} secret/{name}: {' '.join(api_message(err).split())[:300]}")


def run(args: argparse.Namespace) -> int:
    problems = [p for p in [name_problem(args.name)] if p]
    data: dict[str, bytes] = {}
    if args.secret_cmd == "set":
        try:
            data = data_of(args.items)
        except SecretInputError as err:
            problems += str(err).splitlines()
    if problems:
        raise SecretInputError("\n".join(problems))
    ns = args.namespace or default_namespace(args.kubeconfig, args.context)
    cluster = KubeApi(namespace=ns, kubeconfig=args.kubeconfig, context=args.context)
    if args.secret_cmd == "delete":
        found = delete(cluster, args.name)
        result: dict[str, Any] = {"secret": args.name, "namespace": ns, "deleted": found}
        line = f"secret/{args.name} {'deleted' if found else 'not found'} in {ns}"
    else:
        done = put(cluster, secret(args.name, ns, data))
        result = {"secret": args.name, "namespace": ns, "keys": sorted(data), "result": done}
        line = f"secret/{args.name} {done} in {ns} with keys {', '.join(sorted(data))} (use: trainctl submit --secret-env VAR={args.name}/KEY)"
    if args.output == "table":
        print(line)
    else:
        from trainctl.reports import emit

        emit(result, args.output)
    return 0
