"""The AWS side of the platform: one Pulumi ComponentResource a file, composed by ``__main__.py``.

network (VPC and subnets, or an existing VPC), cluster (EKS, access entries, the ARM and x86 managed
node groups), gpu_aws (Karpenter's IAM, queue and rules, EFA security group, placement groups),
storage (FSx for Lustre or EFS with its CSI add-on), registry (the ECR repository, the training
image and the copies of upstream images), node_health (the node monitoring add-on), observability
(CloudWatch: its add-on, log groups and dashboard), alarms, encryption (customer-managed keys);
and what the programs need to start: project_config (the stack config as plain data: the only
reader of pulumi.Config) and deploy_state (what earlier deploys left in the account).

May import: config, k8s.builders (pure), infra. Never the Kubernetes side's components."""
