"""``trainctl ui``: the teams' portal (trainctl/portal) on this machine, at http://127.0.0.1:PORT,
calling the API server with the kubeconfig's identity, its impersonation fields (``as``,
``as-groups``, ``as-uid``, ``as-user-extra``) included. Only this machine can reach it (loopback),
and it answers only requests whose Host is that address (a web page elsewhere cannot point a
name of its own at it), with CSRF tokens on its forms.

``trainctl ui --local``: the same pages and API over the jobs of trainctl's local mode (``trainctl
submit --local``: the emulator runs them on this machine's CPU); no kubeconfig is read and no
Kubernetes is called (trainctl/portal/local_service.py)."""

from __future__ import annotations

import argparse
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from trainctl.kube import ClusterError, default_namespace, kube_context, kubeconfig_path

DEFAULT_PORT = 8765


def kubeconfig_user(kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    """The ``user`` entry of the context (the first file of a ``KUBECONFIG`` list that has it)."""
    name = (kube_context(kubeconfig, context).get("context") or {}).get("user")
    for path in kubeconfig_path(kubeconfig).split(":"):
        try:
            with open(path) as f:
                doc = yaml.safe_load(f) or {}
        except OSError:
            continue
        for u in doc.get("users") or []:
            if u.get("name") == name:
                return dict(u.get("user") or {}) | {"_name": name}
    return {"_name": name}


def build(kubeconfig: str | None, context: str | None, namespace: str | None, port: int):
    """(the app, its URL)."""
    from trainctl.portal.app import Settings, create_app
    from trainctl.portal.identity import Caller, kubeconfig_headers

    base = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig_path(kubeconfig), context=context, client_configuration=base, persist_config=False)
    except (ConfigException, OSError) as err:
        raise ClusterError(f"no usable kubeconfig ({err}); pass --kubeconfig or set KUBECONFIG") from None
    user = kubeconfig_user(kubeconfig, context)
    headers = kubeconfig_headers(user)
    ns = namespace or default_namespace(kubeconfig, context)
    caller = Caller(name=headers.get("Impersonate-User", [f"kubeconfig user {user.get('_name')}"])[0], namespace=ns, headers=headers, via="kubeconfig")
    hosts = (f"127.0.0.1:{port}", f"localhost:{port}")
    return create_app(base, Settings(mode="local", local_caller=caller, allowed_hosts=hosts)), f"http://127.0.0.1:{port}/"


def build_local(port: int):
    """(the app over this machine's local jobs, its URL): no kubeconfig, no cluster."""
    from trainctl.portal.app import Settings, create_app
    from trainctl.portal.local_service import LocalPortal, caller

    hosts = (f"127.0.0.1:{port}", f"localhost:{port}")
    return create_app(None, Settings(mode="local", local_caller=caller(), allowed_hosts=hosts), backend=LocalPortal()), f"http://127.0.0.1:{port}/"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("ui", help="serve the teams' portal on 127.0.0.1 with the kubeconfig's identity")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    p.add_argument("--local", action="store_true", help="the jobs trainctl runs on this machine (submit --local), no cluster: submit, follow, cancel them in the browser")


def run(args: argparse.Namespace) -> int:
    import uvicorn

    problems = [] if 1 <= args.port <= 65535 else [f"--port {args.port}: allowed: 1 to 65535"]
    if args.local:  # every problem at once
        problems += [f"{flag}: not with --local (local jobs need no cluster)" for flag, value in (("--kubeconfig", args.kubeconfig), ("--context", args.context), ("--namespace", args.namespace)) if value]
    if problems:
        raise ValueError("\n".join(problems))
    if args.local:
        app, url = build_local(args.port)
    else:
        app, url = build(args.kubeconfig, args.context, args.namespace, args.port)
    print(f"trainctl ui: serving the portal at {url}{' for the jobs of this machine (local mode)' if args.local else ''} (Ctrl-C stops it)", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
    return 0
