"""The API server as the judge of Kubernetes objects, without the rest of a cluster: etcd and the
kube-apiserver of a Kubernetes minor (cached builds, as the local control plane's), the CRDs of the
pinned releases (the Trainer and its JobSet, Kueue, Karpenter's karpenter.sh and EC2NodeClass)
and whatever admission policies the caller installs. It starts in a few seconds once built.

What it judges is what a real API server judges on create and update: the served OpenAPI schema
with unknown fields refused (``fieldValidation=Strict``), the CRDs' CEL rules with the API server's
own (cel-go) semantics, defaults, transition rules (``oldSelf``) on update, and
ValidatingAdmissionPolicies. It does not run the controllers' admission webhooks (the Trainer's,
JobSet's, Kueue's): the local control plane (``make cluster-up``) does.
"""

from __future__ import annotations

import atexit
import pathlib
import shutil
import tempfile
import time

import versions
from tools.cluster import apply as cluster_apply
from tools.cluster import build, components, pki
from tools.cluster.client import ApiError, Client
from tools.cluster.procs import Processes, free_port
from tools.cluster.up import _wait_established, start_api_server

JUDGE_MANAGER = "training-platform-judge"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
# the API server loads admission policies through an informer: a moment after they are created
POLICY_SYNC_SECONDS = 2.0


class Judge:
    """A bare API server with the stack's CRDs. ``validate`` dry-runs an object as a create (or as
    an update where it exists); ``install`` stores objects for real (namespaces, policies, an earlier
    render to update from)."""

    def __init__(self, *, kubernetes_version: str = versions.DEFAULT_KUBERNETES_VERSION, trainer_version: str = versions.DEFAULT_TRAINER_VERSION, echo=print):
        self.kubernetes_version, self.trainer_version = kubernetes_version, trainer_version
        self.echo = echo
        self.dir: pathlib.Path | None = None
        self.installed: list[dict] = []  # what install() stored, for reset()
        self.procs: Processes | None = None
        self.client: Client | None = None

    def start(self) -> Judge:
        k8s, etcd = build.kubernetes(self.kubernetes_version), build.etcd()
        build.build_all([k8s, etcd], echo=self.echo)
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="api-judge-"))
        atexit.register(self.stop)
        try:
            pkid = self.dir / "pki"
            pki.make(pkid)
            self.procs = Processes(self.dir, die_with_parent=True)  # no judge outlives a killed run
            ports = {name: free_port() for name in ("etcd", "etcd-peer", "kube-apiserver")}
            server = f"https://127.0.0.1:{ports['kube-apiserver']}"
            self.client = start_api_server(self.dir, pkid, self.procs, ports, k8s, etcd, server)
            self._load_crds()
        except BaseException:
            self.stop()
            raise
        return self

    def _load_crds(self) -> None:
        assert self.client is not None
        crds = components.crds(self.trainer_version, True)
        for crd in crds:
            self.client.apply(crd, manager=JUDGE_MANAGER)
        _wait_established(self.client, [c["metadata"]["name"] for c in crds])

    def stop(self) -> None:
        if self.procs is not None:
            self.procs.stop_all()
            self.procs = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    @property
    def api(self) -> Client:
        if self.client is None:
            self.start()
        assert self.client is not None
        return self.client

    def _namespace_for(self, obj: dict) -> None:
        ns = (obj.get("metadata") or {}).get("namespace")
        if ns and self.api.get_or_none("v1", "Namespace", ns) is None:
            self._create_quietly({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        if obj.get("kind") == "Namespace" or ns:
            # what the service account controller makes in every namespace: the ServiceAccount
            # admission plugin refuses a pod whose account does not exist
            self._create_quietly({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": ns or obj["metadata"]["name"]}})

    def _create_quietly(self, obj: dict) -> None:
        try:
            self.api.create(obj)
        except ApiError as err:
            if err.status not in (404, 409):  # (a namespace not yet stored: its account comes with it)
                raise

    def install(self, objs: list[dict]) -> list[str]:
        """Store ``objs`` for real (namespaces first, then policies, then the rest); problems if refused."""
        problems = []
        ordered = sorted(objs, key=lambda o: (o.get("kind") != "Namespace", o.get("kind") not in POLICY_KINDS))
        for obj in ordered:
            try:
                self._namespace_for(obj)
                self.api.apply({k: v for k, v in obj.items() if k != "status"}, manager=JUDGE_MANAGER)
                self.installed.append(obj)
                if obj.get("kind") == "Namespace":
                    self._namespace_for(obj)
            except ApiError as err:
                problems.append(f"{cluster_apply.label(obj)}: refused by the API server (HTTP {err.status}): {err}")
        if any(o.get("kind") in POLICY_KINDS for o in objs):
            time.sleep(POLICY_SYNC_SECONDS)
        return problems

    def validate(self, obj: dict, *, replaced: bool = False) -> list[str]:
        """What the API server says of ``obj``: a dry-run create, or where it exists, a dry-run
        update; an object Pulumi replaces (``replaced``) is judged as its replacement's create."""
        self._namespace_for(obj)
        created = cluster_apply.dry_create(self.api, obj)
        if created is not None:
            return created
        if replaced:
            return cluster_apply.dry_create_renamed(self.api, obj, "-replace", " (as its replacement)")
        body = {k: v for k, v in obj.items() if k != "status"}
        try:
            return [f"{cluster_apply.label(obj)}: update: {d}" for d in cluster_apply.differences(body, self.api.apply(body, manager=JUDGE_MANAGER, dry_run=True))]
        except ApiError as err:
            return [f"{cluster_apply.label(obj)}: update: refused by the API server (HTTP {err.status}): {err}"]

    def reset(self) -> None:
        """Back to the CRDs alone, for the next render: what :meth:`install` stored is deleted (the
        namespaces stay: without the namespace controller they could not go, and they are empty)."""
        self.remove(list(reversed(self.installed)))
        self.installed = []

    def remove(self, objs: list[dict]) -> None:
        """Delete ``objs`` (not namespaces)."""
        for obj in objs:
            if obj.get("kind") == "Namespace":
                continue
            meta = obj["metadata"]
            path = self.api.path(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
            try:
                # the protection finalizers (pv-protection, pvc-protection) are removed by controllers
                # this server does not run: cleared here, so the object goes
                self.api.request("PATCH", path, body={"metadata": {"finalizers": None}}, content_type="application/merge-patch+json")
                self.api.delete(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))
            except ApiError as err:
                if err.status != 404:
                    raise


_JUDGES: dict[tuple[str, str], Judge] = {}


def running(trainer_version: str, kubernetes_version: str) -> Judge | None:
    """The judge this process started for these versions with :func:`judge_for`, if any."""
    return _JUDGES.get((trainer_version, kubernetes_version))


def judge_for(trainer_version: str = versions.DEFAULT_TRAINER_VERSION, kubernetes_version: str = versions.DEFAULT_KUBERNETES_VERSION) -> Judge:
    """One started judge per (Trainer, Kubernetes) version in this process, stopped at exit."""
    key = (trainer_version, kubernetes_version)
    if key not in _JUDGES:
        _JUDGES[key] = Judge(kubernetes_version=kubernetes_version, trainer_version=trainer_version, echo=lambda *_: None).start()
    return _JUDGES[key]
