"""Teams (tenants): namespaces, quotas, isolation, namespace-scoped access, Kueue queues."""

from __future__ import annotations

import pytest
import yaml

from config.schema import ConfigError, ConfigErrors
from config.settings import load_settings
from k8s.builders import kueue as kq
from k8s.builders import tenants as tn
from tests.conftest import dev_config, find, objects, run_config
from tools import validate as v

VISION = "arn:aws:iam::123456789012:role/VisionTeam"
NLP = "arn:aws:iam::123456789012:role/NlpTeam"
TEAMS = {"vision": {"gpuQuota": 16, "principalArns": [VISION]}, "nlp": {"gpuQuota": 8, "principalArns": [NLP], "namespaceViewPolicy": True}}
TWO_TEAMS = {"gpuPool": {"gpuLimit": 32}, "tenants": TEAMS}
ACCESS_ENTRY = "aws:eks/accessEntry:AccessEntry"
POLICY_ASSOCIATION = "aws:eks/accessPolicyAssociation:AccessPolicyAssociation"
HELM = "kubernetes:helm.sh/v3:Release"


def two_teams(**more):
    return run_config(dev_config(**TWO_TEAMS, **more))


def of_kind(run, kind: str, ns: str | None = None) -> list[dict]:
    return [o for o in objects(run).values() if o["kind"] == kind and (ns is None or o["metadata"].get("namespace") == ns)]


def test_two_teams_get_namespace_quota_queue_limits_isolation_and_access():
    run = two_teams()
    for team, gpus, arn in (("vision", 16, VISION), ("nlp", 8, NLP)):
        ns = find(run, "Namespace", team)
        assert ns["metadata"]["labels"][tn.TEAM_LABEL] == team
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"  # baseline allows nfs volumes and root (issue: tenant isolation)
        cq = find(run, "ClusterQueue", f"team-{team}")["spec"]
        assert cq["cohortName"] == kq.COHORT
        assert cq["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": team}}
        flavors = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in cq["resourceGroups"][0]["flavors"]}
        assert list(flavors) == [kq.SYSTEM_FLAVOR, "gpu-pool"]  # CPU-only pod sets first, then the GPU pool
        assert flavors["gpu-pool"][kq.GPU] == gpus
        assert flavors[kq.SYSTEM_FLAVOR][kq.GPU] == 0 and flavors[kq.SYSTEM_FLAVOR]["cpu"] != "0"
        assert [lq["spec"]["clusterQueue"] for lq in of_kind(run, "LocalQueue", team)] == [f"team-{team}"]
        assert [lq["metadata"]["name"] for lq in of_kind(run, "LocalQueue", team)] == [tn.LOCAL_QUEUE]
        (rq,) = of_kind(run, "ResourceQuota", team)
        assert int(rq["spec"]["hard"]["requests.nvidia.com/gpu"]) >= gpus  # with Kueue: the borrowing ceiling
        (lr,) = of_kind(run, "LimitRange", team)
        assert lr["spec"]["limits"][0]["defaultRequest"] == tn.DEFAULT_REQUESTS and lr["spec"]["limits"][0]["default"]["memory"]
        netpols = {p["metadata"]["name"]: p for p in of_kind(run, "NetworkPolicy", team)}
        assert set(netpols) == {"team-isolation", "egress"}
        assert netpols["team-isolation"]["spec"]["policyTypes"] == ["Ingress"] and netpols["egress"]["spec"]["policyTypes"] == ["Egress"]
        (binding,) = of_kind(run, "RoleBinding", team)
        assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": tn.team_group(team)}]
        assert binding["roleRef"]["kind"] == "Role"  # never a ClusterRole
        (pvc,) = of_kind(run, "PersistentVolumeClaim", team)
        assert pvc["metadata"]["name"] == tn.CHECKPOINT_CLAIM
        (entry,) = [r for r in run.by_type(ACCESS_ENTRY) if r.inputs.get("principalArn") == arn]
        assert entry.inputs["kubernetesGroups"] == [tn.team_group(team)] and entry.inputs["type"] == "STANDARD"
    (view,) = run.by_type(POLICY_ASSOCIATION)
    assert view.inputs["principalArn"] == NLP and view.inputs["accessScope"] == {"type": "namespace", "namespaces": ["nlp"]}
    assert run.outputs["teamNamespaces"] == {"vision": "vision", "nlp": "nlp"}


