"""How each upstream component runs on the local control plane: its command line, its
configuration file, the CRDs it needs (read from its Go module, as released) and its webhook
configurations (the module's own manifests, pointed at ``https://127.0.0.1:<port>``).

Configuration facts, read from the modules' sources at the pinned versions:

* Trainer (``pkg/config``, ``cmd/trainer-controller-manager``): ``certManagement.enable: false`` turns
  off the in-pod certificate rotator; the webhook server reads ``$TMPDIR/k8s-webhook-server/
  serving-certs/tls.{crt,key}`` (no cert-dir option); v2.1.0 dereferences ``webhook.host``, so it is
  always set. Leader election is off when not configured.
* JobSet (``api/config/v1alpha1``): leader election and internal cert management default to on;
  both off, certificates from ``webhook.certDir``.
* Kueue (``apis/config/v1beta2``, ``cmd/kueue/main.go``): leader election and internal certs off;
  with internal certs off the manager reads ``/etc/kueue/metrics/certs/tls.{crt,key}`` even with
  metrics disabled; the visibility API server (``pkg/visibility/server.go``) reads its certificate
  from ``/visibility`` and, given ``--kubeconfig``, delegates authentication and authorization to
  that API server: it runs, served through the aggregation layer; ``waitForPodsReady`` is always on.
* Karpenter's kwok provider (``pkg/operator/options``, ``kwok/main.go``): configured by environment
  (``KUBECONFIG``; an unknown flag such as ``--kubeconfig`` panics), ``DISABLE_LEADER_ELECTION``,
  ``INSTANCE_TYPES_FILE_PATH`` replacing its built-in catalog.
* kwok (``pkg/kwok/cmd``): manages the nodes annotated ``kwok.x-k8s.io/node=fake``; without stages it
  does nothing, so the stages come in its ``--config``.
"""

from __future__ import annotations

import copy
import pathlib
from dataclasses import dataclass

import yaml

import versions
from config.namespaces import TRAINER_NAMESPACE  # noqa: F401  (part of this module's interface)
from tools.cluster import build

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KUEUE_METRICS_CERT_DIR = pathlib.Path("/etc/kueue/metrics/certs")  # hard-coded in Kueue's main.go


@dataclass(frozen=True)
class Webhooks:
    """A component's webhook configurations: the module file, what to keep, what upstream's
    kustomize adds (selectors), and the names the released install gives them."""

    module: str
    version: str
    manifest: str
    names: dict[str, str]  # upstream kind -> released name
    keep: tuple[str, ...] | None = None  # webhook names to keep (None: all)
    object_selectors: dict[str, dict] | None = None
    namespace_selectors: dict[str, dict] | None = None

    def configurations(self, port: int, ca_bundle: str) -> list[dict]:
        docs = [d for d in yaml.safe_load_all((build.module_dir(self.module, self.version) / self.manifest).read_text()) if d]
        out = []
        for doc in docs:
            doc = copy.deepcopy(doc)
            doc["metadata"] = {"name": self.names[doc["kind"]], "labels": {"training-platform/local-cluster": "webhook"}}
            hooks = []
            for hook in doc.get("webhooks", []):
                if self.keep is not None and hook["name"] not in self.keep:
                    continue
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
                if self.object_selectors and hook["name"] in self.object_selectors:
                    hook["objectSelector"] = self.object_selectors[hook["name"]]
                if self.namespace_selectors and hook["name"] in self.namespace_selectors:
                    hook["namespaceSelector"] = self.namespace_selectors[hook["name"]]
                hooks.append(hook)
            if hooks:
                doc["webhooks"] = hooks
                out.append(doc)
        return out


# --- CRDs ---------------------------------------------------------------------------------------

def _crd_files(module: str, version: str, *globs: str) -> list[pathlib.Path]:
    root = build.module_dir(module, version)
    out: list[pathlib.Path] = []
    for pattern in globs:
        found = sorted(root.glob(pattern))
        if not found:
            raise build.BuildError(f"{module}@{version} has no {pattern}")
        out += found
    return out


