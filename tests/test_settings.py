"""Config validation: every bad value is a ConfigError line naming the key, value and what is allowed (all problems of a config in one ConfigErrors)."""

import pytest

from config.schema import ConfigError
from config.settings import is_graviton, job_gpus_per_node, load_settings

GOOD_CLUSTER = {"endpointPublicAccess": True, "publicAccessCidrs": ["203.0.113.0/24"]}


def load(raw, region="us-west-2", stack="dev"):
    return load_settings(raw, stack=stack, region=region)


def test_defaults_are_valid_and_secure():
    s = load({})
    assert s.cluster_name == "training-platform-dev"
    assert s.cluster.endpoint_public_access is False
    assert s.node_groups.arm.instance_type == "c7g.2xlarge"
    assert s.node_groups.x86.instance_type == "c6i.2xlarge"
    assert s.trainer.version == "v2.3.0"
    assert s.gpu_pool.mode == "karpenter"


INVALID = [
    # (raw config, key named in the message, fragment of the allowed text)
    ({"nodeGroups": {"arm": {"instanceType": "c6i.2xlarge"}}}, "nodeGroups.arm.instanceType", "Graviton"),
    ({"nodeGroups": {"x86": {"instanceType": "m7g.xlarge"}}}, "nodeGroups.x86.instanceType", "x86_64"),
    ({"nodeGroups": {"arm": {"instanceType": "not-a-type"}}}, "nodeGroups.arm.instanceType", "EC2 instance type"),
    ({"nodeGroups": {"x86": {"minSize": 5, "maxSize": 3}}}, "nodeGroups.x86.minSize", "maxSize"),
    ({"nodeGroups": {"arm": {"desiredSize": 9}}}, "nodeGroups.arm.desiredSize", "between minSize"),
    ({"nodeGroups": {"arm": {"minSize": "two"}}}, "nodeGroups.arm.minSize", "integer"),
    ({"network": {"cidr": "10.0.0.0/33"}}, "network.cidr", "IPv4 CIDR"),
    ({"network": {"cidr": "10.0.0.1/16"}}, "network.cidr", "IPv4 CIDR"),
    ({"network": {"cidr": "banana"}}, "network.cidr", "IPv4 CIDR"),
    ({"network": {"cidr": "10.0.0.0/8"}}, "network.cidr", "/16 and /24"),
    ({"network": {"azCount": 1}}, "network.azCount", "from 2 to 6"),
    ({"network": {"natGateways": "none"}}, "network.natGateways", "single, perAz"),
    ({"network": {"vpcId": "vpc-0abc12345def67890"}}, "network.privateSubnetIds", "at least 2"),
    ({"network": {"privateSubnetIds": ["subnet-0abc1234"]}}, "network.privateSubnetIds", "vpcId"),
    ({"network": {"vpcId": "my-vpc"}}, "network.vpcId", "VPC id"),
    ({"network": {"azCount": 3, "availabilityZones": ["us-west-2a", "us-west-2b"]}}, "network.availabilityZones", "exactly azCount"),
    ({"cluster": {"version": "1.20"}}, "cluster.version", "1.34"),
    ({"cluster": {"name": "-starts-with-dash"}}, "cluster.name", "letters, digits"),
    ({"cluster": {"name": "has spaces"}}, "cluster.name", "letters, digits"),
    ({"cluster": {"name": "x" * 101}}, "cluster.name", "1-100"),
    ({"cluster": {"endpointPublicAccess": True}}, "cluster.publicAccessCidrs", "non-empty"),
    ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/0"]}}, "cluster.publicAccessCidrs", "0.0.0.0/0 is all of IPv4: refused"),
    # coverage of the address space, not the literal
    ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}}, "cluster.publicAccessCidrs", "cover all of IPv4"),
    ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/2", "192.0.0.0/2"]}}, "cluster.publicAccessCidrs", "cover all of IPv4"),
    ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["64.0.0.0/3"]}}, "cluster.publicAccessCidrs", "wider than /8"),
    ({"cluster": {"endpointPublicAccess": True, "publicAccessCidrs": ["300.1.1.0/24"]}}, "cluster.publicAccessCidrs[0]", "CIDR"),  # a list item: by its index
    ({"cluster": {"publicAccessCidrs": ["203.0.113.0/24"]}}, "cluster.publicAccessCidrs", "endpointPublicAccess"),
    ({"cluster": {"adminPrincipalArns": ["admin"]}}, "cluster.adminPrincipalArns[0]", "ARN"),
    ({"cluster": {"endpointPublicAccess": "yes please"}}, "cluster.endpointPublicAccess", "boolean"),
    ({"netwrok": {}}, "netwrok", "did you mean 'network'"),
    ({"network": {"azCuont": 3}}, "network.azCuont", "did you mean 'azCount'"),
    ({"nodeGroups": {"arm": {"instanceTyp": "c7g.xlarge"}}}, "nodeGroups.arm.instanceTyp", "did you mean 'instanceType'"),
    ({"nodeGroups": {"gpu": {}}}, "nodeGroups.gpu", "allowed keys: arm, x86"),
    ({"cluster": ["not", "an", "object"]}, "cluster", "expected an object"),
]