def test_no_tenant_principal_gets_cluster_scope_anywhere_in_the_plan():
    run = two_teams()
    tenant_arns = {VISION, NLP}
    scopes = []
    for r in run.by_type(POLICY_ASSOCIATION):
        if r.inputs["principalArn"] in tenant_arns:
            scopes.append(r.inputs["accessScope"])
    for r in run.by_type("eks:index:Cluster"):  # the cluster component's own (admin) entries
        for entry in (r.inputs.get("accessEntries") or {}).values():
            assert entry["principalArn"] not in tenant_arns
    assert scopes and all(s["type"] == "namespace" and s["namespaces"] in (["vision"], ["nlp"]) for s in scopes)
    for r in run.by_type(ACCESS_ENTRY):
        if r.inputs["principalArn"] in tenant_arns:
            assert not any(g.startswith("system:") for g in r.inputs["kubernetesGroups"])
    # cluster-wide, a team group is bound only to reading the ClusterTrainingRuntimes
    cluster_wide = [o for o in objects(run).values() if o["kind"] == "ClusterRoleBinding" and any(s.get("name", "").startswith("training-platform:team:") for s in o.get("subjects", []))]
    assert [(b["metadata"]["name"], b["roleRef"]["name"]) for b in cluster_wide] == [(tn.RUNTIME_READER, tn.RUNTIME_READER)]
    assert find(run, "ClusterRole", tn.RUNTIME_READER)["rules"] == tn.RUNTIME_READER_RULES


def test_team_role_is_exactly_trainjobs_configmaps_and_reading_pods_logs_events():
    run = two_teams()
    (role,) = of_kind(run, "Role", "vision")
    grants = {(g, r, verb) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for verb in rule["verbs"]}
    crud = {"create", "delete", "get", "list", "watch"}
    read = {"get", "list", "watch"}
    expected = (
        {("trainer.kubeflow.org", "trainjobs", verb) for verb in crud}
        | {("", "configmaps", verb) for verb in crud}
        | {("", "secrets", verb) for verb in ("create", "update", "delete")}  # write-only: for secretEnv, never read back
        | {("", "pods", verb) for verb in read}
        | {("", "events", verb) for verb in read}
        | {("", "pods/log", "get")}
        | {("", "pods/exec", "create"), ("", "pods/exec", "get")}  # kubectl exec: POST (SPDY) and GET (WebSocket; 1.35+ also checks create)
        | {("jobset.x-k8s.io", "jobsets", verb) for verb in read}  # debugging reads only: no JobSet or Job of their own
        | {("batch", "jobs", verb) for verb in read}
        | {("", "resourcequotas", verb) for verb in read}  # its own caps, read-only
        | {("trainer.kubeflow.org", "trainingruntimes", verb) for verb in read}
        | {("kueue.x-k8s.io", r, verb) for r in ("workloads", "localqueues") for verb in read}
        | {("visibility.kueue.x-k8s.io", "localqueues/pendingworkloads", verb) for verb in read}
    )
    assert grants == expected
    # cluster-wide: only reading the ClusterTrainingRuntimes, bound to the teams' groups
    reader = find(run, "ClusterRole", tn.RUNTIME_READER)
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in reader["rules"]] == [(["trainer.kubeflow.org"], ["clustertrainingruntimes"], ["get", "list", "watch"])]
    binding = find(run, "ClusterRoleBinding", tn.RUNTIME_READER)
    assert binding["roleRef"]["name"] == reader["metadata"]["name"]
    assert sorted(s["name"] for s in binding["subjects"]) == sorted(tn.team_group(t) for t in ("vision", "nlp"))
    assert not any("*" in item for grant in grants for item in grant)
    assert not any(rule.get("resourceNames") or rule.get("nonResourceURLs") for rule in role["rules"])


