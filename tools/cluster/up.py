"""Bring a stack's local control plane up, or down.

``up`` renders the stack, builds (or takes from the cache) the components at the stack's versions,
starts etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok, the JobSet and Trainer
controllers (and Kueue when the stack runs it) with their webhooks, Karpenter's kwok provider, makes
the managed node groups' nodes, and applies the stack's objects with server-side apply in Pulumi's
order, reading each back. Everything lives in ``out/<stack>/cluster`` (``kubeconfig``, ``state.json``
with the pids, ``logs/``); ``down`` stops exactly the recorded pids and removes the directory.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import secrets
import shutil
import ssl
import time
import urllib.request
from dataclasses import dataclass

import yaml

import versions
from tools.cluster import build, components, pki, sim
from tools.cluster.apply import Outcome, apply_waves
from tools.cluster.client import ApiError, Client
from tools.cluster.plan import StackPlan, stack_plan
from tools.cluster.procs import ProcessError, Processes, alive, free_port, port_in_use

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent.parent
LOCAL_MANAGER = "training-platform-local"  # field manager of what the harness itself applies


class UpError(Exception):
    """cluster-up could not proceed: one line (or a line and a log tail) for the user."""


@dataclass
class Up:
    dir: pathlib.Path
    plan: StackPlan
    server: str
    kubeconfig: pathlib.Path
    outcome: Outcome
    seconds: float
    build_seconds: float

    def client(self) -> Client:
        return Client(self.server, self.dir / "pki")


def cluster_dir(stack: str, out: str | os.PathLike = "out") -> pathlib.Path:
    return pathlib.Path(out) / stack / "cluster"


def _get(url: str, *, ctx: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # noqa: S310 - loopback URLs we built
        return resp.status == 200


def _insecure() -> ssl.SSLContext:
    """For the /healthz of kube-controller-manager and kube-scheduler (self-signed, loopback)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def _write(path: pathlib.Path, text: str, mode: int = 0o644) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def _encryption_config(d: pathlib.Path) -> pathlib.Path:
    """Secrets encrypted at rest in etcd (secretbox, a key made at start), as EKS encrypts them."""
    key = base64.b64encode(secrets.token_bytes(32)).decode()
    cfg = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "EncryptionConfiguration",
        "resources": [{"resources": ["secrets"], "providers": [{"secretbox": {"keys": [{"name": "local", "secret": key}]}}, {"identity": {}}]}],
    }
    return _write(d / "encryption.yaml", yaml.safe_dump(cfg), 0o600)


def check_stale(d: pathlib.Path, stack: str, echo=print) -> None:
    procs = Processes(d)
    running = [p for p in procs.procs if alive(p)]
    if running:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in running)
        raise UpError(f"a local cluster for stack {stack} is already running in {d}: {names}; run `make cluster-down STACK={stack}` first")
    if d.exists():
        echo(f"cluster: removing the stale state in {d} (none of its processes is running)")
        shutil.rmtree(d)


