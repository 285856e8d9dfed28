"""The teams' portal in the cluster (``portal.enabled``): pure builders of its Kubernetes objects.

* Namespace ``platform-portal`` with Pod Security ``restricted`` enforced: the portal's pod runs
  non-root, read-only root filesystem, no capabilities, RuntimeDefault seccomp.
* ServiceAccount ``portal`` bound to a ClusterRole that may only ``impersonate``: the users
  ``portal:<team>`` and the groups ``training-platform:team:<team>`` of the teams the stack renders
  (``resourceNames``: exact names), and the user extra ``portal-subject`` (the signed-in login, for
  the audit log; RBAC never grants anything by an extra). Impersonating any user name would be a
  privilege escalation (RBAC binds roles to users such as ``system:kube-controller-manager``), so
  the user is the team's fixed portal user, never the login's name. No other verb, no
  ``system:`` group, no service account. (Kubernetes docs, "Authenticating" > "User impersonation":
  ``impersonate`` on ``users``/``groups`` in the core group and ``userextras/<key>`` in
  ``authentication.k8s.io``, restricted by ``resourceNames``.)
* Deployment (one replica: the CSRF key is the process's), Service, ConfigMap ``portal.json``
  (Region, the ALB's ARN up to its name, the teams' logins), the OIDC client Secret the ALB reads,
  and a Role of that one Secret for the controller that reads it: the self-managed controller's
  service account, or in Auto Mode the group ``eks:managed`` (get only).
* Two Ingresses in one ALB (IngressGroup): the pages with ``auth-on-unauthenticated-request:
  authenticate`` (OIDC login), and ``/api`` with ``allow`` (a browser session still gets its
  identity header; a team's backend sends a Kubernetes bearer token, which the portal passes to the
  API server unchanged). Annotations as kubernetes-sigs/aws-load-balancer-controller v3.5.0
  docs/guide/ingress/annotations.md documents them (the OIDC Secret's keys ``clientID`` and
  ``clientSecret``; ``load-balancer-name`` at most 32 characters; ``target-type: ip``).
* NetworkPolicy: the portal's port only from the ALB, which in IP target mode connects from its
  own network interfaces in the VPC's subnets: the VPC's CIDR blocks (the ALB's subnets are not
  known before the controller picks them); nothing else may reach the pod. Egress: DNS and HTTPS
  (the API server, and the ALB's public keys at ``public-keys.auth.elb.<region>.amazonaws.com``).
"""

from __future__ import annotations

import json
from typing import Any

from config.labels import NODE_ROLE_LABEL
from config.names import LOAD_BALANCER
from config.namespaces import PORTAL_NAMESPACE
from config.portal_models import PortalSettings
from k8s.builders.tenants import TEAM_POD_SECURITY_LABELS, team_group

NAME = "portal"
PORT = 8080
CONFIG_KEY = "portal.json"
OIDC_SECRET = "portal-oidc"
OIDC_SECRET_READER = "alb-controller-reads-portal-oidc"
IMPERSONATOR = "training-platform:portal-impersonator"
SUBJECT_EXTRA = "portal-subject"  # trainctl/portal/identity.py SUBJECT_EXTRA
LB_NAME_MAX = LOAD_BALANCER.limit  # 32; aws-load-balancer-controller v3.5.0 annotations.md: load-balancer-name "longer than 32 characters will be treated as an error"
LABELS = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/part-of": "training-platform"}
ALB_CLASS = "alb"
# EKS Auto Mode's load balancing: an IngressClass of controller eks.amazonaws.com/alb with its
# IngressClassParams (eks.amazonaws.com/v1); the self-managed controller's chart creates the class
# "alb" of controller ingress.k8s.aws/alb (awsdocs/amazon-eks-user-guide latest/ug/automode/auto-configure-alb.adoc;
# aws-load-balancer-controller v3.5.0 helm chart values.yaml createIngressClassResource, ingressClass: alb)
AUTO_MODE_CONTROLLER = "eks.amazonaws.com/alb"


def portal_user(team: str) -> str:
    return f"portal:{team}"  # trainctl/portal/identity.py portal_user