def _admits(policy: dict, *, source_ns: str) -> bool:
    """NetworkPolicy ingress semantics for the subset the platform writes: does a pod in
    ``source_ns`` reach a selected pod of the policy's namespace?"""
    own = policy["metadata"]["namespace"]
    for rule in policy["spec"].get("ingress", []):
        for peer in rule.get("from", []):
            if "ipBlock" in peer:
                return True
            ns_sel = peer.get("namespaceSelector")
            if ns_sel is None and source_ns == own:  # podSelector alone: the policy's own namespace
                return True
            if ns_sel == {}:  # every namespace
                return True
            if ns_sel and ns_sel.get("matchLabels", {}).get("kubernetes.io/metadata.name") == source_ns:
                return True
        if not rule.get("from"):  # an empty from admits everything
            return True
    return False


def test_network_policy_admits_own_namespace_and_denies_other_teams():
    run = two_teams()
    for team, other in (("vision", "nlp"), ("nlp", "vision")):
        (policy,) = [p for p in of_kind(run, "NetworkPolicy", team) if p["metadata"]["name"] == "team-isolation"]
        assert policy["spec"]["podSelector"] == {}  # every pod of the namespace
        assert _admits(policy, source_ns=team)
        assert not _admits(policy, source_ns=other)
        assert not _admits(policy, source_ns="training")
        # every port: the rendezvous port (29500) and NCCL's ephemeral ones
        assert all("ports" not in rule for rule in policy["spec"]["ingress"])


def test_network_policy_enforcement_is_turned_on_in_the_vpc_cni_add_on():
    cluster = two_teams().one("eks:index:Cluster").inputs
    assert cluster["vpcCniOptions"]["enableNetworkPolicy"] is True
    assert "vpcCniOptions" not in run_config(dev_config()).one("eks:index:Cluster").inputs  # no teams: unchanged


def test_kueue_objects_validate_against_their_crds_and_cel(need_schemas):
    objs = list(objects(two_teams()).values())
    kinds = {o["kind"] for o in objs if o["apiVersion"] == kq.API_VERSION}
    assert kinds == {"ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"}
    for obj in objs:
        if obj["apiVersion"].startswith("kueue.x-k8s.io/"):
            assert v.raw_crd_schema(obj["apiVersion"], obj["kind"]) is not None
            assert v.validate(obj) == []


def test_team_built_in_objects_validate(need_schemas):
    run = two_teams()
    kinds = set()
    for obj in objects(run).values():
        if obj["metadata"].get("labels", {}).get(tn.TEAM_LABEL) or obj["metadata"].get("namespace") in ("vision", "nlp", tn.STORAGE_NAMESPACE):
            if obj["apiVersion"].startswith("kueue."):
                continue
            assert v.validate(obj) == [], obj["kind"]
            kinds.add(obj["kind"])
    assert {"Namespace", "ResourceQuota", "LimitRange", "NetworkPolicy", "Role", "RoleBinding", "PersistentVolume", "PersistentVolumeClaim", "Job"} <= kinds


def test_kueue_crd_facts_the_builders_rely_on(need_schemas):
    path = v.schemas_dir() / "kueue" / v.KUEUE_SCHEMA_VERSION / "kueue.x-k8s.io_clusterqueues.yaml"
    crd = yaml.load(path.read_text(), Loader=v._LOADER)
    versions = {ver["name"]: ver for ver in crd["spec"]["versions"]}
    assert versions["v1beta2"]["storage"] is True and versions["v1beta2"]["served"] is True
    spec = lambda ver: versions[ver]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]  # noqa: E731
    assert "cohortName" in spec("v1beta2") and "cohort" not in spec("v1beta2")
    assert "cohort" in spec("v1beta1")
    # a flavor lists every covered resource: dropping one breaks the CRD's rule
    cq = kq.cluster_queue("q", namespace="ns", quotas={"gpu-pool": {"cpu": "1", "memory": "1Gi", kq.GPU: 1, kq.EFA: 0}})
    assert v.validate(cq) == []
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()
    assert any("same number of resources" in p for p in v.validate(cq))


