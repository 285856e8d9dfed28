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
# v2.1.0 shipped a staging JobSet image that no longer resolves; pin the release image.
JOBSET_IMAGE_REPOSITORY = "registry.k8s.io/jobset/jobset"

# EKS add-ons for checkpoint storage (CSI drivers); versions as published for EKS 1.34.
FSX_CSI_ADDON_VERSION = "v1.7.0-eksbuild.1"
EFS_CSI_ADDON_VERSION = "v2.1.13-eksbuild.1"
POD_IDENTITY_ADDON_VERSION = "v1.3.9-eksbuild.3"

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
WORKLOAD_UID = "1000"  # the image's non-root user (created; not switched to yet: workloads/Dockerfile)
WORKLOAD_BUILD_ARGS = {
    "BASE_IMAGE": WORKLOAD_BASE_IMAGE,
    "EFA_INSTALLER_VERSION": EFA_INSTALLER_VERSION,
    "LIBFABRIC_VERSION": LIBFABRIC_VERSION,
    "AWS_OFI_NCCL_VERSION": AWS_OFI_NCCL_VERSION,
    "TRAINING_UID": WORKLOAD_UID,
}

# Default images of the ClusterTrainingRuntimes (a TrainJob sets its own image).
TORCH_RUNTIME_IMAGE = "pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime"
DEEPSPEED_RUNTIME_IMAGE = "ghcr.io/kubeflow/trainer/deepspeed-runtime:v2.3.0"
TENSORFLOW_RUNTIME_IMAGE = "tensorflow/tensorflow:2.20.0-gpu"