def crds(trainer_version: str, with_kueue: bool) -> list[dict]:
    files = _crd_files(versions.JOBSET_MODULE, versions.TRAINER_VERSIONS[trainer_version]["jobset"], "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml")
    files += _crd_files(versions.TRAINER_MODULE, trainer_version, "manifests/base/crds/trainer.kubeflow.org_*.yaml")
    # the karpenter.sh CRDs as the AWS provider ships them (with its label allow-list), its EC2NodeClass,
    # and the kwok provider's KWOKNodeClass
    files += _crd_files(versions.KARPENTER_AWS_MODULE, "v" + versions.KARPENTER_VERSION, "pkg/apis/crds/karpenter.sh_*.yaml", "pkg/apis/crds/karpenter.k8s.aws_ec2nodeclasses.yaml")
    files += _crd_files(versions.KARPENTER_CORE_MODULE, versions.KARPENTER_CORE_VERSION, "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml")
    if with_kueue:
        files += _crd_files(versions.KUEUE_MODULE, "v" + versions.KUEUE_VERSION, "config/components/crd/bases/kueue.x-k8s.io_*.yaml")
    return [yaml.safe_load(f.read_text()) for f in files]


# --- controllers -----------------------------------------------------------------------------------

def trainer_webhooks(version: str) -> Webhooks:
    runtime_selector = {"matchExpressions": [{"key": "trainer.kubeflow.org/webhook-validation", "operator": "NotIn", "values": ["disabled"]}]}
    return Webhooks(
        versions.TRAINER_MODULE, version, "manifests/base/webhook/manifests.yaml",
        {"MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org", "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org"},
        object_selectors={
            "validator.clustertrainingruntime.trainer.kubeflow.org": runtime_selector,
            "validator.trainingruntime.trainer.kubeflow.org": runtime_selector,
        },
    )


def jobset_webhooks(trainer_version: str) -> Webhooks:
    pods = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    return Webhooks(
        versions.JOBSET_MODULE, versions.TRAINER_VERSIONS[trainer_version]["jobset"], "config/components/webhook/manifests.yaml",
        {"MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration", "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration"},
        object_selectors={"mpod.kb.io": pods, "vpod.kb.io": pods},
    )


KUEUE_JOB_WEBHOOKS = ("mtrainjob.kb.io", "vtrainjob.kb.io", "mjobset.kb.io", "vjobset.kb.io")
KUEUE_API_WEBHOOKS = ("mworkload.kb.io", "vworkload.kb.io", "mclusterqueue.kb.io", "vclusterqueue.kb.io", "mresourceflavor.kb.io", "vresourceflavor.kb.io", "vcohort.kb.io")


def kueue_webhooks() -> Webhooks:
    # config/components/webhook/kustomization.yaml: job webhooks skip kube-system and kueue-system
    not_system = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", "kueue-system"]}]}
    return Webhooks(
        versions.KUEUE_MODULE, "v" + versions.KUEUE_VERSION, "config/components/webhook/manifests.yaml",
        {"MutatingWebhookConfiguration": "kueue-mutating-webhook-configuration", "ValidatingWebhookConfiguration": "kueue-validating-webhook-configuration"},
        keep=KUEUE_JOB_WEBHOOKS + KUEUE_API_WEBHOOKS,
        namespace_selectors={name: not_system for name in KUEUE_JOB_WEBHOOKS},
    )


def trainer_config(webhook_port: int, health_port: int, status_port: int, feature_gates: dict) -> dict:
    cfg = {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "webhook": {"port": webhook_port, "host": "127.0.0.1"},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "certManagement": {"enable": False},
    }
    if feature_gates:
        cfg["featureGates"] = dict(feature_gates)
        cfg["statusServer"] = {"port": status_port}
    return cfg


# The Trainer's status server (TrainJobStatus gate; pkg/statusserver, pkg/util/cert at v2.3.0) reads
# what a pod gives it: its serving certificate from the fixed /tmp/k8s-webhook-server/serving-certs
# (not $TMPDIR), its namespace and a token from /var/run/secrets/kubernetes.io/serviceaccount; the
# token's issuer is where it discovers the keys that verify the jobs' tokens (OIDC discovery, so
# the API server's issuer is its own URL here). The plugin copies ``ca.crt`` of the webhook Secret
# (certManagement.webhookSecretName) into each job's namespace.
TRAINER_SERVING_CERTS = "/tmp/k8s-webhook-server/serving-certs"
POD_SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TRAINER_SERVICE_ACCOUNT = "kubeflow-trainer-controller-manager"
TRAINER_WEBHOOK_SECRET = "kubeflow-trainer-webhook-cert"  # pkg/apis/config/v1alpha1/defaults.go


def jobset_config(webhook_port: int, health_port: int, cert_dir: pathlib.Path) -> dict:
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
    }