@pytest.mark.parametrize("raw,key,allowed", INVALID, ids=[case[1] + "-" + str(i) for i, case in enumerate(INVALID)])
def test_invalid_config_is_rejected_with_key_value_and_allowed(raw, key, allowed):
    with pytest.raises(ConfigError) as err:
        load(raw)
    assert err.value.key == key
    msg = str(err.value)
    assert f"training-platform:{key} = " in msg
    assert allowed in msg


def test_bad_region_is_rejected():
    with pytest.raises(ConfigError, match="aws:region"):
        load({}, region="")


def test_default_cluster_name_from_an_invalid_stack_name_is_rejected():
    with pytest.raises(ConfigError, match="cluster.name"):
        load({}, stack="my stack")


@pytest.mark.parametrize(
    "instance_type,arm",
    [("c7g.2xlarge", True), ("m6gd.xlarge", True), ("c6gn.large", True), ("g5g.xlarge", True), ("im4gn.large", True), ("a1.large", True),
     ("c6i.2xlarge", False), ("m5.large", False), ("g5.xlarge", False), ("p5.48xlarge", False), ("m7i-flex.large", False), ("x2idn.16xlarge", False)],
)
def test_graviton_detection(instance_type, arm):
    assert is_graviton(instance_type) is arm


def test_gpus_per_node_defaults_to_all_gpus_of_the_type():
    s = load({"trainjobs": {"ddp": {"enabled": True, "instanceType": "g5.12xlarge"}}})
    assert job_gpus_per_node(s.trainjobs.ddp) == 4
    s = load({"trainjobs": {"ddp": {"enabled": True, "instanceType": "g5.12xlarge", "gpusPerNode": 2}}})
    assert job_gpus_per_node(s.trainjobs.ddp) == 2


def test_bring_your_own_vpc_is_accepted():
    s = load({"network": {"vpcId": "vpc-0abc12345def67890", "privateSubnetIds": ["subnet-0aaa1111", "subnet-0bbb2222"]}})
    assert not s.network.create_vpc


def test_unquoted_numbers_are_read_as_strings_where_strings_are_expected():
    assert load({"cluster": {"version": 1.33}}).cluster.version == "1.33"
    with pytest.raises(ConfigError) as err:
        load({"cluster": {"version": 1.3}})
    assert err.value.key == "cluster.version"


def test_values_of_the_wrong_kind_are_rejected():
    for raw, key in (({"network": {"azCount": True}}, "network.azCount"), ({"trainer": {"runtimes": "torch-distributed-gpu"}}, "trainer.runtimes"), ({"efa": {"enabled": 1}}, "efa.enabled")):
        with pytest.raises(ConfigError) as err:
            load(raw)
        assert err.value.key == key


TOKEN = "hf_" + "q" * 34  # shaped like a Hugging Face token


@pytest.mark.parametrize("raw", [
    {"trainjobs": {"fsdp": {"hfToken": TOKEN}}},  # a key named like a credential
    {"trainjobs": {"fsdp": {"enabled": True, "image": f"registry.example.com/x:{TOKEN} latest"}}},  # a bad value holding one
    {"trainjobs": {"fsdp": {"enabled": True, "extraArgs": ["--token", TOKEN], "epochs": "many"}}},
])
def test_a_config_error_never_echoes_a_secret(raw):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert TOKEN not in str(err.value)
