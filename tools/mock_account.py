"""What the account already holds when a program runs under the mock runtime: the SSM parameters an
earlier deploy left and the images in the stack's ECR repositories. The provider functions that read
them answer from here, and fail as the provider does when the thing is missing."""

from __future__ import annotations

from dataclasses import dataclass, field

ACCOUNT = "123456789012"


@dataclass
class AccountState:
    """``ssm_parameters``: name -> value; ``registry_images``: repository name -> {tag: digest}
    (a repository that is absent does not exist yet); ``roles``: the account's IAM roles by name."""

    ssm_parameters: dict[str, str] = field(default_factory=dict)
    registry_images: dict[str, dict[str, str]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)  # IAM role name -> its path (service-linked roles among them)
    quotas: dict[str, float] | None = None  # Service Quotas' EC2 quota name -> value; None: not known (an offline render)
    endpoint_zones: dict[str, list[str]] = field(default_factory=dict)  # endpoint service -> the zones it serves (default: all)

    def answer(self, token: str, args: dict, region: str = "us-west-2") -> tuple[dict, list[tuple[str, str]]] | None:
        """(outputs, failures) of a provider function that reads the account, else None."""
        if token == "aws:ec2/getVpcEndpointService:getVpcEndpointService":  # the commercial Regions' form (PrivateLink Guide, "AWS services that integrate")
            name = f"com.amazonaws.{region}.{args.get('service')}"
            zones = self.endpoint_zones.get(str(args.get("service")), [f"{region}{z}" for z in "abcdef"])  # every zone, unless a test says otherwise
            return {"serviceName": name, "service": args.get("service"), "serviceType": args.get("serviceType"), "availabilityZones": zones, "id": name}, []
        if token == "aws:ec2/getNetworkInterface:getNetworkInterface":  # an endpoint's ENI (tools/mock_runtime.py names them by index)
            eni = args.get("id", "")
            return {"id": eni, "privateIp": f"10.0.{int(eni.rsplit('-', 1)[-1], 16) % 250}.{10 + int(eni.rsplit('-', 1)[-1], 16) % 200}"}, []
        if token == "aws:ssm/getParameter:getParameter":
            name = args.get("name", "")
            if name not in self.ssm_parameters:  # as the provider reports a missing parameter
                return {}, [("name", f"ParameterNotFound: {name}")]
            return {"name": name, "value": self.ssm_parameters[name], "type": "String", "id": name}, []
        if token == "aws:iam/getRoles:getRoles":  # ListRoles by path prefix: an empty list, never an error
            prefix = args.get("pathPrefix") or "/"
            names = sorted(n for n, path in self.roles.items() if path.startswith(prefix))
            return {"names": names, "arns": [f"arn:aws:iam::{ACCOUNT}:role{self.roles[n]}{n}" for n in names], "id": prefix}, []
        if token == "aws:servicequotas/getServiceQuota:getServiceQuota":
            name = args.get("quotaName", "")
            if self.quotas is None or name not in self.quotas:
                return {}, [("quotaName", "the offline render does not know this account's quotas" if self.quotas is None else f"NoSuchResourceException: {name}")]
            return {"quotaName": name, "serviceCode": args.get("serviceCode"), "value": self.quotas[name], "id": name}, []
        if token == "aws:ecr/getRepositories:getRepositories":  # DescribeRepositories, every page: the names
            return {"names": sorted(self.registry_images), "id": args.get("region") or "registry"}, []
        if token == "aws:ecr/getImages:getImages":
            # ListImages (the data source's call); a missing repository as the data source reports it,
            # without ECR's error code (terraform-provider-aws images_data_source.go: retry.NotFoundError)
            repo = args.get("repositoryName", "")
            if repo not in self.registry_images:
                return {}, [("repositoryName", "reading ECR Images: couldn't find resource")]
            ids = [{"imageTag": tag, "imageDigest": digest} for tag, digest in sorted(self.registry_images[repo].items())]
            return {"imageIds": ids, "repositoryName": repo, "registryId": args.get("registryId") or ACCOUNT, "id": repo}, []
        return None
