"""training-platform: an EKS platform for distributed GPU training on Kubeflow Trainer v2.

Reads like a table of contents: config -> settings -> AWS components -> Kubernetes objects.
"""

import pulumi

from config.deploy_rules import OFFLINE_NOTICE, deploy_problems
from config.effect_rules import spot_advice
from config.portal_models import portal_advice
from config.schema import ConfigError, ConfigErrors
from config.settings import job_grace_periods, load_settings
from infra.alarms import Alarms
from infra.cluster import Cluster
from infra.deploy_state import TRAINER_VERSION, parameter_name, read_parameter, trainer_switch_error
from infra.gpu_aws import GpuAws
from infra.network import Network
from infra.node_health import NodeHealth
from infra.project_config import aws_region, offline_render, project_config, secret_config_keys
from infra.registry import ImageMirror, TrainingImage
from infra.storage import CheckpointStorage
from k8s.gpu_capacity import GpuCapacity
from k8s.kueue import Kueue
from k8s.observability import Observability
from k8s.tenants import Tenants
from k8s.trainer import Trainer
from workloads.builders.trainjobs import WORKLOADS
from workloads.trainjobs import PLATFORM_OUTPUT, TrainJobs

try:
    settings = load_settings(project_config(), stack=pulumi.get_stack(), region=aws_region(), secret_keys=secret_config_keys())
    # what the last deploy installed decides whether a Trainer switch is allowed (docs/trainer-upgrade.md)
    installed = read_parameter(parameter_name(settings.cluster_name, TRAINER_VERSION))
    if problem := trainer_switch_error(installed=installed, wanted=settings.trainer.version, allow_upgrade_from=settings.trainer.allow_upgrade_from):
        raise ConfigError("trainer.version", settings.trainer.version, problem)
    # what only a real account or cluster refuses: refused by pulumi up/preview, said once offline
    if (for_deploy := deploy_problems(settings)) and not offline_render():
        raise ConfigErrors(for_deploy)
except ConfigError as err:  # nothing has been registered yet
    raise pulumi.RunError(str(err)) from None

if for_deploy:  # kept offline (the render, the local control plane): said once, every key named
    pulumi.log.warn(OFFLINE_NOTICE + "; ".join(f"{p.key} ({p.allowed.split(';')[0]})" for p in for_deploy))

for gap in settings.fact_gaps():  # facts the table lacks for this Region: said once, not refused
    pulumi.log.warn(gap)
for advice in [*spot_advice(settings), *portal_advice(settings.portal)]:  # valid, but said, not refused (spot's cost to a job, a world-open portal)
    pulumi.log.warn(advice)

tags = {"project": "training-platform", "stack": settings.stack, "managed-by": "pulumi"}

network = Network("net", settings=settings.network, cluster_name=settings.cluster_name, tags=tags, required_zones=settings.pinned_zones())
cluster = Cluster("eks", settings=settings, network=network, tags=tags)
gpu_aws = GpuAws("gpu", settings=settings, cluster=cluster, vpc_id=network.vpc_id, tags=tags)
# bad GPU nodes found (the node monitoring agent) and replaced (Karpenter's node repair)
node_health = NodeHealth("node-health", settings=settings, cluster=cluster)
capacity = GpuCapacity("gpu", settings=settings, gpu_aws=gpu_aws, cluster_name=cluster.name, provider=cluster.provider, tags=tags)
# the Docker Hub images the platform names by default, copied into the stack's ECR (nodes behind one NAT address
# share Docker Hub's anonymous pull limit); its objects name the copies
images = ImageMirror("images", cluster_name=settings.cluster_name, tags=tags)
trainer = Trainer("trainer", settings=settings.trainer, cluster_name=cluster.name, provider=cluster.provider, depends_on=capacity.node_pools, job_graces=job_grace_periods(settings), images=images)
# Kueue queues the teams' and the stack's TrainJobs (one cohort); teams get namespaces, quotas and access
kueue = Kueue("kueue", settings=settings, trainer=trainer, provider=cluster.provider) if settings.kueue_enabled else None
# metrics, logs and dashboard (observability.mode), the GPU smoke check, cleanup of finished TrainJobs
keep_kinds = sorted(w.kind for w in WORKLOADS.values())  # the platform's own job kinds: the hourly cleanup keeps them
observability = Observability("observability", settings=settings, cluster=cluster, gpu_aws=gpu_aws, capacity=capacity, trainer=trainer, tags=tags, images=images, keep_kinds=keep_kinds)
# failed and stalled TrainJobs, idle GPUs and nodes not ready, on an SNS topic (prometheus mode: alert rules)
if observability.cloudwatch is not None and settings.observability.alarms.enabled:
    alarms = Alarms("alarms", settings=settings, cluster_name=cluster.name, log_groups=observability.cloudwatch.log_groups, tags=tags)
    pulumi.export("alarmTopic", alarms.topic.arn)
storage = CheckpointStorage("checkpoints", settings=settings, cluster=cluster, network=network, node_role_arns=[*cluster.node_role_arns, *gpu_aws.node_role_arns], tags=tags) if settings.trainjobs.jobs() or settings.tenants.teams() else None
# the training image is built (workloads/ -> the stack's ECR repository) unless every job brings its own
training_image = TrainingImage("workloads", cluster_name=settings.cluster_name, tags=tags) if storage and any(j.image is None for j in settings.trainjobs.jobs().values()) else None
if storage and settings.tenants.teams():
    tenants = Tenants("tenants", settings=settings, cluster=cluster, storage=storage, kueue=kueue, provider=cluster.provider, tags=tags, image=training_image.ref if training_image else None, pod_identity_agent=gpu_aws.pod_identity_agent, endpoint_ips=network.endpoint_ips)
    pulumi.export("teamNamespaces", tenants.namespaces)
if settings.portal.enabled:  # the teams' portal behind an ALB with OIDC login (its teams are tenants: checked by the config)
    from k8s.portal import Portal

    portal = Portal("portal", settings=settings, cluster=cluster, network=network, gpu_aws=gpu_aws, provider=cluster.provider, tags=tags)
    pulumi.export("portalUrl", portal.url)
if storage and settings.trainjobs.jobs():
    jobs = TrainJobs("jobs", settings=settings, trainer=trainer, storage=storage, capacity=capacity.node_pools, provider=cluster.provider, image=training_image.ref if training_image else None, kueue=kueue, images=images)
    pulumi.export("trainJobs", jobs.names)
    if training_image:
        pulumi.export("trainingImage", training_image.ref)
    # what a TrainJob stack (workloads/, a StackReference to this stack) runs its run with
    pulumi.export(PLATFORM_OUTPUT, jobs.platform_document(training_image.ref if training_image else None, images.refs))

pulumi.export("clusterName", cluster.name)
pulumi.export("kubeconfig", cluster.kubeconfig)
pulumi.export("vpcId", network.vpc_id)
pulumi.export("privateSubnetIds", network.private_subnet_ids)
pulumi.export("publicSubnetIds", network.public_subnet_ids)
pulumi.export("nodeGroupNames", cluster.node_group_names)
