"""The teams' portal in the cluster (``portal.enabled``): its image (portal/Dockerfile, built and
pushed to the stack's ECR like the training image), its Kubernetes objects (k8s/builders/portal.py), and
what serves its Ingresses: the AWS Load Balancer Controller (pinned chart, the IAM policy of its
release, a Pod Identity role as Karpenter's controller has) where the GPU pool is self-managed, and
Auto Mode's own load balancing (an IngressClass of ``eks.amazonaws.com/alb``) in Auto Mode.

Its type string says ``infra`` as it did before the folders were arranged by side: a component's
type is part of every child's URN, so renaming it would replace the deployed resources."""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Any

import pulumi
import pulumi_aws as aws

import versions
from config.labels import NODE_ROLE_LABEL
from config.names import ECR_REPOSITORY
from config.settings import Settings, subnet_plan
from infra.project_config import config_secret
from infra.registry import PLATFORM, _repository, content_tag, context_modes, pushed_image, repository_name
from k8s import helm
from k8s.builders import portal as mp
from k8s.resources import apply_manifest

PROJECT_DIR = pathlib.Path(__file__).resolve().parent.parent
DOCKERFILE = "portal/Dockerfile"
IAM_POLICY = PROJECT_DIR / "config" / "alb_controller_iam_policy.json"
ALB_CONTROLLER_NAMESPACE = "kube-system"
ALB_CONTROLLER_SERVICE_ACCOUNT = "aws-load-balancer-controller"
KEEP_IMAGES = 10


def image_sources() -> dict[str, bytes]:
    """The files the portal's Dockerfile copies (its dockerignore's allow list), by path."""
    allowed = [line[1:] for line in (PROJECT_DIR / "portal/Dockerfile.dockerignore").read_text().splitlines() if line.startswith("!")]
    out: dict[str, bytes] = {DOCKERFILE: (PROJECT_DIR / DOCKERFILE).read_bytes()}
    for rel in allowed:
        path = PROJECT_DIR / rel
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
        for f in files:
            out[f.relative_to(PROJECT_DIR).as_posix()] = f.read_bytes()
    return out


def image_tag() -> str:
    """The tag of the portal's image: :func:`infra.registry.content_tag` of the files it copies (with
    their portable modes), its build args and its build settings, as the training image's."""
    files = image_sources()
    return content_tag(files, build_args(), context_modes(PROJECT_DIR, files), {"context": ".", "dockerfile": DOCKERFILE, "platforms": PLATFORM, "push": True, "pull": False, "buildOnPreview": False})


def portal_repository_name(cluster_name: str) -> str:
    """``<cluster>/portal`` as it always was when that is a valid ECR name (a stack's repository
    keeps its name: a new name replaces it), else normalised as every repository of the stack is
    (infra/registry.py ``_base``): capitals (``Train`` and ``train`` would share one repository)
    or separators ECR refuses."""
    plain = f"{cluster_name}/portal"
    return plain if ECR_REPOSITORY.fits(plain) else repository_name(cluster_name, "portal", sep="/")


def build_args() -> dict[str, str]:
    return {"BASE_IMAGE": versions.PORTAL_BASE_IMAGE, "PORTAL_UID": versions.PORTAL_UID}


def alb_cidrs_of(s: Settings, invoke: pulumi.InvokeOptions) -> list[Any]:
    """Where the portal's pods may be reached from: the public subnets, which hold an internet-facing
    ALB's network interfaces (the controller places it in subnets tagged kubernetes.io/role/elb),
    not the whole VPC, whose hosts and pods could otherwise set the forwarding headers the key-fetch
    budget counts by. A new VPC's public subnets by their planned CIDRs; an existing VPC's by the
    subnets given, or its whole CIDR when none are given (the controller then finds them by tag)."""
    net = s.network
    if not net.vpc_id:
        return list(subnet_plan(net.cidr, net.az_count)[1])
    if net.public_subnet_ids:
        return [aws.ec2.get_subnet_output(id=sid, opts=invoke).cidr_block for sid in net.public_subnet_ids]
    return [aws.ec2.get_vpc_output(id=net.vpc_id, opts=invoke).cidr_block]


def alb_controller_policy() -> str:
    text = IAM_POLICY.read_text()
    if hashlib.sha256(text.encode()).hexdigest() != versions.ALB_CONTROLLER_IAM_POLICY_SHA256:
        raise pulumi.RunError(f"{IAM_POLICY.name} is not the file of {versions.ALB_CONTROLLER_IAM_POLICY_SOURCE} (its SHA-256 differs): fetch it again from there")
    return json.dumps(json.loads(text))


def alb_controller_values(cluster_name: Any, region: str, vpc_id: Any) -> dict[str, Any]:
    """The chart's values (helm/aws-load-balancer-controller/values.yaml at v3.5.0: clusterName, region,
    vpcId, serviceAccount.name, nodeSelector; it creates the IngressClass ``alb``).

    ``enableServiceMutatorWebhook: false``: by default (true) the chart registers a webhook on every
    Service CREATE of the cluster with ``serviceMutatorWebhookConfig.failurePolicy: Fail`` (chart
    3.5.0 values.yaml, templates/webhook.yaml), so while the controller is down no Service could be
    made, the JobSets' per-job headless Services among them. It only makes this controller the
    default for Services of type LoadBalancer, and the stack creates none."""
    return {
        "clusterName": cluster_name, "region": region, "vpcId": vpc_id, "serviceAccount": {"create": True, "name": ALB_CONTROLLER_SERVICE_ACCOUNT},
        "nodeSelector": {NODE_ROLE_LABEL: "system"}, "enableServiceMutatorWebhook": False,
    }