def test_kueue_release_values_and_order():
    run = two_teams()
    rel = {r.name: r for r in run.by_type(HELM)}
    kueue = rel["kueue"]
    assert (kueue.inputs["chart"], kueue.inputs["version"], kueue.inputs["namespace"]) == ("oci://registry.k8s.io/kueue/charts/kueue", "0.19.2", kq.KUEUE_NAMESPACE)
    assert rel["kubeflow-trainer"].urn in kueue.depends_on  # the TrainJob CRD exists before the integration starts
    config = yaml.safe_load(kueue.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
    assert config["integrations"]["frameworks"] == [kq.TRAINJOB_FRAMEWORK]
    assert config["waitForPodsReady"]["timeout"] == "26m" and config["waitForPodsReady"]["blockAdmission"] is False
    assert kueue.inputs["values"]["controllerManager"]["manager"]["image"]["tag"] == "v0.19.2"
    for r in run.registrations:  # every Kueue object waits for the release (its webhook serves)
        if r.type == "kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue":
            assert kueue.urn in r.depends_on


def test_stack_jobs_carry_the_queue_label_only_with_kueue():
    on = two_teams()
    for job in of_kind(on, "TrainJob"):
        assert job["metadata"]["labels"][tn.QUEUE_LABEL] == tn.LOCAL_QUEUE
    (lq,) = of_kind(on, "LocalQueue", "training")
    assert lq["spec"]["clusterQueue"] == kq.TRAINING_QUEUE
    training_cq = find(on, "ClusterQueue", kq.TRAINING_QUEUE)["spec"]
    quota = {r["name"]: r["nominalQuota"] for f in training_cq["resourceGroups"][0]["flavors"] if f["name"] == "gpu-pool" for r in f["resources"]}
    assert quota[kq.GPU] == 32 - 16 - 8  # what the teams leave of the pool
    lq_urn = next(r.urn for r in on.registrations if r.type.endswith(":LocalQueue") and r.inputs["metadata"]["namespace"] == "training")
    for r in on.registrations:
        if r.type.endswith(":TrainJob"):
            assert lq_urn in r.depends_on
    off = run_config(dev_config())
    assert of_kind(off, "TrainJob") and all(tn.QUEUE_LABEL not in j["metadata"]["labels"] for j in of_kind(off, "TrainJob"))
    assert not [r for r in off.by_type(HELM) if r.name == "kueue"]


def test_trainer_v2_1_0_teams_get_resource_quota_only():
    run = run_config(dev_config(trainer={"version": "v2.1.0"}, **TWO_TEAMS))
    assert not [r for r in run.by_type(HELM) if r.name == "kueue"]
    assert not [o for o in objects(run).values() if o["apiVersion"].startswith("kueue.")]
    for team, gpus in (("vision", 16), ("nlp", 8)):
        (rq,) = of_kind(run, "ResourceQuota", team)
        assert rq["spec"]["hard"]["requests.nvidia.com/gpu"] == str(gpus)


def test_kueue_with_trainer_v2_1_0_is_refused_saying_why():
    with pytest.raises(ConfigError) as err:
        load_settings({"trainer": {"version": "v2.1.0"}, "kueue": {"enabled": True}}, stack="dev", region="us-west-2")
    assert err.value.key == "kueue.enabled"
    assert "runtimePatches" in str(err.value) and "ResourceQuota only" in str(err.value)


def test_team_checkpoints_are_the_teams_own_directory():
    fsx = two_teams()
    pv = find(fsx, "PersistentVolume", "vision-checkpoints")["spec"]["csi"]
    assert pv["volumeAttributes"]["mountname"].endswith("/tenants/vision") and pv["volumeHandle"].endswith("/tenants/vision")
    (job,) = of_kind(fsx, "Job", tn.STORAGE_NAMESPACE)
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "/fs/tenants/nlp" in script and "/fs/tenants/vision" in script
    efs = run_config(dev_config(trainjobs={"checkpointStorage": {"type": "efs"}}, **TWO_TEAMS))
    aps = {r.name: r.inputs for r in efs.by_type("aws:efs/accessPoint:AccessPoint")}
    assert aps["vision-checkpoints"]["rootDirectory"]["path"] == "/tenants/vision"
    assert aps["vision-checkpoints"]["rootDirectory"]["creationInfo"]["permissions"] == "0750"
    assert "::" in find(efs, "PersistentVolume", "vision-checkpoints")["spec"]["csi"]["volumeHandle"]
    assert not [j for j in of_kind(efs, "Job") if j["metadata"]["namespace"] == "tenant-storage"]


BAD_TEAMS = [
    ({"tenants": {"Vision": {"gpuQuota": 1}}}, "tenants.Vision"),
    ({"tenants": {"vision": {"gpuQoota": 1}}}, "tenants.vision.gpuQoota"),
    ({"tenants": {"vision": {}}}, "tenants.vision.gpuQuota"),
    ({"tenants": {"vision": {"gpuQuota": 0}}}, "tenants.vision.gpuQuota"),
    ({"tenants": {"kube-system": {"gpuQuota": 1}}}, "tenants.kube-system"),
    ({"tenants": {"vision": {"gpuQuota": 1, "namespace": "training"}}}, "tenants.vision.namespace"),
    ({"tenants": {"a": {"gpuQuota": 1, "namespace": "x"}, "b": {"gpuQuota": 1, "namespace": "x"}}}, "tenants.b.namespace"),
    ({"tenants": {"vision": {"gpuQuota": 1, "principalArns": ["VisionTeam"]}}}, "tenants.vision.principalArns[0]"),  # a list item: by its index
    ({"tenants": {"a": {"gpuQuota": 1, "principalArns": [VISION]}, "b": {"gpuQuota": 1, "principalArns": [VISION]}}}, "tenants.b.principalArns[0]"),
    ({"cluster": {"adminPrincipalArns": [VISION]}, "tenants": {"a": {"gpuQuota": 1, "principalArns": [VISION]}}}, "tenants.a.principalArns[0]"),
    ({"tenants": {"a": {"gpuQuota": 1, "principalArns": ["arn:aws-cn:iam::123456789012:role/A"]}}}, "tenants.a.principalArns[0]"),
    ({"tenants": {"a": {"gpuQuota": 12}, "b": {"gpuQuota": 8}}}, "tenants"),
    ({"gpuPool": {"mode": "auto"}, "tenants": {"a": {"gpuQuota": 1}}}, "tenants"),
    ({"tenants": {"a": {"gpuQuota": 1, "cpuQuota": "lots"}}}, "tenants.a.cpuQuota"),
]


@pytest.mark.parametrize("raw,key", BAD_TEAMS, ids=[f"{i}-{c[1]}" for i, c in enumerate(BAD_TEAMS)])
def test_bad_team_config_is_one_clear_error(raw, key):
    with pytest.raises(ConfigError) as err:
        load_settings(raw, stack="dev", region="us-west-2")
    assert isinstance(err.value, ConfigErrors) and err.value.keys == [key]  # one error, naming the key


def test_kueue_defaults_on_with_teams_and_a_supporting_trainer():
    s = load_settings({"tenants": {"a": {"gpuQuota": 1}}}, stack="dev", region="us-west-2")
    assert s.kueue_enabled
    assert not load_settings({"tenants": {"a": {"gpuQuota": 1}}, "trainer": {"version": "v2.1.0"}}, stack="dev", region="us-west-2").kueue_enabled
    assert not load_settings({}, stack="dev", region="us-west-2").kueue_enabled


def test_initializer_pod_sets_take_the_system_flavor_not_a_gpu_pool():
    """Kueue gives each pod set the first flavor with room: the Trainer's initializers (CPU only,
    pinned to the system nodes) must fit the system flavor, whose node labels they already select;
    GPU pod sets cannot (no GPU quota there) and move on to a GPU pool."""
    from config.settings import TrainerSettings
    from k8s.builders.runtimes import torch_hf_runtime

    flavor = kq.system_resource_flavor()
    quota = kq._system_quantities()
    runtime = torch_hf_runtime(TrainerSettings())
    inits = [rj for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"] if rj["name"] != "node"]
    assert len(inits) == 2
    cpu = mem = 0
    for rj in inits:
        pod = rj["template"]["spec"]["template"]["spec"]
        assert flavor["spec"]["nodeLabels"].items() <= pod["nodeSelector"].items()
        (c,) = pod["containers"]
        assert kq.GPU not in c["resources"].get("limits", {}) and kq.GPU not in c["resources"]["requests"]
        cpu += int(c["resources"]["requests"]["cpu"])
        mem += int(c["resources"]["requests"]["memory"].removesuffix("Gi"))
    assert cpu * kq.SYSTEM_JOBS_AT_ONCE <= int(quota["cpu"]) and mem * kq.SYSTEM_JOBS_AT_ONCE <= int(quota["memory"].removesuffix("Gi"))
    assert quota[kq.GPU] == 0 and quota[kq.EFA] == 0


def test_directories_under_initializer_sub_paths_stay_readable_for_the_training_uid():
    """The kubelet creates a missing sub-path directory as root with the mode of the volume's root
    (kubernetes pkg/kubelet/kubelet_pods.go makeMounts: GetMode(volumePath) then SafeMakeDir), and
    the Trainer's initializers run as root (their upstream images set no USER). The trainer pods run
    as the training uid, so every directory that becomes such a root must let others read and
    traverse it: mode 0755 on the training namespace's root and on each team's directory."""
    import re

    from k8s.builders.volume_setup import owner_script

    for script in (owner_script(1000), tn.tenant_dirs_script(["vision", "nlp"], 1000)):
        modes = re.findall(r"chmod (0[0-7]{3})", script)
        assert modes and all(int(m, 8) & 0o005 == 0o005 for m in modes), script


def test_a_job_that_never_starts_ends_after_the_requeue_limit():
    """waitForPodsReady requeues forever unless backoffLimitCount is set (kueue v0.19.2
    apis/config/v1beta2/defaults.go); the stack sets it from kueue.requeueLimit."""
    for limit in (3, 0):
        run = two_teams(kueue={"requeueLimit": limit})
        release = next(r for r in run.by_type(HELM) if r.name == "kueue")
        config = yaml.safe_load(release.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])
        assert config["waitForPodsReady"]["requeuingStrategy"]["backoffLimitCount"] == limit


def _egress_allows(policy: dict, *, ip: str | None = None, namespace: str | None = None, own: bool = False, port: int | None = None) -> bool:
    """NetworkPolicy egress semantics for the subset the platform writes."""
    import ipaddress

    for rule in policy["spec"]["egress"]:
        if port is not None and rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
            continue
        for peer in rule.get("to", []):
            if own and peer == {"podSelector": {}}:
                return True
            if namespace and peer.get("namespaceSelector", {}).get("matchLabels", {}).get("kubernetes.io/metadata.name") == namespace:
                return True
            if ip and "ipBlock" in peer:
                addr = ipaddress.ip_address(ip)
                if addr in ipaddress.ip_network(peer["ipBlock"]["cidr"]) and not any(addr in ipaddress.ip_network(e) for e in peer["ipBlock"].get("except", [])):
                    return True
    return False


@pytest.mark.parametrize("ns", ["vision", "nlp", "training"])
def test_egress_reaches_own_pods_dns_and_the_internet_but_not_metadata_nodes_or_other_namespaces(ns):
    run = two_teams()
    (policy,) = [p for p in of_kind(run, "NetworkPolicy", ns) if p["metadata"]["name"] == "egress"]
    assert policy["spec"]["podSelector"] == {} and policy["spec"]["policyTypes"] == ["Egress"]
    assert _egress_allows(policy, own=True)
    assert _egress_allows(policy, namespace="kube-system", port=53)
    assert _egress_allows(policy, ip="18.239.50.1")  # a public host (huggingface.co, PyPI, ...)
    assert not _egress_allows(policy, ip="169.254.169.254")  # the instance metadata service (node role credentials)
    assert not _egress_allows(policy, ip="169.254.170.23")  # the Pod Identity agent
    assert not _egress_allows(policy, ip="10.10.5.7")  # a node or another namespace's pod in the VPC
    assert not _egress_allows(policy, namespace="nlp" if ns != "nlp" else "vision")


def test_the_training_namespace_is_fenced_only_when_teams_share_the_cluster():
    (ingress,) = [p for p in of_kind(two_teams(), "NetworkPolicy", "training") if p["metadata"]["name"] == "namespace-isolation"]
    assert _admits(ingress, source_ns="training") and not _admits(ingress, source_ns="vision")
    assert of_kind(run_config(dev_config()), "NetworkPolicy", "training") == []


def test_every_checkpoint_volume_is_pre_bound_to_the_claim_that_names_it():
    """A PersistentVolume without claimRef goes to the first claim naming it (volumeName), from any
    namespace: each is pre-bound, and the claim and volume point at each other."""
    objs = list(objects(two_teams()).values())
    claims = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in objs if c["kind"] == "PersistentVolumeClaim"}
    volumes = [v for v in objs if v["kind"] == "PersistentVolume"]
    assert len(volumes) == len(claims) >= 4
    for pv in volumes:
        ref = pv["spec"]["claimRef"]
        claim = claims[(ref["namespace"], ref["name"])]
        assert claim["spec"]["volumeName"] == pv["metadata"]["name"]


