"""Every external version the platform deploys, in one place.

Python packages are pinned in ``requirements.txt`` (tooling) and ``workloads/requirements.txt``
(the training image); everything that runs in the cluster is pinned here.
"""

# EKS
KUBERNETES_VERSIONS = ("1.32", "1.33", "1.34", "1.35")
DEFAULT_KUBERNETES_VERSION = "1.34"
# CoreDNS managed add-on per Kubernetes version: the EKS User Guide's "CoreDNS versions" table
# (Manage CoreDNS for DNS in Amazon EKS clusters, read Nov 2026). That table stops at 1.34; 1.35
# keeps the 1.34 pin until EKS lists one (check `aws eks describe-addon-versions --addon-name
# coredns --kubernetes-version 1.35` before moving a stack to 1.35).
COREDNS_ADDON_VERSIONS = {
    "1.32": "v1.11.4-eksbuild.24",
    "1.33": "v1.12.4-eksbuild.1",
    "1.34": "v1.12.4-eksbuild.1",
    "1.35": "v1.12.4-eksbuild.1",
}
# AL2023 AMI alias for Karpenter GPU nodes (EC2NodeClass amiSelectorTerms alias). Pinned, not @latest.
GPU_NODE_AMI_ALIAS = "al2023@v20261105"

# Karpenter (self-managed mode)
KARPENTER_CHART = "oci://public.ecr.aws/karpenter/karpenter"
KARPENTER_VERSION = "1.14.1"

# Device plugins
NVIDIA_DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
NVIDIA_DEVICE_PLUGIN_CHART = "nvidia-device-plugin"
NVIDIA_DEVICE_PLUGIN_VERSION = "0.20.0"
EFA_DEVICE_PLUGIN_REPO = "https://aws.github.io/eks-charts"
EFA_DEVICE_PLUGIN_CHART = "aws-efa-k8s-device-plugin"
EFA_DEVICE_PLUGIN_VERSION = "0.5.30"

# Kubeflow Trainer: chart version per supported release, and the JobSet each bundles.
TRAINER_CHART = "oci://ghcr.io/kubeflow/charts/kubeflow-trainer"
TRAINER_VERSIONS = {
    "v2.3.0": {"chart": "2.3.0", "jobset": "v0.12.0"},
    "v2.1.0": {"chart": "2.1.0", "jobset": "v0.10.1"},
}
DEFAULT_TRAINER_VERSION = "v2.3.0"
# The Trainer's dataset/model initializer images, tagged like the release that ships them
# (kubeflow/trainer v2.1.0 manifests/overlays/runtimes/kustomization.yaml `newTag: v2.1.0`; v2.3.0
# charts/kubeflow-trainer/files/runtimes/*.yaml use `trainer.defaultImageTag`, "v" + chart version).
# Both are built for linux/amd64 and linux/arm64 (.github/workflows/build-and-push-images.yaml).
INITIALIZER_IMAGES = {
    version: {
        "dataset": f"ghcr.io/kubeflow/trainer/dataset-initializer:{version}",
        "model": f"ghcr.io/kubeflow/trainer/model-initializer:{version}",
    }
    for version in TRAINER_VERSIONS
}
# v2.1.0 shipped a staging JobSet image that no longer resolves; pin the release image.
JOBSET_IMAGE_REPOSITORY = "registry.k8s.io/jobset/jobset"

# Kueue (job queueing for teams and the stack's jobs; k8s/builders/kueue.py). 0.19.2 is the newest release
# (tagged 2026-08-20) and the CRDs the offline validation reads (../shared/schemas/kueue/v0.19.2).
# Its TrainJob integration writes into TrainJob.spec.runtimePatches: Trainer v2.2 or newer only.
# The chart's values.yaml names a staging image unless packaged for release: the image is pinned.
KUEUE_CHART = "oci://registry.k8s.io/kueue/charts/kueue"
KUEUE_VERSION = "0.19.2"
KUEUE_IMAGE_REPOSITORY = "registry.k8s.io/kueue/kueue"
# One-shot Jobs that hand checkpoint directories to the non-root training user (k8s/builders/volume_setup.py).
VOLUME_SETUP_IMAGE = "public.ecr.aws/docker/library/busybox:1.37.0"