def _wait_established(client: Client, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            crd = client.get_or_none("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
            conds = {c["type"]: c["status"] for c in (((crd or {}).get("status") or {}).get("conditions") or [])}
            if conds.get("Established") == "True":
                pending.discard(name)
        time.sleep(0.2)
    if pending:
        raise UpError(f"CRDs not established after {timeout:.0f} s: {', '.join(sorted(pending))}")


def _wait_nodes_ready(client: Client, names: list[str], procs: Processes, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        ready = 0
        for node in client.list("v1", "Node"):
            if node["metadata"]["name"] in names and any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", [])):
                ready += 1
        if ready == len(names):
            return
        time.sleep(0.3)
    raise UpError(f"the node groups' kwok nodes are not Ready after {timeout:.0f} s (see {procs.dir / 'logs' / 'kwok.log'})")


def _namespace(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def up(stack: str, *, out: str | os.PathLike = "out", stack_config: dict | None = None, echo=print, apply_stack: bool = True, pod_run_seconds: float = 3.0) -> Up:
    """``pod_run_seconds``: how long a simulated pod of a Job runs before it succeeds (kwok's stage)."""
    from tools.mock_runtime import ProgramError, run_program

    started = time.monotonic()
    d = cluster_dir(stack, out).resolve()
    check_stale(d, stack, echo)
    from config.stack_file import StackFileError

    try:
        run = run_program(str(PROJECT_DIR), stack, stack_config=stack_config)
    except FileNotFoundError:
        raise UpError(f"no stack {stack}: Pulumi.{stack}.yaml does not exist") from None
    except (ProgramError, StackFileError) as err:
        raise UpError(f"rendering stack {stack} failed: {' '.join(str(err).split())}") from None
    region = _region(stack, stack_config)
    plan = stack_plan(run, region)
    with_kueue = plan.kueue is not None
    units = build.units_for(plan.kubernetes_version, plan.trainer_version, with_kueue)
    build_seconds = build.build_all(units, echo=echo)
    retried = False
    while True:
        d.mkdir(parents=True)
        procs = Processes(d)
        procs.info = {"stack": stack, "created": time.time()}
        procs.save()
        try:
            return _start(stack, d, plan, procs, units, build_seconds, started, apply_stack, echo, pod_run_seconds)
        except ProcessError as err:
            stopped = procs.stop_all()
            # a free port chosen at start can be taken by another process before its component binds it
            if retried or "address already in use" not in str(err):
                echo(f"cluster: stopped {', '.join(stopped)}; logs kept in {d / 'logs'}")
                raise
            echo("cluster: a chosen port was taken before its component bound it; starting again with new ports")
            shutil.rmtree(d)
            retried = True
        except BaseException:
            stopped = procs.stop_all()
            if stopped:
                echo(f"cluster: stopped {', '.join(stopped)}; logs kept in {d / 'logs'}")
            raise


def _region(stack: str, stack_config: dict | None) -> str:
    if stack_config is None:
        path = PROJECT_DIR / f"Pulumi.{stack}.yaml"
        stack_config = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return ((stack_config or {}).get("config") or {}).get("aws:region") or os.environ.get("AWS_REGION") or "us-west-2"


def _start(stack: str, d: pathlib.Path, plan: StackPlan, procs: Processes, units: list[build.Unit], build_seconds: float, started: float, apply_stack: bool, echo, pod_run_seconds: float) -> Up:
    k8s, jobset_u, trainer_u, karpenter_u, kwok_u = units[:5]
    kueue_u = next((u for u in units if u.module == versions.KUEUE_MODULE), None)
    pkid = d / "pki"
    pki.make(pkid)
    ports = {name: free_port() for name in ("etcd", "etcd-peer", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset-webhook", "jobset-health", "trainer-webhook", "trainer-health", "trainer-status", "kueue-webhook", "kueue-health", "kueue-visibility", "karpenter-metrics", "karpenter-health", "kwok-kubelet")}
    for name, port in ports.items():
        if port_in_use(port):
            raise UpError(f"port {port} for {name} is in use (another process took it after it was chosen): run cluster-up again")
    procs.info["ports"] = ports
    server = f"https://127.0.0.1:{ports['kube-apiserver']}"
    procs.info["server"] = server
    procs.save()

    admin = start_api_server(d, pkid, procs, ports, k8s, next(u for u in units if u.module == versions.ETCD_MODULE), server)
    kubeconfig = _write(d / "kubeconfig", pki.kubeconfig(pkid, server), 0o600)
    kc = str(kubeconfig)

    procs.start("kube-controller-manager", [str(k8s.path("kube-controller-manager")), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kube-controller-manager']}", f"--service-account-private-key-file={pkid / 'sa.key'}", f"--root-ca-file={pkid / 'ca.crt'}",
        "--leader-elect=false", "--use-service-account-credentials=false", "--controllers=*,-nodeipam,-cloud-node-lifecycle,-service-lb-controller,-node-route-controller", "--profiling=false"])
    procs.start("kube-scheduler", [str(k8s.path("kube-scheduler")), f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['kube-scheduler']}", "--leader-elect=false", "--profiling=false"])
    procs.wait("kube-controller-manager", lambda: _get(f"https://127.0.0.1:{ports['kube-controller-manager']}/healthz", ctx=_insecure()), 60, "/healthz")
    procs.wait("kube-scheduler", lambda: _get(f"https://127.0.0.1:{ports['kube-scheduler']}/healthz", ctx=_insecure()), 60, "/healthz")

    # CRDs as the pinned releases ship them
    crds = components.crds(plan.trainer_version, kueue_u is not None)
    for crd in crds:
        admin.apply(crd, manager=LOCAL_MANAGER)
    _wait_established(admin, [c["metadata"]["name"] for c in crds])

    # the namespaces Helm releases create (their charts are stood in for by the local controllers)
    for release in plan.releases:
        if release.create_namespace:
            admin.apply(_namespace(release.namespace), manager=LOCAL_MANAGER)

    # managed node groups -> kwok nodes; kwok makes them (and Karpenter's) Ready and runs pods
    nodes = sim.system_nodes(plan.node_groups, plan.zones, plan.kubernetes_version)
    for node in nodes:
        status = node.pop("status")
        admin.create(node)
        admin.request("PATCH", admin.path("v1", "Node", node["metadata"]["name"]) + "/status", body={"status": status}, content_type="application/merge-patch+json")
    kwok_cfg = [{"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": {
        "manageNodesWithAnnotationSelector": f"{components.KWOK_NODE_ANNOTATION}=fake", "nodeLeaseDurationSeconds": 40, "cidr": "10.244.0.0/16",
        # the binary applies none of its configuration defaults to a --config file: all set here. The
        # pods-on-node sync picks up pods bound to a node before kwok saw that node.
        "podPlayStageParallelism": 4, "nodePlayStageParallelism": 4, "nodeLeaseParallelism": 4, "podsOnNodeSyncParallelism": 2,
        "enablePodsOnNodeSyncListPager": True, "enablePodsOnNodeSyncStreamWatch": False, "manageAllNodes": False,
        "enableProfilingHandler": False, "enableContentionProfiling": False,
        # the kubelet API (pod logs) of every simulated node, on loopback with our certificate
        "nodeIP": "127.0.0.1", "nodePort": ports["kwok-kubelet"], "serverAddress": f"127.0.0.1:{ports['kwok-kubelet']}",
        "tlsCertFile": str(pkid / "webhook.crt"), "tlsPrivateKeyFile": str(pkid / "webhook.key"), "enableDebuggingHandlers": True}}]
    kwok_cfg += components.kwok_stages(pod_run_seconds)
    kwok_cfg.append(components.kwok_logs(_write(d / "pod.log", components.SIMULATED_POD_LOG)))
    kwok_file = _write(d / "kwok.yaml", yaml.safe_dump_all(kwok_cfg, sort_keys=False))
    procs.start("kwok", [str(kwok_u.path("kwok")), f"--kubeconfig={kc}", f"--config={kwok_file}"], env={"HOME": str(d)})
    _wait_nodes_ready(admin, [n["metadata"]["name"] for n in nodes], procs)

    # controllers with their webhooks on 127.0.0.1, our certificate
    certs = d / "webhook-certs"
    certs.mkdir()
    shutil.copy(pkid / "webhook.crt", certs / "tls.crt")
    shutil.copy(pkid / "webhook.key", certs / "tls.key")
    trainer_tmp = d / "trainer-tmp"
    (trainer_tmp / "k8s-webhook-server").mkdir(parents=True)
    shutil.copytree(certs, trainer_tmp / "k8s-webhook-server" / "serving-certs")
    ca = pki.ca_bundle(pkid)

    jobset_file = _write(d / "jobset.yaml", yaml.safe_dump(components.jobset_config(ports["jobset-webhook"], ports["jobset-health"], certs)))
    procs.start("jobset", [str(jobset_u.path("jobset")), f"--kubeconfig={kc}", f"--config={jobset_file}"])
    trainer_cmd = [str(trainer_u.path("trainer-controller-manager")), f"--kubeconfig={kc}"]
    gates = plan.trainer_feature_gates()
    if gates:
        wrapped = _as_trainer_pod(admin, d, certs, (pkid / "ca.crt").read_text(), trainer_cmd)
        if wrapped is None:
            echo("cluster: no mount namespace on this machine, so the Trainer runs without its feature gates " + ", ".join(sorted(gates)) + " (TrainJob progress is not served)")
            gates = {}
        else:
            trainer_cmd = wrapped
    trainer_file = _write(d / "trainer.yaml", yaml.safe_dump(components.trainer_config(ports["trainer-webhook"], ports["trainer-health"], ports["trainer-status"], gates)))
    procs.start("trainer", [*trainer_cmd, f"--config={trainer_file}"], env={"TMPDIR": str(trainer_tmp)})
    hooks = components.jobset_webhooks(plan.trainer_version).configurations(ports["jobset-webhook"], ca)
    hooks += components.trainer_webhooks(plan.trainer_version).configurations(ports["trainer-webhook"], ca)
    visibility = None  # Kueue's visibility API, served where Kueue can have its certificate at its fixed path
    if kueue_u is not None:
        _kueue_metrics_certs(certs, procs)
        kueue_cmd = [str(kueue_u.path("kueue")), f"--kubeconfig={kc}"]
        from tools.emulator_mounts import in_mount_namespace

        try:  # the mountpoint, made here: inside the namespace a user without root could not make it at /
            pathlib.Path(components.KUEUE_VISIBILITY_CERT_DIR).mkdir(exist_ok=True)
            wrapped = in_mount_namespace(kueue_cmd, {components.KUEUE_VISIBILITY_CERT_DIR: str(certs)})
        except OSError:
            wrapped = None
        if wrapped is not None:
            kueue_cmd, visibility = wrapped, ports["kueue-visibility"]
        else:
            echo(f"cluster: no mount namespace or no {components.KUEUE_VISIBILITY_CERT_DIR} mountpoint on this machine, so Kueue runs without its visibility API (queue positions are estimated)")
        kueue_file = _write(d / "kueue.yaml", yaml.safe_dump(components.kueue_config(plan.kueue_config() or {}, ports["kueue-webhook"], ports["kueue-health"], certs, visibility)))
        procs.start("kueue", [*kueue_cmd, f"--config={kueue_file}"])
        hooks += components.kueue_webhooks().configurations(ports["kueue-webhook"], ca)
    procs.wait("jobset", lambda: _get(f"http://127.0.0.1:{ports['jobset-health']}/readyz"), 120, "/readyz")
    procs.wait("trainer", lambda: _get(f"http://127.0.0.1:{ports['trainer-health']}/readyz"), 120, "/readyz")
    if kueue_u is not None:
        procs.wait("kueue", lambda: _get(f"http://127.0.0.1:{ports['kueue-health']}/readyz"), 120, "/readyz")
    for hook in hooks:
        admin.apply(hook, manager=LOCAL_MANAGER)
    if visibility is not None:
        _serve_kueue_visibility(admin, procs, visibility)

    # Karpenter's core with the kwok provider, launching the catalog's GPU types in the stack's zones
    types_file = _write(d / "instance-types.json", json.dumps(sim.instance_types(plan.zones)))
    procs.start("karpenter", [str(karpenter_u.path("karpenter-kwok"))], env={
        "KUBECONFIG": kc, "DISABLE_LEADER_ELECTION": "true", "METRICS_PORT": str(ports["karpenter-metrics"]), "HEALTH_PROBE_PORT": str(ports["karpenter-health"]),
        "INSTANCE_TYPES_FILE_PATH": str(types_file), "LOG_LEVEL": "info", "BATCH_IDLE_DURATION": "1s", "BATCH_MAX_DURATION": "5s",
        **({"FEATURE_GATES": plan.karpenter_feature_gates()} if plan.karpenter_feature_gates() else {})})
    procs.wait("karpenter", lambda: _get(f"http://127.0.0.1:{ports['karpenter-health']}/readyz"), 120, "/readyz")
    admin.apply(sim.kwok_node_class(), manager=LOCAL_MANAGER)

    outcome = Outcome(0, [])
    if apply_stack:
        outcome = apply_waves(admin, plan.waves)
        for obj in plan.objects:
            if obj["kind"] == "NodePool" and obj["apiVersion"].startswith("karpenter.sh/"):
                admin.apply(sim.twin_node_pool(obj), manager=LOCAL_MANAGER)
    procs.check()
    procs.info.update({"kubeconfig": str(kubeconfig), "versions": {u.module: u.version for u in units}, "applied": outcome.applied, "problems": outcome.problems})
    procs.save()
    return Up(d, plan, server, kubeconfig, outcome, time.monotonic() - started, build_seconds)


def start_api_server(d: pathlib.Path, pkid: pathlib.Path, procs: Processes, ports: dict[str, int], k8s: build.Unit, etcd_u: build.Unit, server: str) -> Client:
    """etcd and kube-apiserver (the stack's minor) with our PKI, started and ready: the judge of
    every object (``make validate`` runs only these: tools/cluster/bare.py)."""
    procs.start("etcd", [str(etcd_u.path("etcd")), "--name", "local", "--data-dir", str(d / "etcd"), "--listen-client-urls", f"http://127.0.0.1:{ports['etcd']}", "--advertise-client-urls", f"http://127.0.0.1:{ports['etcd']}",
                         "--listen-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{ports['etcd-peer']}",
                         "--initial-cluster", f"local=http://127.0.0.1:{ports['etcd-peer']}", "--unsafe-no-fsync", "--quota-backend-bytes", str(2 * 1024**3), "--log-level", "warn"])
    procs.wait("etcd", lambda: _get(f"http://127.0.0.1:{ports['etcd']}/health"), 30, f"http://127.0.0.1:{ports['etcd']}/health")

    procs.start("kube-apiserver", [str(k8s.path("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{ports['etcd']}", "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports['kube-apiserver']}",
        f"--tls-cert-file={pkid / 'apiserver.crt'}", f"--tls-private-key-file={pkid / 'apiserver.key'}", f"--client-ca-file={pkid / 'ca.crt'}",
        # the issuer is the server's own URL, so its OIDC discovery resolves here (the Trainer's status server uses it)
        f"--service-account-issuer={server}", f"--service-account-jwks-uri={server}/openid/v1/jwks", f"--service-account-key-file={pkid / 'sa.pub'}", f"--service-account-signing-key-file={pkid / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16", "--authorization-mode=Node,RBAC", "--anonymous-auth=false", "--profiling=false", "--allow-privileged=true",
        f"--encryption-provider-config={_encryption_config(d)}", f"--cert-dir={d / 'apiserver-certs'}", "--enable-admission-plugins=NodeRestriction",
        # pod logs come from kwok's kubelet API on 127.0.0.1 (its serving certificate is ours)
        f"--kubelet-certificate-authority={pkid / 'ca.crt'}", f"--kubelet-client-certificate={pkid / 'admin.crt'}", f"--kubelet-client-key={pkid / 'admin.key'}",
        "--kubelet-preferred-address-types=InternalIP",
        # the aggregation layer (Kueue's visibility API): the front proxy's client certificate and CA, and
        # the request headers that carry the user to the aggregated server (Kubernetes' "Configure the Aggregation Layer")
        f"--requestheader-client-ca-file={pkid / 'front-proxy-ca.crt'}", f"--requestheader-allowed-names={pki.FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group", "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pkid / 'front-proxy-client.crt'}", f"--proxy-client-key-file={pkid / 'front-proxy-client.key'}"])
    admin = Client(server, pkid)
    procs.wait("kube-apiserver", lambda: admin.get_path("/readyz") == "ok", 90, f"{server}/readyz")
    return admin


def _as_trainer_pod(admin: Client, d: pathlib.Path, certs: pathlib.Path, ca_pem: str, command: list[str]) -> list[str] | None:
    """``command`` with what the Trainer's status server reads in its pod: a service account token
    and namespace, and the serving certificate at its fixed path (a mount namespace of its own;
    the host's paths are not changed), and the webhook Secret its plugin copies ``ca.crt`` from.
    None where this machine has no mount namespaces."""
    from tools.emulator_mounts import in_mount_namespace

    pathlib.Path(components.TRAINER_SERVING_CERTS).mkdir(parents=True, exist_ok=True)  # an empty mountpoint
    sa_dir = d / "trainer-serviceaccount"
    wrapped = in_mount_namespace(command, {components.POD_SERVICE_ACCOUNT_DIR: str(sa_dir), components.TRAINER_SERVING_CERTS: str(certs)})
    if wrapped is None:
        return None
    ns = components.TRAINER_NAMESPACE
    admin.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": components.TRAINER_SERVICE_ACCOUNT, "namespace": ns}}, manager=LOCAL_MANAGER)
    token = admin.request("POST", admin.path("v1", "ServiceAccount", components.TRAINER_SERVICE_ACCOUNT, ns) + "/token",
                          body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}})["status"]["token"]
    sa_dir.mkdir()
    _write(sa_dir / "token", token, 0o600)
    _write(sa_dir / "namespace", ns)
    _write(sa_dir / "ca.crt", ca_pem)
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    admin.apply({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "metadata": {"name": components.TRAINER_WEBHOOK_SECRET, "namespace": ns},
                 "data": {"ca.crt": b64(ca_pem), "tls.crt": b64((certs / "tls.crt").read_text()), "tls.key": b64((certs / "tls.key").read_text())}}, manager=LOCAL_MANAGER)
    return wrapped


def _serve_kueue_visibility(admin: Client, procs: Processes, port: int) -> None:
    """Kueue's APIServices (tools/cluster/components.py) applied, and Available: the aggregator
    reached the server, and its discovery answers (an APIService that is not would make every
    client's discovery fail)."""
    objects = components.kueue_visibility_objects(port)
    for obj in objects:
        admin.apply(obj, manager=LOCAL_MANAGER)

    def available() -> bool:
        for api in (o for o in objects if o["kind"] == "APIService"):
            got = admin.get(api["apiVersion"], api["kind"], api["metadata"]["name"])
            if not any(c.get("type") == "Available" and c.get("status") == "True" for c in (got.get("status") or {}).get("conditions") or []):
                return False
        return True

    procs.wait("kueue", available, 90, "its visibility APIServices Available")


def _kueue_metrics_certs(certs: pathlib.Path, procs: Processes) -> None:
    """Kueue reads its metrics certificate from a fixed path when its own cert rotation is off."""
    target = components.KUEUE_METRICS_CERT_DIR
    if (target / "tls.crt").is_file() and (target / "tls.key").is_file():
        return
    try:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(certs / "tls.crt", target / "tls.crt")
        shutil.copy(certs / "tls.key", target / "tls.key")
    except OSError as err:
        raise UpError(f"kueue needs a certificate at {target} (fixed in its main.go) and it cannot be written ({err.strerror}): create it, or run as a user who may") from None


def down(stack: str, *, out: str | os.PathLike = "out") -> list[str]:
    d = cluster_dir(stack, out).resolve()
    if not d.exists():
        return []
    procs = Processes(d)
    stopped = procs.stop_all()
    left = [p for p in procs.procs if alive(p)]
    if left:
        raise UpError(f"could not stop {', '.join(f'{p.name} (pid {p.pid})' for p in left)}; state kept in {d}")
    shutil.rmtree(d)
    return stopped


def summary(result: Up, units: list[build.Unit] | None = None) -> str:
    plan = result.plan
    procs = Processes(result.dir)
    kinds: dict[str, int] = {}
    for obj in plan.objects:
        kinds[obj["kind"]] = kinds.get(obj["kind"], 0) + 1
    lines = [f"cluster-up {plan.stack}: up in {result.seconds:.0f} s (building {result.build_seconds:.0f} s of it); kubeconfig {result.kubeconfig}"]
    for name, version in (procs.info.get("versions") or {}).items():
        lines.append(f"  {name} {version}")
    lines.append(f"  processes: {', '.join(f'{p.name}({p.pid})' for p in procs.procs)}")
    lines.append(f"  objects applied: {result.outcome.applied} of {len(plan.objects)} ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")
    stood_in = ", ".join(f"{r.name} {r.version}" for r in plan.releases)
    lines.append(f"  Helm releases stood in for by the local controllers or not run: {stood_in}")
    for problem in result.outcome.problems:
        lines.append(f"  PROBLEM {problem}")
    return "\n".join(lines)


def wrap_errors(fn):
    """Run ``fn``; known failures become (message, exit code) without a traceback."""
    try:
        return fn(), 0
    except (UpError, ProcessError, build.BuildError, pki.PkiError) as err:
        return str(err), 2
    except ApiError as err:
        return f"the local API server refused a request: {err}", 2
    except ValueError as err:
        return str(err), 2