def test_team_storage_is_quota_capped_to_its_one_checkpoint_claim():
    run = two_teams()
    for team in ("vision", "nlp"):
        (rq,) = of_kind(run, "ResourceQuota", team)
        (pvc,) = of_kind(run, "PersistentVolumeClaim", team)
        assert rq["spec"]["hard"]["persistentvolumeclaims"] == "1"
        assert rq["spec"]["hard"]["requests.storage"] == pvc["spec"]["resources"]["requests"]["storage"]


def test_the_start_timeout_is_sized_by_the_stacks_downloads():
    """Kueue counts the initializers' download inside waitForPodsReady.timeout: unset, it is a GPU
    node's launch plus twice the largest download; a timeout set shorter than that is refused."""
    teams = {"tenants": {"a": {"gpuQuota": 8}}}

    def load(**more):
        return load_settings({**teams, **more}, stack="dev", region="us-west-2")

    assert load().pods_ready_timeout() == "15m"  # no job downloads anything
    fsdp = {"fsdp": {"enabled": True}}
    assert load(trainjobs=fsdp).pods_ready_timeout() == "26m"  # 16 GiB: 15 + ceil(2 * 16384 / 50 / 60)
    big = load(trainjobs={"fsdp": {"enabled": True, "downloadGib": 200}})
    assert big.pods_ready_timeout() == f"{15 + -(-2 * 200 * 1024 // (50 * 60))}m"
    assert load(trainjobs=fsdp, kueue={"podsReadyTimeout": "1h"}).pods_ready_timeout() == "1h"
    with pytest.raises(ConfigError) as err:
        load(trainjobs=fsdp, kueue={"podsReadyTimeout": "20m"})
    assert isinstance(err.value, ConfigErrors) and err.value.keys == ["kueue.podsReadyTimeout"] and "26 min" in str(err.value)
    run = two_teams(trainjobs=fsdp)
    release = next(r for r in run.by_type(HELM) if r.name == "kueue")
    assert yaml.safe_load(release.inputs["values"]["managerConfig"]["controllerManagerConfigYaml"])["waitForPodsReady"]["timeout"] == "26m"
