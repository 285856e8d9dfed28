"""GPU capacity: gpu-pool NodePool, EC2NodeClass, Karpenter's AWS parts, device plugins, EFA."""

import pytest

from config import catalog
from config.schema import ConfigError
from config.settings import load_settings
from k8s.builders import gpu_objects as g
from tests.conftest import dev_config, find, objects, run_config, run_stack
from tools import validate as v

RELEASE = "kubernetes:helm.sh/v3:Release"
EFA_ON = {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["p5.48xlarge"]}


def releases(run):
    return {r.inputs["name"]: r for r in run.by_type(RELEASE)}


def test_catalog_facts_and_derived_values():
    p5 = catalog.lookup("p5.48xlarge")
    assert (p5.gpus, p5.gpu_model, p5.gpu_memory_gib, p5.efa, p5.efa_interfaces) == (8, "H100", 80, True, 32)
    assert catalog.lookup("g5.xlarge").efa is False and catalog.lookup("g5.xlarge").efa_interfaces == 0
    assert catalog.lookup("p4d.24xlarge").efa_interfaces == 4
    assert catalog.lookup("p5en.48xlarge").gpu_model == "H200"
    for fam in ("g5", "g6", "g6e", "gr6", "p4d", "p4de", "p5", "p5e", "p5en"):
        assert fam in catalog.families()
    for inst in catalog.catalog().values():
        assert inst.gpus >= 1 and inst.vcpu >= 4 and inst.memory_gib >= 16
        assert inst.efa or inst.efa_interfaces_per_card == 0


@pytest.mark.parametrize("mode", ["karpenter", "auto"])
def test_gpu_pool_nodepool_in_both_modes(mode):
    run = run_config(dev_config(gpuPool={"mode": mode}))
    pool = find(run, "NodePool", "gpu-pool")
    spec = pool["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in spec["taints"]
    reqs = {r["key"]: r["values"] for r in spec["requirements"]}
    assert reqs["kubernetes.io/arch"] == ["amd64"]
    assert reqs["karpenter.sh/capacity-type"] == ["on-demand"]
    cat_key = "eks.amazonaws.com/instance-category" if mode == "auto" else "karpenter.k8s.aws/instance-category"
    assert reqs[cat_key] == ["g", "p"]
    assert pool["spec"]["limits"]["nvidia.com/gpu"] == "16"
    assert pool["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"
    assert spec["expireAfter"] == "Never"
    ref = spec["nodeClassRef"]
    if mode == "auto":
        assert ref == {"group": "eks.amazonaws.com", "kind": "NodeClass", "name": "default"}
        assert "karpenter" not in releases(run) and "nvidia-device-plugin" not in releases(run)
        assert run.one("eks:index:Cluster").inputs["autoMode"]["enabled"] is True
        assert len(run.by_type("eks:index:ManagedNodeGroup")) == 2
    else:
        assert ref == {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "gpu"}
        assert "autoMode" not in run.one("eks:index:Cluster").inputs


def test_karpenter_mode_plan_has_release_iam_queue_and_rules():
    run = run_stack("dev")
    rel = releases(run)["karpenter"].inputs
    assert rel["chart"] == "oci://public.ecr.aws/karpenter/karpenter" and rel["version"] == "1.14.1"
    assert rel["values"]["settings"] == {"clusterName": "training-dev", "interruptionQueue": "training-dev-karpenter", "featureGates": {"nodeRepair": True}}
    assert rel["values"]["affinity"]["nodeAffinity"]  # controller stays on managed node groups
    roles = {r.inputs["name"] for r in run.by_type("aws:iam/role:Role") if "name" in r.inputs}
    assert {"training-dev-karpenter-node", "training-dev-karpenter-controller"} <= roles
    entry = run.one("aws:eks/accessEntry:AccessEntry").inputs
    assert entry["type"] == "EC2_LINUX"
    assoc = run.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", "gpu-karpenter").inputs
    assert (assoc["namespace"], assoc["serviceAccount"]) == ("kube-system", "karpenter")
    queue = run.one("aws:sqs/queue:Queue").inputs
    assert queue["name"] == "training-dev-karpenter" and queue["sqsManagedSseEnabled"] is True
    patterns = [r.inputs["eventPattern"] for r in run.by_type("aws:cloudwatch/eventRule:EventRule")]
    assert len(patterns) == 5 and any("Spot Instance Interruption" in p for p in patterns)
    assert len(run.by_type("aws:cloudwatch/eventTarget:EventTarget")) == 5
    sg_tags = [t.inputs for t in run.by_type("aws:ec2/tag:Tag") if t.inputs["key"] == "karpenter.sh/discovery"]
    assert sg_tags and sg_tags[0]["resourceId"].startswith("sg-")
    # the controller release waits for its identity before starting
    karp = releases(run)["karpenter"]
    assert any("PodIdentityAssociation" in d for d in karp.depends_on)


def test_controller_policy_is_scoped_to_the_cluster():
    from infra.gpu_aws import karpenter_controller_policy

    pol = karpenter_controller_policy(cluster_name="c1", region="us-west-2", account="123456789012", node_role_arn="arn:aws:iam::123456789012:role/n", queue_arn="arn:aws:sqs:us-west-2:123456789012:q")
    by_sid = {s["Sid"]: s for s in pol["Statement"]}
    assert by_sid["AllowPassingInstanceRole"]["Resource"] == "arn:aws:iam::123456789012:role/n"
    assert by_sid["AllowScopedDeletion"]["Condition"]["StringEquals"] == {"aws:ResourceTag/kubernetes.io/cluster/c1": "owned"}
    assert by_sid["AllowInterruptionQueueActions"]["Resource"].endswith(":q")
    for s in pol["Statement"]:
        mutating = [a for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]) if not a.split(":")[1].startswith(("Describe", "Get", "List"))]
        if mutating and s["Resource"] == "*":
            pytest.fail(f"{s['Sid']} allows {mutating} on every resource")


