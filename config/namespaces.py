"""The platform's namespaces: where each system component runs (TrainJobs may not use them)."""

KARPENTER_NAMESPACE = "kube-system"  # Karpenter's chart default, beside the EKS system components
TRAINER_NAMESPACE = "kubeflow-system"
KUEUE_NAMESPACE = "kueue-system"
AGENT_NAMESPACE = "amazon-cloudwatch"  # the amazon-cloudwatch-observability add-on's
MONITORING_NAMESPACE = "monitoring"
OPS_NAMESPACE = "platform-ops"
STORAGE_NAMESPACE = "tenant-storage"
PORTAL_NAMESPACE = "platform-portal"  # the teams' portal (k8s/builders/portal.py): Pod Security restricted
