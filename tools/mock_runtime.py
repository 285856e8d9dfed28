"""Run the Pulumi program under Pulumi's mock runtime and record what it registers.

This is the one harness behind ``make render`` and the tests. It uses
``pulumi.runtime.set_mocks`` (Pulumi's documented unit-test mode) with a monitor that

* records every registration: URN, type, name, parent, explicit dependencies and the inputs
  exactly as the engine receives them (resource references as ``{urn, id}``, secrets masked);
* never re-creates resource objects on its worker thread: the stock monitor deserializes
  resource references there, which binds them to the wrong event loop and hangs or fails the
  program. Here the protobuf struct is decoded to plain data instead;
* answers the provider functions the program calls (AZs, caller identity, partition) from the
  table of real AWS facts (``config/aws_facts.yaml``): a name that is no AWS Region fails
  instead of being invented, and every ARN the mock makes uses the region's partition;
* returns plausible outputs for each resource type, including the remote ``eks`` components.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import runpy
import sys
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import json_format
from pulumi.runtime import mocks as pmocks
from pulumi.runtime import rpc
from pulumi.runtime import settings as psettings
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from config import aws_facts
from config.stack_file import load_stack_file
from tools import stack_refs
from tools.mock_account import ACCOUNT, AccountState
from tools.mock_config import config_map as _config_map

UNKNOWN = rpc.UNKNOWN
SECRET_MASK = "[secret]"


class _Secret:
    def __init__(self, value: Any):
        self.value = value


def _decode(value: Any) -> Any:
    """Protobuf JSON -> plain data; resource refs become {urn, id}, secrets are wrapped."""
    if isinstance(value, dict):
        sig = value.get(rpc._special_sig_key)
        if sig == rpc._special_resource_sig:
            return {"urn": value.get("urn"), "id": value.get("id")}
        if sig == rpc._special_secret_sig:
            return _Secret(_decode(value.get("value")))
        if sig == rpc._special_output_value_sig:
            inner = _decode(value.get("value")) if "value" in value else None
            return _Secret(inner) if value.get("secret") else inner
        if sig in (rpc._special_asset_sig, rpc._special_archive_sig):
            return {k: v for k, v in value.items() if k != rpc._special_sig_key}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value == UNKNOWN:
        return None
    return value


def _plain(value: Any, mask: bool) -> Any:
    if isinstance(value, _Secret):
        return SECRET_MASK if mask else _plain(value.value, mask)
    if isinstance(value, dict):
        return {k: _plain(v, mask) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, mask) for v in value]
    return value


@dataclass
class Registration:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict
    depends_on: list[str]
    provider: str | None
    state: dict = field(default_factory=dict)
    id: str = ""
    replace_on_changes: list[str] = field(default_factory=list)
    delete_before_replace: bool = False
    ignore_changes: list[str] = field(default_factory=list)
    retain_on_delete: bool = False
    property_dependencies: dict[str, list[str]] = field(default_factory=dict)

    def to_plan(self) -> dict:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "inputs": self.inputs,
            "dependsOn": self.depends_on,
            "provider": self.provider,
            "propertyDependencies": self.property_dependencies,
            **({"replaceOnChanges": self.replace_on_changes} if self.replace_on_changes else {}),
            **({"deleteBeforeReplace": True} if self.delete_before_replace else {}),
            **({"ignoreChanges": self.ignore_changes} if self.ignore_changes else {}),
            **({"retainOnDelete": True} if self.retain_on_delete else {}),
        }


def _short_id(*parts: str) -> str:
    return hashlib.sha1("/".join(parts).encode()).hexdigest()[:17]


class PlanMocks(pmocks.Mocks):
    """Outputs for each resource type, and answers to provider functions."""

    def __init__(self, region: str, caller_arn: str | None = None, account: AccountState | None = None, stack_outputs: dict[str, dict] | None = None):
        self.region = region
        self.stack_outputs = dict(stack_outputs or {})  # fully qualified stack name -> its outputs (StackReference)
        self.known_region = aws_facts.is_region(region)
        self.partition = aws_facts.partition(region) if self.known_region else None
        self.account = account or AccountState()  # what the account holds already (SSM parameters, ECR images)
        self.caller_arn = caller_arn or f"arn:{self.partition or 'aws'}:iam::{ACCOUNT}:user/render"

    def _unknown_region(self) -> str:
        return f"{self.region!r} is not an AWS Region (pulumi_aws.Region); the mock runtime does not invent one"

    def _arn(self) -> str:
        """``arn:<partition>`` of the region; an unknown region is an error, not ``aws``."""
        if self.partition is None:
            raise ValueError(self._unknown_region())
        return f"arn:{self.partition}"

    def _dns_suffix(self) -> str:
        return aws_facts.dns_suffix(self.partition or "aws")

    def _zones(self) -> tuple[list[str], list[str]]:
        """(names, AZ IDs) one account is shown: the facts table's; for a Region it has no zones
        for (the program warns: aws_facts.gaps), three zones named by AWS's documented scheme
        (Region code + letter), with no AZ IDs: nothing the render checks depends on them."""
        if aws_facts.is_known_region(self.region):
            return aws_facts.account_zones(self.region), aws_facts.zone_ids(self.region)
        return [f"{self.region}{letter}" for letter in "abc"], []

    def call(self, args: pmocks.MockCallArgs) -> tuple[dict, list[tuple[str, str]]]:
        if (held := self.account.answer(args.token, args.args, self.region)) is not None:
            return held
        if not self.known_region and args.token.startswith("aws:"):  # as the provider fails for a region it cannot reach
            return {}, [("region", self._unknown_region())]
        return self._answer(args), []  # (outputs, check failures)

    def _answer(self, args: pmocks.MockCallArgs) -> dict:
        tok = args.token
        if tok == "aws:index/getAvailabilityZones:getAvailabilityZones":  # what one account is shown
            names, ids = self._zones()
            return {"names": names, "zoneIds": ids, "id": self.region}
        if tok == "aws:index/getCallerIdentity:getCallerIdentity":
            return {"accountId": self.caller_arn.split(":")[4], "arn": self.caller_arn, "userId": "AIDRENDER", "id": self.caller_arn.split(":")[4]}
        if tok == "aws:index/getPartition:getPartition":
            return {"partition": self.partition, "dnsSuffix": self._dns_suffix(), "id": self.partition}
        if tok == "aws:ec2/getSubnet:getSubnet":
            sid = args.args.get("id", "")
            zones = self._zones()[0]
            return {"id": sid, "availabilityZone": zones[int(_short_id(sid), 16) % min(3, len(zones))], "vpcId": "vpc-0"}
        if tok == "aws:index/getRegion:getRegion":
            return {"name": self.region, "region": self.region, "id": self.region}
        return {}

    def new_resource(self, args: pmocks.MockResourceArgs):
        inputs = dict(args.inputs)
        typ, name = args.typ, args.name
        if typ == "pulumi:pulumi:StackReference":  # the referenced stack's outputs as rendered offline (run_program)
            ref = inputs.get("name") or args.resource_id or name
            if ref not in self.stack_outputs:
                raise ValueError(f"stack reference {ref!r}: no such stack rendered offline (a stack of a project in this repository, as <organization>/<project>/<stack>)")
            return ref, {"name": ref, "outputs": self.stack_outputs[ref], "secretOutputNames": []}
        rid = f"{name}-{_short_id(typ, name)}"
        prefixes = {
            "aws:ec2/vpc:Vpc": "vpc-",
            "aws:ec2/subnet:Subnet": "subnet-",
            "aws:ec2/securityGroup:SecurityGroup": "sg-",
            "aws:ec2/natGateway:NatGateway": "nat-",
            "aws:ec2/internetGateway:InternetGateway": "igw-",
            "aws:ec2/routeTable:RouteTable": "rtb-",
            "aws:ec2/eip:Eip": "eipalloc-",
            "aws:ec2/placementGroup:PlacementGroup": "pg-",
            "aws:fsx/lustreFileSystem:LustreFileSystem": "fs-",
            "aws:efs/fileSystem:FileSystem": "fs-",
            "aws:efs/accessPoint:AccessPoint": "fsap-",
        }
        if typ in prefixes:
            rid = prefixes[typ] + _short_id(typ, name)
        state = dict(inputs)
        service = typ.split(":")[1].split("/")[0] if typ.startswith("aws:") else ""
        arn = self._arn() if typ.startswith("aws:") or typ.startswith("eks:") else ""
        if typ.startswith("aws:"):
            state.setdefault("arn", f"{arn}:{service}:{self.region}:{ACCOUNT}:{typ.split(':')[-1].lower()}/{rid}")
            state.setdefault("name", inputs.get("name", name))
        if typ in ("aws:efs/fileSystem:FileSystem", "aws:efs/accessPoint:AccessPoint"):  # EFS User Guide, "Resources": ARN formats
            state["arn"] = f"{arn}:elasticfilesystem:{self.region}:{ACCOUNT}:{'file-system' if rid.startswith('fs-') else 'access-point'}/{rid}"
        if typ == "aws:iam/role:Role":
            state["arn"] = f"{arn}:iam::{ACCOUNT}:role/{state['name']}"
        if typ == "aws:iam/policy:Policy":
            state["arn"] = f"{arn}:iam::{ACCOUNT}:policy/{state['name']}"
        if typ == "aws:cloudwatch/logGroup:LogGroup":
            state["arn"] = f"{arn}:logs:{self.region}:{ACCOUNT}:log-group:{state['name']}"
        # ARN formats (Service Authorization Reference: SNS topic, CloudWatch alarm, EventBridge rule
        # on the default bus): policies name these resources by them
        if typ == "aws:sns/topic:Topic":
            state["arn"] = f"{arn}:sns:{self.region}:{ACCOUNT}:{state['name']}"
        if typ == "aws:cloudwatch/metricAlarm:MetricAlarm":
            state["arn"] = f"{arn}:cloudwatch:{self.region}:{ACCOUNT}:alarm:{state['name']}"
        if typ == "aws:cloudwatch/eventRule:EventRule":
            state["arn"] = f"{arn}:events:{self.region}:{ACCOUNT}:rule/{state['name']}"
        if typ == "aws:sqs/queue:Queue":
            state["url"] = f"https://sqs.{self.region}.{self._dns_suffix()}/{ACCOUNT}/{state['name']}"
            state["arn"] = f"{arn}:sqs:{self.region}:{ACCOUNT}:{state['name']}"
        if typ == "aws:fsx/lustreFileSystem:LustreFileSystem":
            state.update(dnsName=f"{rid}.fsx.{self.region}.{self._dns_suffix()}", mountName="abcdefgh")
        if typ == "eks:index:Cluster":
            state.update(_eks_cluster_outputs(inputs, self.region, arn, self._dns_suffix()))
            if (inputs.get("autoMode") or {}).get("createNodeRole"):  # pulumi-eks's auto-named role
                state["autoModeNodeRoleName"] = f"{name}-eks-auto-mode-node-role-{_short_id('auto-node', name)[:7]}"
        if typ == "eks:index:ManagedNodeGroup":
            ng_name = inputs.get("nodeGroupName", name)
            state["nodeGroup"] = _ChildResource(
                "aws:eks/nodeGroup:NodeGroup", f"{name}-nodeGroup", ng_name, {"nodeGroupName": ng_name, "arn": f"{arn}:eks:{self.region}:{ACCOUNT}:nodegroup/{ng_name}"}
            )
        if typ == "aws:ecr/repository:Repository":
            state.update(repositoryUrl=f"{ACCOUNT}.dkr.ecr.{self.region}.{self._dns_suffix()}/{state['name']}", registryId=ACCOUNT, arn=f"{arn}:ecr:{self.region}:{ACCOUNT}:repository/{state['name']}")
        if typ == "docker-build:index:Image":  # a pushed build: its digest follows what was built (tags carry the content hash)
            built = json.dumps({k: inputs.get(k) for k in ("tags", "buildArgs", "context", "dockerfile", "platforms")}, sort_keys=True, default=str)
            state["digest"] = "sha256:" + hashlib.sha256(built.encode()).hexdigest()
            tags = inputs.get("tags") or []
            state["ref"] = f"{tags[0]}@{state['digest']}" if tags else ""  # like the provider: the first tag, with the digest
        if typ == "docker-build:index:Index":  # a pushed copy: the tag with the digest of what it copied (provider Index.Read)
            state["ref"] = f"{inputs.get('tag')}@sha256:" + hashlib.sha256(json.dumps(inputs.get("sources"), sort_keys=True).encode()).hexdigest()
        if typ == "aws:ec2/vpcEndpoint:VpcEndpoint" and inputs.get("vpcEndpointType") == "Interface":  # one ENI per subnet
            state["networkInterfaceIds"] = [f"eni-{_short_id(name, str(i))}" for i in range(len(inputs.get("subnetIds") or []))]
        if typ == "kubernetes:helm.sh/v3:Release":
            state.setdefault("status", {"name": inputs.get("name", name), "namespace": inputs.get("namespace"), "status": "deployed"})
        return rid, state


def _eks_cluster_outputs(inputs: dict, region: str, arn: str, dns_suffix: str) -> dict:
    name = inputs.get("name") or "cluster"
    endpoint = f"https://{_short_id(name).upper()}.gr7.{region}.eks.{dns_suffix}"
    issuer = f"https://oidc.eks.{region}.{dns_suffix}/id/{_short_id('oidc', name).upper()}"
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": "UkVOREVSRUQ="}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "users": [{"name": name, "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws", "args": ["eks", "get-token", "--cluster-name", name]}}}],
    }
    cluster_sg = "sg-" + _short_id("cluster-sg", name)
    eks_cluster = {
        "name": name,
        "arn": f"{arn}:eks:{region}:{ACCOUNT}:cluster/{name}",
        "endpoint": endpoint,
        "version": inputs.get("version"),
        "vpcConfig": {"clusterSecurityGroupId": cluster_sg, "subnetIds": inputs.get("privateSubnetIds"), "vpcId": inputs.get("vpcId")},
        "identities": [{"oidcs": [{"issuer": issuer}]}],
    }
    return {
        "kubeconfig": kubeconfig,
        "kubeconfigJson": json.dumps(kubeconfig),
        "clusterSecurityGroupId": "sg-" + _short_id("eks-extra-sg", name),
        "nodeSecurityGroupId": "sg-" + _short_id("node-sg", name),
        "eksClusterSecurityGroupId": cluster_sg,
        "oidcProviderArn": f"{arn}:iam::{ACCOUNT}:oidc-provider/{issuer[8:]}",
        "oidcProviderUrl": issuer[8:],
        "oidcIssuer": issuer,
        "eksCluster": _ChildResource("aws:eks/cluster:Cluster", f"{name}-eksCluster", name, eks_cluster),
        "core": {"cluster": _ChildResource("aws:eks/cluster:Cluster", f"{name}-eksCluster", name, eks_cluster), "endpoint": endpoint},
    }


@dataclass
class _ChildResource:
    """A resource a remote component creates inside the engine: returned as a reference."""

    type: str
    name: str
    id: str
    state: dict


class RecordingMonitor(pmocks.MockMonitor):
    """MockMonitor that records registrations and decodes inputs without rebuilding resources."""

    def __init__(self, mocks: PlanMocks):
        super().__init__(mocks)
        self.registrations: list[Registration] = []

    def RegisterResource(self, request):
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == "pulumi:pulumi:Stack":
            return resource_pb2.RegisterResourceResponse(urn=urn)
        raw = _decode(json_format.MessageToDict(request.object, preserving_proto_field_name=True))
        args = pmocks.MockResourceArgs(
            typ=request.type,
            name=request.name,
            inputs=_plain(raw, mask=False),
            provider=request.provider,
            resource_id=request.importId,
            custom=request.custom or False,
        )
        rid, state = self.mocks.new_resource(args)
        state = self._materialize_children(urn, state)
        if not request.custom or rid is None:
            rid = ""
        reg = Registration(
            urn=urn,
            type=request.type,
            name=request.name,
            parent=request.parent or None,
            custom=bool(request.custom),
            inputs=_plain(raw, mask=True),
            depends_on=list(request.dependencies),
            provider=request.provider or None,
            state=state,
            id=rid or "",
            replace_on_changes=list(request.replaceOnChanges),
            delete_before_replace=bool(request.deleteBeforeReplace),
            ignore_changes=list(request.ignoreChanges),
            retain_on_delete=bool(request.retainOnDelete),
            property_dependencies={k: list(v.urns) for k, v in request.propertyDependencies.items() if v.urns},
        )
        self.registrations.append(reg)
        self.resources[urn] = pmocks.MockMonitor.ResourceRegistration(urn, rid, state)
        obj = _sync_await(rpc.serialize_properties(state, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=rid, object=obj)

    def ReadResource(self, request):
        """A resource read (a ``StackReference``), recorded like a registration."""
        urn = self.make_urn(request.parent, request.type, request.name)
        raw = _decode(json_format.MessageToDict(request.properties, preserving_proto_field_name=True))
        args = pmocks.MockResourceArgs(typ=request.type, name=request.name, inputs=_plain(raw, mask=False), provider=request.provider, resource_id=request.id)
        rid, state = self.mocks.new_resource(args)
        self.registrations.append(Registration(urn, request.type, request.name, request.parent or None, True, _plain(raw, mask=True), list(request.dependencies), request.provider or None, state, rid or ""))
        self.resources[urn] = pmocks.MockMonitor.ResourceRegistration(urn, rid or "", state)
        return resource_pb2.ReadResourceResponse(urn=urn, properties=_sync_await(rpc.serialize_properties(state, {})))

    def _materialize_children(self, parent_urn: str, value: Any) -> Any:
        if isinstance(value, _ChildResource):
            urn = self.make_urn(parent_urn, value.type, value.name)
            self.resources[urn] = pmocks.MockMonitor.ResourceRegistration(urn, value.id, value.state)
            return {rpc._special_sig_key: rpc._special_resource_sig, "urn": urn, "id": value.id}
        if isinstance(value, dict):
            return {k: self._materialize_children(parent_urn, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._materialize_children(parent_urn, v) for v in value]
        return value


class ProgramError(Exception):
    """The program failed; ``registrations`` holds what it had registered by then."""

    def __init__(self, message: str, registrations: list[Registration]):
        super().__init__(message)
        self.registrations = registrations


@dataclass
class ProgramRun:
    stack: str
    registrations: list[Registration]
    outputs: dict[str, Any]

    def plan(self) -> dict:
        return {"stack": self.stack, "resources": [r.to_plan() for r in self.registrations]}

    def by_type(self, typ: str) -> list[Registration]:
        return [r for r in self.registrations if r.type == typ]

    def one(self, typ: str, name: str | None = None) -> Registration:
        found = [r for r in self.by_type(typ) if name is None or r.name == name]
        if len(found) != 1:
            raise LookupError(f"expected one {typ} {name or ''}, found {len(found)}")
        return found[0]


def _project_file(project_dir: str) -> tuple[str, dict]:
    import yaml

    with open(os.path.join(project_dir, "Pulumi.yaml")) as fh:
        project_file = yaml.safe_load(fh)
    return project_file["name"], project_file


def stack_config_of(project_dir: str, stack: str) -> dict[str, str]:
    """The config a stack's program gets (project defaults, then the stack file), as strings."""
    project, project_file = _project_file(project_dir)
    return _config_map(project, project_file, load_stack_file(os.path.join(project_dir, f"Pulumi.{stack}.yaml"), project=project))[0]