# EKS add-ons for checkpoint storage (CSI drivers); versions as published for EKS 1.34.
FSX_CSI_ADDON_VERSION = "v1.7.0-eksbuild.1"
EFS_CSI_ADDON_VERSION = "v2.1.13-eksbuild.1"
POD_IDENTITY_ADDON_VERSION = "v1.3.9-eksbuild.3"
# Node health (infra/node_health.py): the eks-node-monitoring-agent add-on (github.com/aws/
# eks-node-monitoring-agent v1.7.0, 2026-08-04, the newest release) sets the node conditions
# AcceleratedHardwareReady (NVIDIA Xid, DCGM), KernelReady, NetworkingReady, StorageReady and
# ContainerRuntimeReady that Karpenter's node repair acts on. Confirm the build with `aws eks
# describe-addon-versions --addon-name eks-node-monitoring-agent --kubernetes-version 1.34`.
NODE_MONITORING_AGENT_ADDON_VERSION = "v1.7.0-eksbuild.1"

# Observability (infra/observability.py, k8s/builders/operations.py), observability.mode:
# cloudwatch (default): the amazon-cloudwatch-observability EKS add-on. Its versions are the
# releases of aws-observability/helm-charts charts/amazon-cloudwatch-observability with an
# -eksbuild suffix; v6.4.0 (Chart.yaml version 6.4.0, released 2026-08-06) is the newest. The add-on
# runs on EKS 1.23 and later (CloudWatch User Guide, "Install the CloudWatch agent with the Amazon
# CloudWatch Observability EKS add-on or the Helm chart"), so on every KUBERNETES_VERSIONS entry;
# Pod Identity needs add-on 3.1.0 or later, NVIDIA GPU metrics 1.3.0, EFA metrics come with enhanced
# observability. Confirm the build for a cluster version with `aws eks describe-addon-versions
# --addon-name amazon-cloudwatch-observability --kubernetes-version 1.34` before a deploy.
CLOUDWATCH_OBSERVABILITY_ADDON_VERSION = "v6.4.0-eksbuild.1"
# prometheus: NVIDIA's dcgm-exporter chart (NVIDIA/dcgm-exporter deployment/Chart.yaml 4.8.2,
# kubeVersion >= 1.19, image 4.5.3-4.8.2-distroless) and kube-prometheus-stack
# (prometheus-community/helm-charts charts/kube-prometheus-stack/Chart.yaml 88.5.3, operator
# v0.93.1, kubeVersion >= 1.25): both cover KUBERNETES_VERSIONS.
DCGM_EXPORTER_REPO = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DCGM_EXPORTER_CHART = "dcgm-exporter"
DCGM_EXPORTER_VERSION = "4.8.2"
KUBE_PROMETHEUS_STACK_REPO = "https://prometheus-community.github.io/helm-charts"
KUBE_PROMETHEUS_STACK_CHART = "kube-prometheus-stack"
KUBE_PROMETHEUS_STACK_VERSION = "88.5.3"
# The CronJob that deletes finished TrainJobs (k8s/pods/trainjob_cleanup.py runs on the standard
# library only) and the GPU smoke check (CUDA + PyTorch: the training image's base, WORKLOAD_BASE_IMAGE).
TRAINJOB_CLEANUP_IMAGE = "public.ecr.aws/docker/library/python:3.13.7-slim-bookworm"

# Training image: the stack builds workloads/Dockerfile and pushes it to its own ECR repository
# (infra/registry.py) unless every enabled job sets trainjobs.<job>.image. These are the
# Dockerfile's build args (`make image` passes the same ones); they are part of the image tag.
# EFA installer 1.51.0 (EC2 User Guide, "Elastic Fabric Adapter release notes", released
# Oct 22 2026) bundles libfabric 2.7.0amzn2.0 and the Amazon OFI NCCL plugin (aws-ofi-nccl)
# 1.22.0; the Dockerfile checks that the installed packages are these.
WORKLOAD_BASE_IMAGE = "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime"  # CUDA 12.8: sm_90 (p5) and sm_89 (g6e)
EFA_INSTALLER_VERSION = "1.51.0"
LIBFABRIC_VERSION = "2.7.0amzn2.0"
AWS_OFI_NCCL_VERSION = "1.22.0"
WORKLOAD_UID = "1000"  # the image's non-root user; the runtimes' trainer pods run as it (k8s/builders/runtimes.py)
WORKLOAD_BUILD_ARGS = {
    "BASE_IMAGE": WORKLOAD_BASE_IMAGE,
    "EFA_INSTALLER_VERSION": EFA_INSTALLER_VERSION,
    "LIBFABRIC_VERSION": LIBFABRIC_VERSION,
    "AWS_OFI_NCCL_VERSION": AWS_OFI_NCCL_VERSION,
    "TRAINING_UID": WORKLOAD_UID,
}