XFF_ATTRIBUTE = "routing.http.xff_header_processing.mode=append"


def load_balancer_name(cluster_name: str) -> str:
    """``<cluster>-portal`` when it is a valid ALB name, else shortened with a hash of the whole
    name (config/names.py): an ALB name has at most 32 characters, alphanumerics and hyphens only
    (Elastic Load Balancing API Reference, CreateLoadBalancer ``Name``), so a cluster name with
    ``_`` or two long cluster names sharing a prefix still give two valid, distinct names."""
    return LOAD_BALANCER.name(cluster_name, NAME)


def signer_prefix(partition: str, region: str, account: str, lb_name: str) -> str:
    """The ALB's ARN up to its id (ARN format: Elastic Load Balancing API Reference,
    ``arn:<partition>:elasticloadbalancing:<region>:<account>:loadbalancer/app/<name>/<id>``); an
    ALB name is unique per account and Region."""
    return f"arn:{partition}:elasticloadbalancing:{region}:{account}:loadbalancer/app/{lb_name}/"


def _meta(name: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespaced:
        meta["namespace"] = PORTAL_NAMESPACE
    return meta


def namespace() -> dict:
    meta = _meta(PORTAL_NAMESPACE, namespaced=False)
    meta["labels"].update(TEAM_POD_SECURITY_LABELS)
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


# The namespace label that makes the controller's pod webhook add its readiness gate to the pods
# here: a new pod is Ready only once its ALB target is healthy, so a rollout never leaves the ALB
# without a healthy target (kubernetes-sigs/aws-load-balancer-controller v3.5.0
# docs/deploy/pod_readiness_gate.md; eks-charts chart 3.5.0 templates/webhook.yaml, the pod
# webhook's namespaceSelector ``elbv2.k8s.aws/pod-readiness-gate-inject In [enabled]``; IP targets only).
READINESS_GATE_LABEL = {"elbv2.k8s.aws/pod-readiness-gate-inject": "enabled"}
# A stopping pod keeps serving while the ALB deregisters it (it learns of the pod's end through the
# EndpointSlice, after the pod is already terminating): sleep before SIGTERM. The ``sleep`` action
# needs no binary in the image (Kubernetes "Container Lifecycle Hooks": Sleep, on by default since
# 1.30; every KUBERNETES_VERSIONS entry is newer).
PRESTOP_SLEEP_S = 15
TERMINATION_GRACE_S = 45


def namespace_with_readiness_gate() -> dict:
    """The namespace where the self-managed controller serves it (Auto Mode runs no pod webhook)."""
    ns = namespace()
    ns["metadata"]["labels"].update(READINESS_GATE_LABEL)
    return ns


def oidc_secret_reader_role() -> dict:
    """The controller reads the OIDC client Secret of an Ingress itself, uncached, when it builds the
    ALB's authenticate action (aws-load-balancer-controller v3.5.0 pkg/ingress/model_build_actions.go
    ``secretsManager.GetSecret``; pkg/config/runtime_config.go ``DisableFor: Secret``; pkg/k8s/
    secrets_manager.go watches each Secret it uses). Its chart grants Secrets only with
    ``clusterSecretsPermissions.allowAllSecrets`` (default false, templates/rbac.yaml, chart 3.5.0
    values.yaml recommends a namespaced Role instead): this Role, on that one Secret only."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(OIDC_SECRET_READER),
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [OIDC_SECRET], "verbs": ["get", "list", "watch"]}],
    }


def oidc_secret_reader_binding(controller_namespace: str, controller_service_account: str) -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(OIDC_SECRET_READER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OIDC_SECRET_READER},
        "subjects": [{"kind": "ServiceAccount", "name": controller_service_account, "namespace": controller_namespace}],
    }


# EKS Auto Mode's load balancer controller runs on the control plane as the service-linked role
# AWSServiceRoleForAmazonEKS, whose managed access policy "does not currently grant get on Secret
# objects"; its auto-created access entry declares the Kubernetes group eks:managed, and the guide's
# grant is a Role of exactly get on the named OIDC Secret, in the Secret's namespace, bound to
# ``kind: Group, name: eks:managed`` (awsdocs/amazon-eks-user-guide latest/ug/automode/
# auto-managed-rbac-example.adoc, "Grant the EKS Auto Mode load balancer controller access to a
# specific Secret", Step 2; auto-managed-rbac.adoc: the group "applies to all EKS Auto Mode managed
# controllers", so scope it by resourceNames and a namespaced Role).
AUTO_MODE_SECRET_READER = "eks-managed-reads-portal-oidc"
AUTO_MODE_MANAGED_GROUP = "eks:managed"


def auto_mode_oidc_secret_reader_role() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(AUTO_MODE_SECRET_READER),
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [OIDC_SECRET], "verbs": ["get"]}],
    }


def auto_mode_oidc_secret_reader_binding() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(AUTO_MODE_SECRET_READER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": AUTO_MODE_SECRET_READER},
        "subjects": [{"kind": "Group", "name": AUTO_MODE_MANAGED_GROUP, "apiGroup": "rbac.authorization.k8s.io"}],
    }


def oidc_secret_readers(*, auto_mode: bool, controller_namespace: str, controller_service_account: str) -> list[dict]:
    """Who may read the OIDC client Secret, the ALB's controller of this mode only: in Auto Mode the
    group ``eks:managed`` (get), else the self-managed controller's service account."""
    if auto_mode:
        return [auto_mode_oidc_secret_reader_role(), auto_mode_oidc_secret_reader_binding()]
    return [oidc_secret_reader_role(), oidc_secret_reader_binding(controller_namespace, controller_service_account)]


def service_account() -> dict:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(NAME)}


