"""What `pulumi up -s dev` would create for the foundation: network, cluster, node groups."""

import json
import subprocess
import sys

import pytest

from infra.network import subnet_plan
from tests.conftest import PROJECT, dev_config, run_config, run_stack
from tools.mock_runtime import ProgramError

SUBNET = "aws:ec2/subnet:Subnet"
CLUSTER = "eks:index:Cluster"
MNG = "eks:index:ManagedNodeGroup"


def private_subnets(run):
    return [r for r in run.by_type(SUBNET) if "private" in r.name]


def test_dev_vpc_with_tagged_private_subnets_in_distinct_azs():
    run = run_stack("dev")
    vpc = run.one("aws:ec2/vpc:Vpc")
    assert vpc.inputs["cidrBlock"] == "10.10.0.0/16"
    assert vpc.inputs["enableDnsHostnames"] is True
    priv = private_subnets(run)
    assert len(priv) == 2
    assert len({s.inputs["availabilityZone"] for s in priv}) == 2
    for s in priv:
        tags = s.inputs["tags"]
        assert tags["kubernetes.io/role/internal-elb"] == "1"
        assert tags["karpenter.sh/discovery"] == "training-dev"
        assert s.inputs["mapPublicIpOnLaunch"] is False
    for s in (r for r in run.by_type(SUBNET) if "public" in r.name):
        assert s.inputs["tags"]["kubernetes.io/role/elb"] == "1"


def test_private_route_tables_go_through_nat_and_public_through_igw():
    run = run_stack("dev")
    rts = {r.name: r for r in run.by_type("aws:ec2/routeTable:RouteTable")}
    assert "gatewayId" in rts["net-public-rt"].inputs["routes"][0]
    for name, rt in rts.items():
        if "private" in name:
            assert "natGatewayId" in rt.inputs["routes"][0]
    assert len(run.by_type("aws:ec2/natGateway:NatGateway")) == 1


def test_nat_per_az_in_prod():
    run = run_stack("prod")
    assert len(run.by_type("aws:ec2/natGateway:NatGateway")) == 3
    nat_ids = {rt.inputs["routes"][0]["natGatewayId"] for rt in run.by_type("aws:ec2/routeTable:RouteTable") if "private" in rt.name}
    assert len(nat_ids) == 3


def test_subnet_plan_has_no_overlaps():
    for cidr, n in (("10.0.0.0/16", 2), ("10.0.0.0/16", 3), ("172.16.0.0/20", 6), ("10.1.0.0/24", 4)):
        private, public = subnet_plan(cidr, n)
        import ipaddress

        nets = [ipaddress.ip_network(c) for c in private + public]
        assert len(private) == len(public) == n
        assert all(net.subnet_of(ipaddress.ip_network(cidr)) for net in nets)
        assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1 :])


def test_cluster_auth_endpoint_logging_and_addons():
    run = run_stack("dev")
    c = run.one(CLUSTER).inputs
    assert c["name"] == "training-dev"
    assert c["authenticationMode"] == "API"
    assert c["endpointPrivateAccess"] is True
    assert c["endpointPublicAccess"] is True
    assert c["publicAccessCidrs"] == ["203.0.113.0/24"]
    assert set(c["enabledClusterLogTypes"]) == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    assert c["skipDefaultNodeGroup"] is True
    assert c["corednsAddonOptions"]["enabled"] is False  # created after the node groups (test_cluster_bootstrap.py)
    assert c["createOidcProvider"] is True
    assert c["version"] == "1.34"
    assert c["nodeAssociatePublicIpAddress"] is False
    entry = c["accessEntries"]["admin-0"]
    assert entry["principalArn"] == "arn:aws:iam::123456789012:role/PlatformAdmin"
    assert entry["accessPolicies"]["cluster-admin"]["accessScope"]["type"] == "cluster"
    assert "roleMappings" not in c and "userMappings" not in c