# Default images of the ClusterTrainingRuntimes (a TrainJob sets its own image). The cluster never pulls
# a Docker Hub image (pytorch/pytorch, tensorflow/tensorflow, WORKLOAD_BASE_IMAGE for the smoke check):
# Docker Hub limits anonymous pulls per IPv4 address and every node behind one NAT address shares the
# limit, and these are not Docker official images, so not under ECR Public's docker/library. The stack
# copies each into its own ECR at deploy (infra/registry.py ImageMirror) and its objects name the copy.
TORCH_RUNTIME_IMAGE = "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime"
DEEPSPEED_RUNTIME_IMAGE = "ghcr.io/kubeflow/trainer/deepspeed-runtime:v2.3.0"
# TensorFlow 2.20.0: the CPU build of the same release (tensorflow-cpu) is what workloads/requirements-tf.txt
# pins for the local emulation of the TF job (a test keeps the two versions equal).
TENSORFLOW_RUNTIME_IMAGE = "tensorflow/tensorflow:2.20.0-gpu"

# Local control plane (tools/cluster: `make cluster-up`, the e2e tests). Every component is built from
# its released Go module (the Go module proxy) at these versions and cached per version under
# ~/.cache/training-platform (or $TRAINING_PLATFORM_CACHE).
# kube-apiserver, kube-controller-manager, kube-scheduler per EKS minor (the stack's cluster.version):
# k8s.io/kubernetes at a patch release of that minor, built from a module of ours that replaces every
# k8s.io/* staging module with its matching v0.<minor>.<patch> release.
LOCAL_KUBERNETES_RELEASES = {"1.32": "v1.32.13", "1.33": "v1.33.13", "1.34": "v1.34.4", "1.35": "v1.35.4"}
# etcd: built from its server module (our own main calling etcdmain.Main). Debian's etcd-server
# 3.4.23 serves the API server too, but below 3.4.31 the API server turns off RequestWatchProgress
# (etcd-io/etcd#15220), and client-go 0.36's streaming watches (kwok's) then fail: pods are missed.
# The 3.6 line is the one Kubernetes 1.34 is built against.
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
ETCD_VERSION = "v3.6.16"
# The Trainer controller per TRAINER_VERSIONS entry and the JobSet controller that release depends on
# (github.com/kubeflow/trainer/v2 go.mod requires sigs.k8s.io/jobset at TRAINER_VERSIONS[v]["jobset"]).
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"
KUEUE_MODULE = "sigs.k8s.io/kueue"
# Karpenter's core with its kwok cloud provider (sigs.k8s.io/karpenter/kwok): the core release that
# karpenter-provider-aws KARPENTER_VERSION is built on.
KARPENTER_CORE_MODULE = "sigs.k8s.io/karpenter"
KARPENTER_CORE_VERSION = "v" + KARPENTER_VERSION
# kwok: simulated nodes and pods (Ready, then run to completion).
KWOK_MODULE = "sigs.k8s.io/kwok"
KWOK_VERSION = "v0.8.0"
KARPENTER_AWS_MODULE = "github.com/aws/karpenter-provider-aws"  # its CRDs (karpenter.sh with the AWS label allow-list, EC2NodeClass) at KARPENTER_VERSION
# Helm's SDK, for rendering the stack's charts as its Helm releases install them (tools/cluster/charts.py,
# a small main of ours: tools/cluster/helm_template.go). v3.20.2 is what pulumi-kubernetes embeds for
# helm.v3.Release in v4.30.0 to v4.32.0 and on its main branch of 2026-07-01 (provider/go.mod); the
# version inside pulumi-kubernetes 4.34.2 (requirements.txt) was not confirmed.
HELM_MODULE = "helm.sh/helm/v3"
HELM_VERSION = "v3.20.2"