def impersonator_role(teams: list[str]) -> dict:
    if not teams:
        raise ValueError("the portal's impersonation role needs at least one team")
    rules = [
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": [portal_user(t) for t in teams]},
        {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"], "resourceNames": [team_group(t) for t in teams]},
        {"apiGroups": ["authentication.k8s.io"], "resources": [f"userextras/{SUBJECT_EXTRA}"], "verbs": ["impersonate"]},
    ]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": _meta(IMPERSONATOR, namespaced=False), "rules": rules}


def impersonator_binding() -> dict:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": _meta(IMPERSONATOR, namespaced=False),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": IMPERSONATOR},
        "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": PORTAL_NAMESPACE}],
    }


def settings_document(portal: PortalSettings, *, region: str, signer: str, namespaces: dict[str, str], quotas: dict[str, int | None]) -> dict[str, Any]:
    """What the portal reads at start (trainctl/portal/__main__.py settings_of)."""
    return {
        "region": region, "signer": signer, "apiBearerTokens": portal.api_bearer_tokens,
        "teams": {t: {"namespace": namespaces[t], "groups": list(login.groups), "emails": [e.lower() for e in login.emails], "gpuQuota": quotas.get(t)} for t, login in portal.teams.items()},
    }


def config_map(document: Any) -> dict:
    """``document``: the settings' JSON text (a string, or a Pulumi output of one)."""
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(NAME), "data": {CONFIG_KEY: document}}


def oidc_secret(client_id: Any, client_secret: Any) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(OIDC_SECRET), "type": "Opaque", "stringData": {"clientID": client_id, "clientSecret": client_secret}}


RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}


