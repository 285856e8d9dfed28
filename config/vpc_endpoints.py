"""The VPC endpoints a cluster's nodes and controllers call AWS through (``network.s3GatewayEndpoint``,
``network.interfaceEndpoints``): one table, each service with who calls it.

Sources: Amazon EKS User Guide, "Deploy private clusters with limited internet access" (the
interface endpoints a cluster without outbound internet needs: ec2, ecr.api, ecr.dkr, s3, logs,
sts, elasticloadbalancing, eks-auth for Pod Identity, eks); Karpenter's docs, "Private Clusters"
(sqs for the interruption queue, ssm for the AMI alias, ec2, sts, eks; the pricing API has no
endpoint, so Karpenter prices from its built-in table); the Amazon VPC User Guide, "Gateway
endpoints" (S3 and DynamoDB; "There is no additional charge for using gateway endpoints"). ECR
serves image layers from S3, so the gateway endpoint also carries image pulls (ECR User Guide,
"Amazon ECR interface VPC endpoints (AWS PrivateLink)": the S3 gateway endpoint is required for layers).
"""

from __future__ import annotations

GATEWAY_SERVICE = "s3"

# service (the part after com.amazonaws.<region>.) -> who calls it from the cluster
INTERFACE_SERVICES: dict[str, str] = {
    "ec2": "Karpenter (launches, describes) and the VPC CNI (ENIs, addresses)",
    "ecr.api": "kubelet's image pulls (authorization, manifests)",
    "ecr.dkr": "kubelet's image pulls (the registry API)",
    "sts": "IAM roles of controllers and jobs",
    "eks": "Karpenter (the cluster's version and endpoint)",
    "eks-auth": "the Pod Identity agent (AssumeRoleForPodIdentity)",
    "sqs": "Karpenter's interruption queue",
    "ssm": "Karpenter (the AL2023 AMI alias's SSM parameters)",
    "logs": "the CloudWatch agent and Fluent Bit (observability.mode cloudwatch)",
    "monitoring": "the CloudWatch agent's metrics",
    "elasticloadbalancing": "the AWS Load Balancer Controller (the portal's ALB)",
}
HTTPS_PORT = 443  # every interface endpoint serves HTTPS only