# The teams' portal (portal.enabled; k8s/builders/portal.py, k8s/portal.py). Its image: a slim
# Python base (the same pinned one as the cleanup job's) with the portal's own requirements
# (portal/requirements.txt, pinned), built from portal/Dockerfile into the stack's ECR.
PORTAL_BASE_IMAGE = "public.ecr.aws/docker/library/python:3.13.7-slim-bookworm"
PORTAL_UID = "10001"
# The API documentation page (/api/docs, trainctl/portal/apidocs.py): swagger-ui's dist files, served by the portal
# itself (no CDN: an offline or locked-down network loads it too) from the pinned fastapi-swagger 0.4.64
# (requirements.txt, portal/requirements.txt, pyproject.toml's ui extra), which ships swagger-ui 5.34.0 (its
# resources/swagger-ui-bundle.js says so; tests/test_portal_form.py checks it). swagger-ui 5 reads OpenAPI 3.1, what
# FastAPI writes; swagger-ui-bundle 1.1.0 (swagger-ui 4.15.5) cannot render it.
PORTAL_SWAGGER_UI_VERSION = "5.34.0"
# The AWS Load Balancer Controller, installed with the portal where the GPU pool is self-managed
# (Auto Mode brings its own load balancing): chart and app v3.5.0 (kubernetes-sigs/aws-load-balancer-controller
# tag v3.5.0, helm/aws-load-balancer-controller/Chart.yaml), published in the eks-charts repository.
ALB_CONTROLLER_CHART = "aws-load-balancer-controller"
ALB_CONTROLLER_CHART_REPO = "https://aws.github.io/eks-charts"
ALB_CONTROLLER_VERSION = "3.5.0"
# Its IAM policy, config/alb_controller_iam_policy.json, is this file of that release, unchanged
# (the project's installation guide docs/deploy/installation.md downloads it from there);
# tests/test_portal.py pins the file's SHA-256 and this source.
ALB_CONTROLLER_IAM_POLICY_SOURCE = "https://raw.githubusercontent.com/kubernetes-sigs/aws-load-balancer-controller/v3.5.0/docs/install/iam_policy.json"
ALB_CONTROLLER_IAM_POLICY_SHA256 = "16f232c9d9f79366fe949c4550ad517a202380058a9e48d45a4e215044a20a6a"
# The chart's source for the local control plane (tools/cluster/charts.py): the eks-charts
# repository (the published Helm repository's source, stable/aws-load-balancer-controller) as the Go
# module proxy serves it. The controller's own module (sigs.k8s.io/aws-load-balancer-controller/v3,
# tag v3.5.0) is not served by the module proxy this project builds from ("not available"); this
# eks-charts commit of 2026-08-21 holds chart 3.5.0 (Chart.yaml version 3.5.0, appVersion v3.5.0),
# file for file the tag's helm/aws-load-balancer-controller. tools/cluster/charts.py checks the version.
EKS_CHARTS_MODULE = "github.com/aws/eks-charts"
EKS_CHARTS_MODULE_VERSION = "v0.0.243-0.20260821194545-743f98a89b5b"

# Pulumi engine (tools/engine: `make engine-build`, the engine tests): the CLI and the Kubernetes
# provider built from their Go modules on the module proxy, cached like the local control plane's
# components; the Python language host is ours (tools/engine/language_host.py) and runs the
# pulumi-language-python-exec script of the SDK module at the CLI's version.
# The CLI: github.com/pulumi/pulumi/pkg/v3 cmd/pulumi; its go.mod replaces sdk/v3 by its sibling
# directory, built here against sdk/v3 at the same tag (tools.cluster.build.replaced_go_mod).
PULUMI_CLI_MODULE = "github.com/pulumi/pulumi/pkg/v3"
PULUMI_CLI_VERSION = "v3.274.1"
PULUMI_SDK_MODULE = "github.com/pulumi/pulumi/sdk/v3"
PULUMI_SDK_VERSION = PULUMI_CLI_VERSION
# The Kubernetes provider: the proxy serves github.com/pulumi/pulumi-kubernetes/provider/v4 at this one
# pseudo-version only (no provider/ tags; other commits "not available"). Its commit f47bc2d6f199 is the one
# the repository's tag v4.25.0 names: the provider release 4.25.0, the version the build stamps. Its go.mod
# replaces sdk/v4 by ../sdk: built against sdk/v4 v4.25.0 (tag sdk/v4.25.0, the release's SDK commit, one
# after it, served though `go list -m -versions` does not list it). That release is older than the Python
# SDK requirements.txt pins (pulumi-kubernetes 4.34.2): tools/engine/build.py says how the engine loads it.
PULUMI_KUBERNETES_PROVIDER_MODULE = "github.com/pulumi/pulumi-kubernetes/provider/v4"
PULUMI_KUBERNETES_PROVIDER_VERSION = "v4.0.0-20260115033456-f47bc2d6f199"
PULUMI_KUBERNETES_PROVIDER_RELEASE = "4.25.0"
PULUMI_KUBERNETES_SDK_MODULE = "github.com/pulumi/pulumi-kubernetes/sdk/v4"
PULUMI_KUBERNETES_SDK_GO_VERSION = "v4.25.0"