def test_ec2_node_class_secure_defaults():
    run = run_stack("dev")
    nc = find(run, "EC2NodeClass", "gpu")["spec"]
    assert nc["role"] == "training-dev-karpenter-node"
    assert nc["metadataOptions"]["httpTokens"] == "required"
    assert nc["metadataOptions"]["httpPutResponseHopLimit"] == 1
    assert nc["amiSelectorTerms"][0]["alias"].startswith("al2023@v")
    assert "latest" not in nc["amiSelectorTerms"][0]["alias"]
    assert nc["blockDeviceMappings"][0]["ebs"]["volumeSize"] == "200Gi"
    assert nc["blockDeviceMappings"][0]["ebs"]["encrypted"] is True
    assert nc["subnetSelectorTerms"] == [{"tags": {"karpenter.sh/discovery": "training-dev"}}]
    assert nc["associatePublicIPAddress"] is False


def test_nvidia_plugin_schedules_on_gpu_pool_nodes_and_tolerates_taint():
    values = releases(run_stack("dev"))["nvidia-device-plugin"].inputs["values"]
    assert g.GPU_TOLERATION in values["tolerations"]
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": g.POOL_LABEL, "operator": "Exists"} in terms[0]["matchExpressions"]


def test_efa_on_creates_plugin_placement_group_security_group_and_efa_pool():
    run = run_config(dev_config(efa=EFA_ON))
    rel = releases(run)["aws-efa-k8s-device-plugin"].inputs
    assert rel["version"] == "0.5.30" and g.GPU_TOLERATION in rel["values"]["tolerations"]
    pg = run.one("aws:ec2/placementGroup:PlacementGroup").inputs
    assert pg["strategy"] == "cluster" and pg["name"] == "training-dev-efa"
    ingress = run.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule", "gpu-efa-in-self").inputs
    egress = run.one("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule", "gpu-efa-out-self").inputs
    for rule in (ingress, egress):
        assert rule["ipProtocol"] == "-1" and rule["referencedSecurityGroupId"] == rule["securityGroupId"]
    pool = find(run, "NodePool", "gpu-efa")
    reqs = {r["key"]: r["values"] for r in pool["spec"]["template"]["spec"]["requirements"]}
    assert reqs["topology.kubernetes.io/zone"] == ["us-west-2a"]
    assert reqs["node.kubernetes.io/instance-type"] == ["p5.48xlarge"]
    nc = find(run, "EC2NodeClass", "gpu-efa")["spec"]
    assert nc["placementGroupSelector"] == {"name": "training-dev-efa"}
    nics = nc["networkInterfaces"]
    assert len(nics) == 33  # the ENA primary and 32 EFA-only interfaces: 32 EFA devices (tests/test_efa.py)
    assert nics[0] == {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    assert all(n["interfaceType"] == "efa-only" for n in nics[1:])
    assert {"tags": {"training-platform/efa": "training-dev"}} in nc["securityGroupSelectorTerms"]


def test_efa_in_auto_mode_uses_auto_node_class_and_no_plugins():
    run = run_config(dev_config(gpuPool={"mode": "auto"}, efa=EFA_ON))
    pool = find(run, "NodePool", "gpu-efa")
    assert pool["spec"]["template"]["spec"]["nodeClassRef"]["name"] == "default"
    assert not {"karpenter", "nvidia-device-plugin", "aws-efa-k8s-device-plugin"} & set(releases(run))
    assert not run.by_type("aws:ec2/placementGroup:PlacementGroup")


@pytest.mark.parametrize("stack_overrides", [{}, {"gpuPool": {"mode": "auto"}}, {"efa": EFA_ON}, {"efa": {**EFA_ON, "instanceTypes": ["p5.48xlarge", "p4d.24xlarge", "p5en.48xlarge"]}}])
def test_karpenter_manifests_validate_against_crd_schemas(need_schemas, stack_overrides):
    run = run_config(dev_config(**stack_overrides))
    checked = 0
    for obj in objects(run).values():
        if obj["apiVersion"].startswith("karpenter."):
            assert v.validate(obj) == []
            checked += 1
    assert checked >= 1


def test_schema_validation_rejects_unknown_fields(need_schemas):
    pool = g.gpu_node_pool(load_settings({}, stack="dev", region="us-west-2").gpu_pool, g.ec2_node_class_ref("gpu"))
    pool["spec"]["template"]["spec"]["taint"] = []  # typo of "taints"
    problems = v.validate(pool)
    assert problems and "taint" in problems[0]


GPU_INVALID = [
    ({"gpuPool": {"mode": "fargate"}}, "gpuPool.mode"),
    ({"gpuPool": {"capacityTypes": ["preemptible"]}}, "gpuPool.capacityTypes[0]"),
    ({"gpuPool": {"instanceTypes": ["m5.large"]}}, "gpuPool.instanceTypes[0]"),  # every bad member by its index
    ({"gpuPool": {"instanceFamilies": ["g4dn"]}}, "gpuPool.instanceFamilies[0]"),
    ({"gpuPool": {"instanceTypes": ["p5.48xlarge"], "gpuLimit": 4}}, "gpuPool.gpuLimit"),
    ({"gpuPool": {"gpuLimit": 0}}, "gpuPool.gpuLimit"),
    ({"gpuPool": {"instanceCategories": ["g"], "instanceFamilies": ["p5"]}}, "gpuPool.instanceTypes"),
    ({"efa": {"enabled": True, "availabilityZone": "us-west-2a", "instanceTypes": ["g5.xlarge"]}}, "efa.instanceTypes[0]"),
    ({"efa": {"enabled": True}}, "efa.availabilityZone"),
    ({"efa": {"enabled": True, "availabilityZone": "eu-west-1a"}}, "efa.availabilityZone"),
    ({"network": {"availabilityZones": ["us-west-2a", "us-west-2b"]}, "efa": {"enabled": True, "availabilityZone": "us-west-2c"}}, "efa.availabilityZone"),
    ({"gpuPool": {"expireAfter": "forever"}}, "gpuPool.expireAfter"),
]


@pytest.mark.parametrize("raw,key", GPU_INVALID, ids=[c[1] for c in GPU_INVALID])
def test_gpu_config_rejections(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert err.value.key == key