def deployment(image: Any, config_hash: Any) -> dict:
    """``config_hash``: of the settings document (a string or a Pulumi output), so a change rolls the pod."""
    pod = {
        "serviceAccountName": NAME, "automountServiceAccountToken": True, "enableServiceLinks": False, "terminationGracePeriodSeconds": TERMINATION_GRACE_S,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "nodeSelector": {NODE_ROLE_LABEL: "system"},
        "containers": [{
            "name": NAME, "image": image, "args": ["--config", f"/etc/portal/{CONFIG_KEY}", "--port", str(PORT)],
            "ports": [{"name": "http", "containerPort": PORT}],
            "env": [{"name": "TMPDIR", "value": "/tmp"}],
            "securityContext": dict(RESTRICTED_CONTAINER),
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
            "readinessProbe": {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 10},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": PORT}, "periodSeconds": 20},
            "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_S}}},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/portal", "readOnly": True}, {"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "config", "configMap": {"name": NAME}}, {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}],
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(NAME),
        "spec": {"replicas": 1, "selector": {"matchLabels": dict(LABELS)}, "template": {"metadata": {"labels": dict(LABELS), "annotations": {"training-platform/config-hash": config_hash}}, "spec": pod}},
    }


def service() -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(NAME), "spec": {"selector": dict(LABELS), "ports": [{"name": "http", "port": 80, "targetPort": PORT}]}}


def ingresses(portal: PortalSettings, *, lb_name: str) -> list[dict]:
    """The pages (login required) and the API (identity when signed in, else a bearer token), one ALB."""
    oidc = {
        "issuer": portal.issuer, "authorizationEndpoint": portal.authorization_endpoint, "tokenEndpoint": portal.token_endpoint, "userInfoEndpoint": portal.user_info_endpoint,
        "secretName": OIDC_SECRET,
    }
    common = {
        "alb.ingress.kubernetes.io/group.name": lb_name, "alb.ingress.kubernetes.io/load-balancer-name": lb_name, "alb.ingress.kubernetes.io/scheme": "internet-facing",
        "alb.ingress.kubernetes.io/target-type": "ip", "alb.ingress.kubernetes.io/listen-ports": json.dumps([{"HTTPS": 443}]),
        "alb.ingress.kubernetes.io/certificate-arn": portal.certificate_arn, "alb.ingress.kubernetes.io/healthcheck-path": "/healthz",
        "alb.ingress.kubernetes.io/auth-type": "oidc", "alb.ingress.kubernetes.io/auth-idp-oidc": json.dumps(oidc, sort_keys=True),
        "alb.ingress.kubernetes.io/auth-scope": portal.scope,
        # X-Forwarded-For "append" pinned (the ALB's default; ELB User Guide, "HTTP headers and Application
        # Load Balancers": append, preserve or remove): the portal counts key fetches by the right-most
        # entry, the one the ALB appends (trainctl/portal/identity.py forwarded_source)
        "alb.ingress.kubernetes.io/load-balancer-attributes": XFF_ATTRIBUTE,
    }
    out = []
    for name, path, unauthenticated, order in ((f"{NAME}-api", "/api", "allow", "1"), (NAME, "/", "authenticate", "2")):
        annotations = {**common, "alb.ingress.kubernetes.io/auth-on-unauthenticated-request": unauthenticated, "alb.ingress.kubernetes.io/group.order": order}
        if name == NAME:  # exclusive across the group: on one Ingress only
            annotations["alb.ingress.kubernetes.io/inbound-cidrs"] = ",".join(portal.inbound_cidrs)
        out.append({
            "apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {**_meta(name), "annotations": annotations},
            "spec": {"ingressClassName": ALB_CLASS, "rules": [{"host": portal.host, "http": {"paths": [{"path": path, "pathType": "Prefix", "backend": {"service": {"name": NAME, "port": {"number": 80}}}}]}}]},
        })
    return out


def network_policy(alb_cidrs: list[Any]) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(NAME),
        "spec": {
            "podSelector": {"matchLabels": dict(LABELS)}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"ipBlock": {"cidr": c}} for c in alb_cidrs], "ports": [{"protocol": "TCP", "port": PORT}]}],
            "egress": [{"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}, {"ports": [{"protocol": "TCP", "port": 443}]}],
        },
    }


def auto_mode_ingress_class(portal: PortalSettings) -> list[dict]:
    """EKS Auto Mode: the class the Ingresses name, served by Auto Mode's own load balancing."""
    params = {"apiVersion": "eks.amazonaws.com/v1", "kind": "IngressClassParams", "metadata": _meta(ALB_CLASS, namespaced=False), "spec": {"scheme": "internet-facing", "certificateARNs": [portal.certificate_arn]}}
    cls = {"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": _meta(ALB_CLASS, namespaced=False),
           "spec": {"controller": AUTO_MODE_CONTROLLER, "parameters": {"apiGroup": "eks.amazonaws.com", "kind": "IngressClassParams", "name": ALB_CLASS}}}
    return [params, cls]