def kueue_config(stack_config: dict, webhook_port: int, health_port: int, cert_dir: pathlib.Path, visibility_port: int | None = None) -> dict:
    """The stack's own Kueue Configuration (its Helm values' ``controllerManagerConfigYaml``) with
    what only works in a pod replaced: leader election, cert rotation and metrics off; probes and
    webhooks on 127.0.0.1; the visibility API server on 127.0.0.1:``visibility_port`` (its
    certificate at :data:`KUEUE_VISIBILITY_CERT_DIR`, in Kueue's mount namespace), or off where
    that cannot be (None)."""
    cfg = copy.deepcopy(stack_config)
    cfg.update({
        "namespace": "kueue-system",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "internalCertManagement": {"enable": False},
    })
    gates = {**cfg.get("featureGates", {}), "MultiKueue": False}
    if visibility_port is None:
        gates["VisibilityOnDemand"] = False
    else:
        cfg["visibilityServer"] = {"bindAddress": "127.0.0.1", "bindPort": visibility_port}
    cfg["featureGates"] = gates
    return cfg


# pkg/visibility/server.go: with internal cert management off, the visibility server reads
# tls.crt and tls.key here (certDir, fixed); with a --kubeconfig flag it authenticates and
# authorizes its callers through that kubeconfig's API server (delegated: TokenReview,
# SubjectAccessReview, the front proxy's CA from kube-system/extension-apiserver-authentication).
KUEUE_VISIBILITY_CERT_DIR = "/visibility"
# the Service our APIServices name: not the chart's kueue-visibility-server, which the chart test applies beside it
KUEUE_VISIBILITY_SERVICE = "kueue-visibility-local"


def kueue_visibility_objects(port: int) -> list[dict]:
    """Kueue's own APIServices for its visibility API (config/components/visibility, v1beta1 and
    v1beta2, as released: insecureSkipTLSVerify, priorities), pointed at the manager's server on
    127.0.0.1:``port`` through a Service of type ExternalName (the aggregator dials
    ``https://<externalName>:<APIService port>``: k8s.io/apiserver pkg/util/proxy ResolveCluster),
    since no kube-proxy routes a ClusterIP here."""
    root = build.module_dir(versions.KUEUE_MODULE, "v" + versions.KUEUE_VERSION) / "config/components/visibility"
    service = yaml.safe_load((root / "service.yaml").read_text())
    objects: list[dict] = [{
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": KUEUE_VISIBILITY_SERVICE, "namespace": service["metadata"]["namespace"]},
        "spec": {"type": "ExternalName", "externalName": "localhost"},
    }]
    for version in ("v1beta1", "v1beta2"):
        api = yaml.safe_load((root / f"apiservice_{version}.yaml").read_text())
        api["spec"]["service"] = {"name": KUEUE_VISIBILITY_SERVICE, "namespace": service["metadata"]["namespace"], "port": port}
        objects.append(api)
    return objects


# kwok's own stages, read from its module: nodes Ready with lease heartbeats, pods Running and Ready.
KWOK_STAGE_FILES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_stages(run_seconds: float = 3.0) -> list[dict]:
    """The stages kwok runs: its fast node and pod stages, with two changes. Pods of Jobs (a JobSet's
    replicated jobs, the platform's one-shot Jobs) stay Running ``run_seconds`` before they succeed,
    so a job is seen running; a deleted pod loses its finalizers before kwok removes it (there is no
    kubelet; Karpenter's kwok setup does the same), so Job, JobSet and node drains finish."""
    root = build.module_dir(versions.KWOK_MODULE, versions.KWOK_VERSION)
    stages = [yaml.safe_load((root / f).read_text()) for f in KWOK_STAGE_FILES]
    for stage in stages:
        if stage["metadata"]["name"] == "pod-complete":
            stage["spec"]["delay"] = {"durationMilliseconds": int(run_seconds * 1000), "jitterDurationMilliseconds": int(run_seconds * 2000)}
        if stage["metadata"]["name"] == "pod-delete":
            stage["spec"]["next"]["finalizers"] = {"empty": True}
    return stages


# What `kubectl logs` (and trainctl logs) read from a simulated pod: no container runs on a kwok node.
# kwok serves the file as a kubelet does: in the CRI log format (time, stream, tag, message).
SIMULATED_POD_LOG = "2026-01-01T00:00:00.000000000Z stdout F local cluster: this pod ran on a simulated (kwok) node; no container ran, so there is no program output\n"


def kwok_logs(path: pathlib.Path) -> dict:
    """Every container's log, as kwok's kubelet API serves it, is ``path``."""
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": "all-pods"}, "spec": {"logs": [{"logsFile": str(path), "follow": False}]}}