def _ensure_event_loop() -> None:
    """Pulumi's mocks run on the thread's current loop: a new one where asyncio.run or a close left none."""
    with contextlib.suppress(RuntimeError):  # RuntimeError: no current event loop in this thread
        if not asyncio.get_event_loop().is_closed():
            return
    asyncio.set_event_loop(asyncio.new_event_loop())


def run_program(project_dir: str | os.PathLike[str], stack: str, stack_config: dict | None = None, main: str | None = None, caller_arn: str | None = None, ssm_parameters: dict[str, str] | None = None,
                stack_outputs: dict[str, dict] | None = None, registry_images: dict[str, dict[str, str]] | None = None, roles: dict[str, str] | None = None, quotas: dict[str, float] | None = None,
                endpoint_zones: dict[str, list[str]] | None = None) -> ProgramRun:
    """Run ``__main__.py`` of the project for ``stack`` under mocks; return what it registered.

    ``stack_config`` replaces ``Pulumi.<stack>.yaml`` (tests: other configurations); ``caller_arn`` is the identity ``aws.getCallerIdentity`` answers with (the deployer);
    ``ssm_parameters`` are the SSM parameters that exist already (an earlier deploy's); ``registry_images``
    the images the account's ECR holds (repository -> {tag: digest}), ``roles`` its IAM roles (name -> path), ``quotas`` its EC2 quotas by name, ``endpoint_zones`` the zones endpoint services serve (tools/mock_account.py);
    ``stack_outputs``: fully qualified stack name -> the outputs a StackReference to it reads (default:
    the stacks of this repository the config names, rendered first: tools/stack_refs.py).
    A stack file that is not valid (see :func:`config.stack_file.load_stack_file`) raises
    :class:`~config.stack_file.StackFileError` before anything runs; errors raised by the
    program (bad config and a region the facts table does not know included) become :class:`ProgramError`.
    """
    project_dir = os.fspath(project_dir)  # it goes on sys.path, where a pathlib.Path breaks others (inductor joins sys.path)
    project, project_file = _project_file(project_dir)
    if stack_config is None:  # a bad or missing file is a StackFileError (StackFileMissing is a FileNotFoundError)
        stack_config = load_stack_file(os.path.join(project_dir, f"Pulumi.{stack}.yaml"), project=project)
    config, secret_keys = _config_map(project, project_file, stack_config)
    region = config.get("aws:region", "us-west-2")
    if stack_outputs is None:  # rendered before this program starts: the mock runtime is process-global
        stack_outputs = stack_refs.rendered_outputs(config, lambda d, s: run_program(d, s).outputs)
    _ensure_event_loop()
    monitor = RecordingMonitor(PlanMocks(region, caller_arn, AccountState(dict(ssm_parameters or {}), dict(registry_images or {}), dict(roles or {}), quotas, dict(endpoint_zones or {})), stack_outputs))
    psettings.ROOT.set(None)
    pulumi.runtime.set_all_config(config, secret_keys)
    pmocks.set_mocks(monitor.mocks, project=project, stack=stack, preview=False, monitor=monitor)
    root = psettings.get_root_resource()

    if project_dir not in sys.path:
        sys.path.insert(0, project_dir)
    main = main or os.path.join(project_dir, "__main__.py")
    # pulumi types these Settings attributes through an untyped @contextproperty decorator, hence the ignores
    psettings.SETTINGS.rpc_manager.clear()  # pyright: ignore[reportAttributeAccessIssue]
    psettings.SETTINGS.outputs.clear()  # pyright: ignore[reportAttributeAccessIssue]

    def program() -> None:
        runpy.run_path(main, run_name="__main__")

    try:
        _sync_await(run_pulumi_func(program))
    except pulumi.RunError as err:  # the program's own message (all config problems, one per line)
        raise ProgramError(str(err).strip() or type(err).__name__, monitor.registrations) from err
    except Exception as err:
        text = str(err).strip()
        raise ProgramError(text.splitlines()[-1] if text else type(err).__name__, monitor.registrations) from err

    outputs = {}
    for key, out in getattr(root, "outputs", {}).items():
        outputs[key] = _sync_await(pulumi.Output.from_input(out).future())
    return ProgramRun(stack=stack, registrations=monitor.registrations, outputs=outputs)
