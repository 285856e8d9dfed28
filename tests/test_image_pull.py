"""The image pull levers of the GPU pool (docs/time-to-first-step.md): gpuPool.rootVolumeThroughput,
rootVolumeIops, instanceStorePolicy and fastImagePull. Off by default (the shipped stacks' node
classes stay as they were); each reaches the EC2NodeClass as Karpenter v1.14.1's CRD spells it."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from config.schema import ConfigError, ConfigErrors
from config.settings import load_settings
from k8s.builders import gpu_objects as g

NODE_CLASS = {"name": "gpu", "cluster_name": "training-dev", "node_role": "gpu-node-role", "root_volume_gib": 200, "tags": {"team": "ml"}}


def settings(**pool):
    return load_settings({"gpuPool": pool}, stack="dev", region="us-west-2")


def refused(**pool) -> ConfigErrors:
    with pytest.raises(ConfigError) as err:
        settings(**pool)
    assert isinstance(err.value, ConfigErrors) and len(str(err.value).splitlines()) == 1, str(err.value)
    return err.value


def test_unset_levers_leave_the_node_class_as_it_was():
    spec = g.ec2_node_class(**NODE_CLASS, **settings().gpu_pool.node_class_storage())["spec"]
    assert spec["blockDeviceMappings"] == [{"deviceName": "/dev/xvda", "ebs": {"volumeSize": "200Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True}}]
    assert not {"instanceStorePolicy", "userData"} & spec.keys()


def test_each_lever_reaches_the_node_class():
    pool = settings(rootVolumeThroughput=1000, rootVolumeIops=4000, instanceStorePolicy="RAID0", fastImagePull=True).gpu_pool
    spec = g.ec2_node_class(**NODE_CLASS, **pool.node_class_storage())["spec"]
    assert spec["blockDeviceMappings"][0]["ebs"] == {"volumeSize": "200Gi", "volumeType": "gp3", "encrypted": True, "deleteOnTermination": True, "throughput": 1000, "iops": 4000}
    assert spec["instanceStorePolicy"] == "RAID0"
    # the NodeConfig nodeadm reads: the gate alone, nothing Karpenter's own NodeConfig sets
    assert yaml.safe_load(spec["userData"]) == {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig", "spec": {"featureGates": {"FastImagePull": True}}}


def test_throughput_alone_and_raid0_alone():
    spec = g.ec2_node_class(**NODE_CLASS, **settings(rootVolumeThroughput=500, rootVolumeIops=2000 * 2).gpu_pool.node_class_storage())["spec"]
    assert (spec["blockDeviceMappings"][0]["ebs"]["throughput"], spec["blockDeviceMappings"][0]["ebs"]["iops"]) == (500, 4000)
    assert "userData" not in spec and "instanceStorePolicy" not in spec
    spec = g.ec2_node_class(**NODE_CLASS, **settings(instanceStorePolicy="RAID0", fastImagePull=True).gpu_pool.node_class_storage())["spec"]
    assert "throughput" not in spec["blockDeviceMappings"][0]["ebs"] and spec["instanceStorePolicy"] == "RAID0" and "userData" in spec


def test_the_node_class_fits_karpenters_crd(need_schemas):
    from tools.validate import raw_crd_schema

    schema = raw_crd_schema("karpenter.k8s.aws/v1", "EC2NodeClass")
    assert schema is not None
    pool = settings(rootVolumeThroughput=1000, rootVolumeIops=16000, instanceStorePolicy="RAID0", fastImagePull=True).gpu_pool
    obj = g.ec2_node_class(**NODE_CLASS, **pool.node_class_storage())
    jsonschema.validate(obj["spec"], schema["properties"]["spec"])
    ebs = schema["properties"]["spec"]["properties"]["blockDeviceMappings"]["items"]["properties"]["ebs"]["properties"]
    # the bounds the settings take are the CRD's (throughput) and gp3's (IOPS, in the CRD's description)
    assert "Maximum value of 1000" in ebs["throughput"]["description"] and "gp3: 3,000-16,000 IOPS" in ebs["iops"]["description"]
    assert schema["properties"]["spec"]["properties"]["instanceStorePolicy"]["enum"] == ["RAID0"]


@pytest.mark.parametrize(
    "pool,key,words",
    [
        ({"rootVolumeThroughput": 1001}, "gpuPool.rootVolumeThroughput", "125 to 1000"),
        ({"rootVolumeThroughput": 124}, "gpuPool.rootVolumeThroughput", "125 to 1000"),
        ({"rootVolumeIops": 16001}, "gpuPool.rootVolumeIops", "3000 to 16000"),
        # 3000 IOPS (gp3's baseline) carry at most 750 MiB/s
        ({"rootVolumeThroughput": 751}, "gpuPool.rootVolumeThroughput", "rootVolumeIops of 3004 or more"),
        ({"rootVolumeThroughput": 1000, "rootVolumeIops": 3999}, "gpuPool.rootVolumeThroughput", "rootVolumeIops of 4000 or more"),
        ({"instanceStorePolicy": "RAID1"}, "gpuPool.instanceStorePolicy", "RAID0"),
        # parallel pull onto a root volume at gp3's baseline: the AMI project's guide says it may be slower
        ({"fastImagePull": True}, "gpuPool.fastImagePull", "rootVolumeThroughput of 600 or more"),
        ({"fastImagePull": True, "rootVolumeThroughput": 599}, "gpuPool.fastImagePull", "instanceStorePolicy RAID0"),
        # Auto Mode's built-in NodeClass: the keys would do nothing
        ({"mode": "auto", "fastImagePull": True}, "gpuPool.fastImagePull", "gpuPool.mode karpenter"),
        ({"mode": "auto", "instanceStorePolicy": "RAID0"}, "gpuPool.instanceStorePolicy", "gpuPool.mode karpenter"),
        ({"mode": "auto", "rootVolumeThroughput": 500}, "gpuPool.rootVolumeThroughput", "gpuPool.mode karpenter"),
        ({"fastImagePul": True}, "gpuPool.fastImagePul", "fastImagePull"),
    ],
)
def test_each_bad_setting_is_one_line_naming_its_key(pool, key, words):
    err = refused(**pool)
    assert err.keys == [key] and words in str(err), str(err)


def test_fast_pull_passes_with_throughput_or_raid0():
    assert settings(fastImagePull=True, rootVolumeThroughput=600, rootVolumeIops=2400 + 600).gpu_pool.fast_image_pull
    assert settings(fastImagePull=True, instanceStorePolicy="RAID0").gpu_pool.fast_image_pull


def test_fast_pull_refuses_a_pool_nodeadm_would_ignore_it_on(monkeypatch):
    """nodeadm skips the gate below 4 vCPUs or 7 GiB; no catalog type is that small today, so a
    smaller one stands in for a future entry."""
    from config import catalog, infra_models

    real = catalog.types_in_pool

    def with_small(*args):
        found = real(*args)
        return [*found, type(found[0])(**{**found[0].__dict__, "name": "g9.medium", "vcpu": 2, "memory_gib": 8})]

    monkeypatch.setattr(infra_models.catalog, "types_in_pool", with_small)
    err = refused(fastImagePull=True, instanceStorePolicy="RAID0")
    assert err.keys == ["gpuPool.fastImagePull"] and "g9.medium" in str(err)


def test_the_stack_passes_the_levers_to_every_gpu_node_class():
    """prod's gpu node class and its EFA pools' (a placement group and EFA interfaces each)."""
    from tests.conftest import objects, run_config, stack_file

    cfg = stack_file("prod")["config"]
    cfg = {**cfg, "training-platform:gpuPool": {**cfg["training-platform:gpuPool"], "instanceStorePolicy": "RAID0", "fastImagePull": True}}
    classes = [o for o in objects(run_config(cfg, "prod")).values() if o["kind"] == "EC2NodeClass"]
    assert len(classes) == 3
    for nc in classes:
        assert nc["spec"]["instanceStorePolicy"] == "RAID0" and nc["spec"]["userData"] == g.FAST_IMAGE_PULL_NODE_CONFIG, nc["metadata"]["name"]