class Portal(pulumi.ComponentResource):
    def __init__(self, name: str, *, settings: Any, cluster: Any, network: Any, gpu_aws: Any, provider: Any, tags: dict[str, str], opts: pulumi.ResourceOptions | None = None):
        super().__init__("training-platform:infra:Portal", name, None, opts)
        s = settings
        portal = s.portal
        child = pulumi.ResourceOptions(parent=self)
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=provider)
        lb_name = mp.load_balancer_name(s.cluster_name)
        ident = aws.get_caller_identity_output(opts=pulumi.InvokeOptions(parent=self))
        partition = aws.get_partition_output(opts=pulumi.InvokeOptions(parent=self))
        signer = pulumi.Output.all(partition.partition, ident.account_id).apply(lambda a: mp.signer_prefix(a[0], s.region, a[1], lb_name))
        teams = list(portal.teams)
        namespaces = {t: s.tenants.namespace_of(t) for t in teams}
        quotas = {t: s.tenants.teams()[t].gpu_quota for t in teams}
        document = signer.apply(lambda sg: json.dumps(mp.settings_document(portal, region=s.region, signer=sg, namespaces=namespaces, quotas=quotas), sort_keys=True))
        config_hash = document.apply(lambda d: hashlib.sha256(d.encode()).hexdigest()[:16])

        # the image, by the rule of every image the stack pushes (infra/registry.py pushed_image)
        repo_name, tag = portal_repository_name(s.cluster_name), image_tag()
        repository = _repository(f"{name}-image", repo_name, tags, KEEP_IMAGES, self, current=tag)
        self.image_ref = pushed_image(f"{name}-image", repository=repository, repository_name=repo_name, tag=tag, context=".", dockerfile=DOCKERFILE,
                                      build_args=build_args(), cluster_name=s.cluster_name, kind="portal", tags=tags, parent=self)

        # what serves the Ingresses
        serves: list[pulumi.Resource] = []
        if s.gpu_pool.mode == "auto":
            serves += [apply_manifest(m, k8s_opts) for m in mp.auto_mode_ingress_class(portal)]
        else:
            role = aws.iam.Role(f"{name}-alb-controller", assume_role_policy=_pod_identity_trust(), tags=tags, opts=child)
            policy = aws.iam.Policy(f"{name}-alb-controller", policy=alb_controller_policy(), tags=tags, opts=child)
            attach = aws.iam.RolePolicyAttachment(f"{name}-alb-controller", role=role.name, policy_arn=policy.arn, opts=child)
            assoc = aws.eks.PodIdentityAssociation(
                f"{name}-alb-controller", cluster_name=cluster.eks_cluster.eks_cluster.name, namespace=ALB_CONTROLLER_NAMESPACE, service_account=ALB_CONTROLLER_SERVICE_ACCOUNT,
                role_arn=role.arn, opts=pulumi.ResourceOptions(parent=self, depends_on=[gpu_aws.pod_identity_agent]),
            )
            serves.append(helm.release(
                "aws-load-balancer-controller", chart=versions.ALB_CONTROLLER_CHART, repo=versions.ALB_CONTROLLER_CHART_REPO, version=versions.ALB_CONTROLLER_VERSION,
                namespace=ALB_CONTROLLER_NAMESPACE, values=alb_controller_values(cluster.eks_cluster.eks_cluster.name, s.region, network.vpc_id),
                opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[attach, assoc]),
            ))

        alb_cidrs = alb_cidrs_of(s, pulumi.InvokeOptions(parent=self))
        # after what serves the Ingresses: with the readiness gate label, the controller's pod webhook
        # (failurePolicy Fail in chart 3.5.0 templates/webhook.yaml) must be up before the portal's pod is made
        self_managed = s.gpu_pool.mode != "auto"
        ns = apply_manifest(mp.namespace_with_readiness_gate() if self_managed else mp.namespace(), pulumi.ResourceOptions(parent=self, provider=provider, depends_on=serves))
        in_ns = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns, *serves])
        objs = [
            mp.service_account(), mp.impersonator_role(teams), mp.impersonator_binding(), mp.config_map(document),
            mp.service(), mp.network_policy(alb_cidrs),
        ]
        # the controller reads the OIDC Secret: the chart's service account, or Auto Mode's group eks:managed
        objs += mp.oidc_secret_readers(auto_mode=not self_managed, controller_namespace=ALB_CONTROLLER_NAMESPACE, controller_service_account=ALB_CONTROLLER_SERVICE_ACCOUNT)
        made = [apply_manifest(m, in_ns) for m in objs]
        # the client secret: a Pulumi secret in the state (the Secret's stringData marked so)
        made.append(apply_manifest(mp.oidc_secret(portal.client_id, config_secret(portal.client_secret or "")), pulumi.ResourceOptions.merge(in_ns, pulumi.ResourceOptions(additional_secret_outputs=["stringData", "data"]))))
        deployment = apply_manifest(mp.deployment(self.image_ref, config_hash), pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns, *made, *serves]))
        for m in mp.ingresses(portal, lb_name=lb_name):
            apply_manifest(m, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[ns, deployment, *made, *serves]))
        self.url = f"https://{portal.host}/"
        self.register_outputs({"url": self.url, "image": self.image_ref})


def _pod_identity_trust() -> str:
    from infra.gpu_aws import pod_identity_trust

    return pod_identity_trust()