def test_prod_private_endpoint_only_and_kms():
    c = run_stack("prod").one(CLUSTER).inputs
    assert c["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in c
    assert c["encryptionConfigKeyArn"].startswith("arn:aws:kms:")


def test_node_groups_arm_and_x86_in_private_subnets_with_imdsv2():
    run = run_stack("dev")
    subnet_ids = set(run.outputs["privateSubnetIds"])
    groups = {r.name: r.inputs for r in run.by_type(MNG)}
    assert groups["eks-arm"]["amiType"] == "AL2023_ARM_64_STANDARD"
    assert groups["eks-x86"]["amiType"] == "AL2023_x86_64_STANDARD"
    assert groups["eks-arm"]["instanceTypes"] == ["c7g.2xlarge"]
    assert groups["eks-x86"]["instanceTypes"] == ["c6i.2xlarge"]
    templates = {r.name: r for r in run.by_type("aws:ec2/launchTemplate:LaunchTemplate")}
    for name, g in groups.items():
        assert set(g["subnetIds"]) == subnet_ids
        # our launch template, not pulumi-eks's enableIMDSv2 one (hop limit 2: nodejs/eks/nodes/nodegroup.ts)
        assert "enableIMDSv2" not in g and "diskSize" not in g
        template = templates[f"{name}-lt"]
        assert g["launchTemplate"]["id"] == template.id
        assert template.inputs["metadataOptions"] == {"httpEndpoint": "enabled", "httpTokens": "required", "httpPutResponseHopLimit": 1, "instanceMetadataTags": "disabled"}
        ebs = template.inputs["blockDeviceMappings"][0]["ebs"]
        assert ebs["encrypted"] == "true" and ebs["volumeSize"] == 50 and ebs["volumeType"] == "gp3"
        assert g["scalingConfig"] == {"minSize": 2, "maxSize": 4, "desiredSize": 2}
    assert groups["eks-arm"]["labels"]["training-platform/arch"] == "arm64"
    assert groups["eks-x86"]["labels"]["training-platform/arch"] == "amd64"


def test_kubernetes_provider_uses_cluster_kubeconfig_with_server_side_apply():
    run = run_stack("dev")
    p = run.one("pulumi:providers:kubernetes").inputs
    assert p["enableServerSideApply"] == "true"
    assert p["kubeconfig"] == "[secret]"


def test_stack_outputs():
    out = run_stack("dev").outputs
    assert out["clusterName"] == "training-dev"
    assert out["vpcId"].startswith("vpc-")
    assert len(out["privateSubnetIds"]) == 2
    assert out["nodeGroupNames"] == ["training-dev-arm", "training-dev-x86"]
    assert json.loads(out["kubeconfig"])["kind"] == "Config"


def test_bring_your_own_vpc_creates_no_network_and_tags_given_subnets():
    net = {"vpcId": "vpc-0abc12345def67890", "privateSubnetIds": ["subnet-0aaa1111", "subnet-0bbb2222"], "publicSubnetIds": ["subnet-0ccc3333"]}
    cfg = dev_config()
    cfg["training-platform:network"] = net  # the stack file's new-VPC keys (cidr, azCount, natGateways) do nothing with a vpcId: refused
    run = run_config(cfg)
    assert not run.by_type("aws:ec2/vpc:Vpc") and not run.by_type(SUBNET) and not run.by_type("aws:ec2/natGateway:NatGateway")
    assert run.one(CLUSTER).inputs["vpcId"] == net["vpcId"]
    assert run.one(CLUSTER).inputs["privateSubnetIds"] == net["privateSubnetIds"]
    tags = {(t.inputs["resourceId"], t.inputs["key"]) for t in run.by_type("aws:ec2/tag:Tag")}
    assert ("subnet-0aaa1111", "karpenter.sh/discovery") in tags and ("subnet-0bbb2222", "kubernetes.io/role/internal-elb") in tags


def test_every_resource_has_a_parent_component():
    run = run_stack("dev")
    for r in run.registrations:
        assert r.parent, r.urn
        if r.type.startswith(("aws:", "eks:", "kubernetes:")):
            assert "training-platform:" in r.parent, f"{r.urn} is not inside a component"


def test_invalid_config_registers_nothing():
    with pytest.raises(ProgramError) as err:
        run_config(dev_config(nodeGroups={"arm": {"instanceType": "c6i.large"}}))
    assert "training-platform:nodeGroups.arm.instanceType" in str(err.value)
    assert err.value.registrations == []


def test_render_cli_writes_plan_and_fails_cleanly_on_bad_config(tmp_path):
    out = tmp_path / "out"
    ok = subprocess.run([sys.executable, "-m", "tools.render", "--stack", "dev", "--out", str(out)], cwd=PROJECT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "eks:index:Cluster" in ok.stdout
    plan = json.loads((out / "dev" / "plan.json").read_text())
    assert plan["stack"] == "dev"
    assert {"urn", "type", "name", "parent", "inputs", "dependsOn"} <= set(plan["resources"][0])
    bad_stack = PROJECT / "Pulumi.badtest.yaml"
    bad_stack.write_text("config:\n  aws:region: us-west-2\n  training-platform:cluster:\n    version: '1.10'\n")
    try:
        bad = subprocess.run([sys.executable, "-m", "tools.render", "--stack", "badtest", "--out", str(out)], cwd=PROJECT, capture_output=True, text=True)
    finally:
        bad_stack.unlink()
    assert bad.returncode != 0
    assert "training-platform:cluster.version = '1.10'" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (out / "badtest").exists()


def test_vpc_spans_the_zones_jobs_and_efa_are_pinned_to():
    from infra.network import pick_zones

    assert pick_zones(["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"], ["us-west-2d"], 2) == ["us-west-2d", "us-west-2a"]
    assert pick_zones(["a", "b", "c"], [], 2) == ["a", "b"]
    with pytest.raises(ValueError):
        pick_zones(["a", "b"], ["z"], 2)
    run = run_config(dev_config(efa={"enabled": True, "availabilityZone": "us-west-2c"}))
    zones = {s.inputs["availabilityZone"] for s in private_subnets(run)}
    assert "us-west-2c" in zones and len(zones) == 2


def test_more_pinned_zones_than_the_vpc_spans_is_rejected():
    from config.schema import ConfigError
    from config.settings import load_settings

    raw = {"efa": {"enabled": True, "availabilityZone": "us-west-2c"}, "trainjobs": {"ddp": {"enabled": True, "availabilityZone": "us-west-2a"}, "fsdp": {"enabled": True, "availabilityZone": "us-west-2b"}}}
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == "network.azCount"


def test_vpc_flow_logs_on_by_default_scoped_and_can_be_turned_off():
    import json as _json

    run = run_stack("dev")
    flow = run.one("aws:ec2/flowLog:FlowLog").inputs
    assert flow["trafficType"] == "ALL" and flow["logDestinationType"] == "cloud-watch-logs"
    assert run.one("aws:cloudwatch/logGroup:LogGroup", "net-flow-logs").inputs["retentionInDays"] == 30
    policy = _json.loads(run.one("aws:iam/rolePolicy:RolePolicy", "net-flow-logs").inputs["policy"])
    assert all(r.startswith("arn:aws:logs:") for r in policy["Statement"][0]["Resource"])
    off = run_config(dev_config(network={"flowLogRetentionDays": 0}))
    assert not off.by_type("aws:ec2/flowLog:FlowLog")


def test_the_mock_runtime_runs_where_asyncio_run_left_the_thread_no_event_loop():
    """asyncio.run (an ASGI test, a script) ends by unsetting the thread's loop; the render must not care."""
    import asyncio

    from tools.mock_runtime import run_program

    asyncio.run(asyncio.sleep(0))
    assert run_program(PROJECT, "dev").registrations


def test_the_mock_runtime_puts_only_strings_on_sys_path():
    """A project directory given as a pathlib.Path went onto sys.path as one, and torch's inductor,
    which joins sys.path for its compile workers' PYTHONPATH, failed in a later test with
    "TypeError: sequence item 3: expected str instance, PosixPath found" (CI)."""
    import sys

    from tools.mock_runtime import run_program

    run_program(PROJECT, "dev")
    assert all(isinstance(p, str) for p in sys.path), [p for p in sys.path if not isinstance(p, str)]
