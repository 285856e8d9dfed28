"""A team's AWS identity (``tenants.<team>.s3``): the config key, the role's least-privilege S3 policy
judged by IAM's rules, the Pod Identity association for (namespace, service account), the service
account and the egress opening to the Pod Identity agent, the admission policy's service-account
rule, and trainctl / the portal running team jobs as that service account."""

from __future__ import annotations

import json
import re
from typing import Any, cast

import pytest

from config.names import IAM_ROLE
from config.schema import ConfigErrors, validate_section
from config.settings import load_settings
from config.team_models import S3_GRANTS_MAX, S3_PREFIX_MAX, S3Access, TenantsSettings
from infra.team_identity import POLICY_NAME, READ_ACTIONS, WRITE_ACTIONS, s3_access_policy, team_role_name
from k8s.builders import admission, platform_facts, trainer_api
from k8s.builders import tenants as tn
from tests.conftest import dev_config, objects, run_config
from tests.iam_eval import Request, identity_allowed
from tests.test_tenants import TWO_TEAMS
from tools.mock_runtime import ACCOUNT as MOCK_ACCOUNT

ROLE = "aws:iam/role:Role"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
IMDS = "169.254.169.254"
VISION_S3 = [
    {"bucket": "vision-datasets", "prefix": "imagenet/", "access": "read"},
    {"bucket": "vision-results", "prefix": "runs/", "access": "readwrite"},
]


def grants(raw: list[dict]) -> list[S3Access]:
    return [S3Access.model_validate(g, by_alias=True) for g in raw]


def tenants(raw: dict) -> tuple[Any, list]:
    return validate_section(cast(Any, TenantsSettings), raw, "tenants")  # a map section (RootModel), validated like the loader does


def problems(raw_s3) -> list[str]:
    _, errs = tenants({"vision": {"gpuQuota": 1, "s3": raw_s3}})
    return [str(e) for e in errs]


# --- the config key -------------------------------------------------------------------------------


def test_a_teams_grants_parse_with_read_as_the_default_access():
    obj, errs = tenants({"vision": {"gpuQuota": 1, "s3": [{"bucket": "vision-datasets"}, *VISION_S3]}})
    assert errs == [] and obj is not None
    got = obj.teams()["vision"].s3
    assert [(g.bucket, g.prefix, g.access) for g in got] == [("vision-datasets", None, "read"), ("vision-datasets", "imagenet/", "read"), ("vision-results", "runs/", "readwrite")]


@pytest.mark.parametrize("bucket, why", [
    ("ab", "3-63"), ("a" * 64, "3-63"), ("Vision", "lower-case"), ("vision_data", "lower-case"), ("-vision", "starting and ending"), ("vision.", "starting and ending"),
    ("vision..data", "two adjacent periods"), ("192.168.5.4", "IP address"), ("xn--vision", "starting with xn--"), ("sthree-vision", "starting with sthree-"),
    ("amzn-s3-demo-bucket", "starting with amzn-s3-demo-"), ("vision-s3alias", "ending with -s3alias"), ("vision--ol-s3", "ending with --ol-s3"),
    ("vision.mrap", "ending with .mrap"), ("vision--x-s3", "ending with --x-s3"), ("vision--table-s3", "ending with --table-s3"),
])
def test_bucket_names_follow_s3s_naming_rules(bucket, why):
    (line,) = problems([{"bucket": bucket}])
    assert line.startswith(f"invalid config training-platform:tenants.vision.s3[0].bucket = {bucket!r}: ") and why in line


@pytest.mark.parametrize("prefix", ["data", "/data/", "data//", "data/*", "data/${aws:username}/", "a/../b/", "./", "dat a/", "x" * S3_PREFIX_MAX + "/"])
def test_prefixes_are_folders_without_wildcards_or_climbing(prefix):
    (line,) = problems([{"bucket": "vision-datasets", "prefix": prefix}])
    assert "s3[0].prefix" in line and "ending with '/'" in line


def test_every_problem_is_one_line_at_once_unknown_keys_refused():
    lines = problems([{"bucket": "Bad_Bucket"}, {"bucket": "vision-datasets", "prefix": "x"}, {"bucket": "vision-datasets", "acess": "read"}, {"bucket": "vision-datasets", "access": "write"}])
    assert len(lines) == 4 and all("\n" not in line for line in lines)
    assert "s3[0].bucket" in lines[0] and "s3[1].prefix" in lines[1]
    assert "s3[2].acess" in lines[2] and "unknown key; did you mean 'access'?" in lines[2]
    assert "s3[3].access = 'write'" in lines[3] and "allowed: read, readwrite" in lines[3]


def test_a_bucket_is_required_duplicates_and_too_many_grants_refused():
    assert problems([{"prefix": "data/"}]) == ["invalid config training-platform:tenants.vision.s3[0].bucket = None: required: the S3 bucket the team's jobs may use, such as vision-datasets"]
    (dup,) = problems([{"bucket": "vision-datasets", "prefix": "a/"}, {"bucket": "vision-datasets", "prefix": "a/", "access": "readwrite"}])
    assert "s3[1]" in dup and "same bucket and prefix as s3[0]" in dup
    (many,) = problems([{"bucket": f"vision-{i:02d}"} for i in range(S3_GRANTS_MAX + 1)])
    assert "tenants.vision.s3 = 11" in many and f"at most {S3_GRANTS_MAX}" in many


def test_the_whole_config_refuses_bad_grants_naming_each(tmp_path):
    cfg = dev_config(**TWO_TEAMS)
    raw = {k.split(":", 1)[1]: v for k, v in cfg.items() if k.startswith("training-platform:")}
    raw["tenants"] = {**raw["tenants"], "vision": {**raw["tenants"]["vision"], "s3": [{"bucket": "Bad"}, {"bucket": "ok-bucket", "prefix": "x"}]}}
    with pytest.raises(ConfigErrors) as err:
        load_settings(raw, stack="dev", region=cfg["aws:region"])
    assert err.value.keys[:2] == ["tenants.vision.s3[0].bucket", "tenants.vision.s3[1].prefix"]


# --- the role's policy, judged by IAM's evaluation rules ----------------------------------------


OWN = "210987654321"
"""The stack's account in these tests (s3_access_policy's ``account``)."""


def s3(action: str, bucket: str, key: str | None = None, *, prefix: str | None = None, owner: str = OWN) -> Request:
    """A request on ``bucket``, which belongs to ``owner`` (the request's s3:ResourceAccount)."""
    resource = f"arn:aws:s3:::{bucket}" + (f"/{key}" if key is not None else "")
    return Request(principal=None, action=action, resource=resource, context={"s3:ResourceAccount": owner, **({"s3:prefix": prefix} if prefix is not None else {})})


def test_the_policy_allows_exactly_the_teams_folders_and_access():
    policy = s3_access_policy(grants(VISION_S3), account=OWN)
    allowed = lambda r: identity_allowed(policy, r)  # noqa: E731
    # its own folders
    assert allowed(s3("s3:GetObject", "vision-datasets", "imagenet/train/0001.jpg"))
    assert allowed(s3("s3:ListBucket", "vision-datasets", prefix="imagenet/"))
    assert allowed(s3("s3:ListBucket", "vision-datasets", prefix="imagenet/train/"))
    assert allowed(s3("s3:GetObject", "vision-results", "runs/r1/metrics.json"))
    for action in WRITE_ACTIONS:
        assert allowed(s3(action, "vision-results", "runs/r1/model.pt")), action
    # read is read: no writes in the read-only folder
    for action in WRITE_ACTIONS:
        assert not allowed(s3(action, "vision-datasets", "imagenet/train/0001.jpg")), action
    # beside its folders: a sibling sharing the name's start, the bucket root, listing without a prefix
    assert not allowed(s3("s3:GetObject", "vision-datasets", "imagenet-old/0001.jpg"))
    assert not allowed(s3("s3:GetObject", "vision-datasets", "secret.txt"))
    assert not allowed(s3("s3:ListBucket", "vision-datasets", prefix=""))
    assert not allowed(s3("s3:ListBucket", "vision-datasets"))
    assert not allowed(s3("s3:ListBucket", "vision-datasets", prefix="imagenet-old/"))
    # another team's bucket and folders, and anything that is not reading or writing objects
    assert not allowed(s3("s3:GetObject", "nlp-corpora", "wiki/part-0.parquet"))
    assert not allowed(s3("s3:ListBucket", "nlp-corpora", prefix="wiki/"))
    assert not allowed(s3("s3:PutObject", "nlp-corpora", "runs/x"))
    for action in ("s3:PutBucketPolicy", "s3:DeleteBucket", "s3:PutObjectAcl", "s3:GetBucketPolicy", "s3:ListAllMyBuckets", "iam:PassRole", "sts:AssumeRole"):
        assert not allowed(s3(action, "vision-results", "runs/x")) and not allowed(s3(action, "vision-results")), action


def test_two_teams_policies_keep_to_their_own_prefixes_in_one_shared_bucket():
    shared = "shared-training-data"
    vision = s3_access_policy(grants([{"bucket": shared, "prefix": "vision/", "access": "readwrite"}]), account=OWN)
    nlp = s3_access_policy(grants([{"bucket": shared, "prefix": "nlp/"}]), account=OWN)
    assert identity_allowed(vision, s3("s3:PutObject", shared, "vision/a.bin")) and not identity_allowed(vision, s3("s3:GetObject", shared, "nlp/a.bin"))
    assert identity_allowed(nlp, s3("s3:GetObject", shared, "nlp/a.bin")) and not identity_allowed(nlp, s3("s3:GetObject", shared, "vision/a.bin"))
    assert not identity_allowed(nlp, s3("s3:ListBucket", shared, prefix="vision/"))
    assert not identity_allowed(nlp, s3("s3:PutObject", shared, "nlp/a.bin"))


def test_a_whole_bucket_grant_lists_without_a_condition_and_reads_every_key():
    policy = s3_access_policy(grants([{"bucket": "vision-datasets"}]), account=OWN)
    assert identity_allowed(policy, s3("s3:ListBucket", "vision-datasets")) and identity_allowed(policy, s3("s3:GetObject", "vision-datasets", "any/key"))
    assert not identity_allowed(policy, s3("s3:GetObject", "vision-datasets-2", "any/key"))
    assert not identity_allowed(policy, s3("s3:PutObject", "vision-datasets", "any/key"))


def test_the_policy_names_only_object_reads_writes_and_listing_in_the_region_partition():
    policy = s3_access_policy(grants(VISION_S3), account=OWN, partition="aws-cn")
    actions = {a for s in policy["Statement"] for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {"s3:ListBucket", *READ_ACTIONS, *WRITE_ACTIONS}
    assert all(r.startswith("arn:aws-cn:s3:::") for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]))
    assert not any("*" in r.split(":::")[1].split("/")[0] for s in policy["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]))
    with pytest.raises(ValueError):
        s3_access_policy([], account=OWN)


def test_the_largest_policy_the_config_allows_fits_iams_inline_limit():
    """IAM counts a role's inline policies' characters without whitespace: at most 10,240 (IAM User
    Guide, "IAM and AWS STS quotas")."""
    worst = [{"bucket": f"{i}" + "b" * 62, "prefix": ("p" * (S3_PREFIX_MAX - 1)) + "/", "access": "readwrite"} for i in range(S3_GRANTS_MAX)]
    one_bucket = [{"bucket": "b" * 63, "prefix": f"{i}" + "p" * (S3_PREFIX_MAX - 2) + "/", "access": "readwrite"} for i in range(S3_GRANTS_MAX)]
    for raw in (worst, one_bucket):
        assert problems(raw) == []
        text = json.dumps(s3_access_policy(grants(raw), account=OWN, partition="aws-us-gov"), separators=(",", ":"))
        assert len(re.sub(r"\s", "", text)) <= 10_240


# --- names ------------------------------------------------------------------------------------------


def test_role_names_fit_iam_and_stay_distinct_per_team():
    assert team_role_name("training-dev", "vision") == "training-dev-team-vision"
    long_cluster, long_team = "c" * 100, "t" * 63
    names = {team_role_name(long_cluster, f"{long_team[:-1]}{i}") for i in range(10)} | {team_role_name(long_cluster, "vision")}
    assert len(names) == 11 and all(IAM_ROLE.fits(n) for n in names)


# --- the rendered plan ------------------------------------------------------------------------------


def with_s3():
    teams = {**TWO_TEAMS["tenants"], "vision": {**TWO_TEAMS["tenants"]["vision"], "s3": VISION_S3}}
    return run_config(dev_config(**{**TWO_TEAMS, "tenants": teams}))


def test_the_plan_has_the_teams_role_policy_and_association_for_its_namespace_and_service_account():
    run = with_s3()
    (component,) = [r for r in run.registrations if r.type == "training-platform:infra:TeamIdentity"]
    (role,) = [r for r in run.by_type(ROLE) if r.parent == component.urn]
    assert role.inputs["name"] == team_role_name("training-dev", "vision")
    trust = json.loads(role.inputs["assumeRolePolicy"])
    assert trust["Statement"] == [{"Effect": "Allow", "Principal": {"Service": "pods.eks.amazonaws.com"}, "Action": ["sts:AssumeRole", "sts:TagSession"]}]
    (policy,) = [r for r in run.by_type(ROLE_POLICY) if r.parent == component.urn]
    assert policy.inputs["name"] == POLICY_NAME
    assert json.loads(policy.inputs["policy"]) == s3_access_policy(grants(VISION_S3), account=MOCK_ACCOUNT)  # the stack's account (getCallerIdentity)
    (assoc,) = [r for r in run.by_type(ASSOCIATION) if r.parent == component.urn]
    assert (assoc.inputs["namespace"], assoc.inputs["serviceAccount"]) == ("vision", tn.TEAM_SERVICE_ACCOUNT)
    assert policy.urn in assoc.depends_on  # credentials only once the role holds its grants
    (agent,) = [r for r in run.registrations if r.type == "aws:eks/addon:Addon" and r.inputs.get("addonName") == "eks-pod-identity-agent"]
    assert agent.urn in assoc.depends_on  # and once the agent that hands them out runs (as the other associations)
    # nlp lists no buckets: no role, no association
    assert not [r for r in run.by_type(ASSOCIATION) if r.inputs.get("namespace") == "nlp"]
    assert len([r for r in run.registrations if r.type == "training-platform:infra:TeamIdentity"]) == 1


def _egress(run, ns: str) -> dict:
    (policy,) = [o for o in objects(run).values() if o["kind"] == "NetworkPolicy" and o["metadata"]["namespace"] == ns and o["metadata"]["name"] == "egress"]
    return policy


def test_every_team_gets_its_service_account_and_only_a_team_with_an_identity_reaches_the_agent():
    run = with_s3()
    for ns in ("vision", "nlp"):
        (sa,) = [o for o in objects(run).values() if o["kind"] == "ServiceAccount" and o["metadata"].get("namespace") == ns]
        assert sa["metadata"]["name"] == tn.TEAM_SERVICE_ACCOUNT and sa["automountServiceAccountToken"] is False
        # no binding names it: it may do nothing in the Kubernetes API
        assert not [o for o in objects(run).values() if o["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(s.get("name") == tn.TEAM_SERVICE_ACCOUNT for s in o.get("subjects", []))]
    agent = {"to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}, {"ipBlock": {"cidr": "fd00:ec2::23/128"}}], "ports": [{"protocol": "TCP", "port": 80}]}
    vision, nlp = _egress(run, "vision")["spec"]["egress"], _egress(run, "nlp")["spec"]["egress"]
    assert agent in vision and agent not in nlp
    assert [r for r in vision if r != agent] == nlp  # nothing else changes
    # the instance metadata service stays fenced: link-local is excepted from the internet rule, and no rule names it
    public = next(r for r in vision if r["to"][0].get("ipBlock", {}).get("cidr") == "0.0.0.0/0")
    assert "169.254.0.0/16" in public["to"][0]["ipBlock"]["except"]
    assert not [p for r in vision for p in r["to"] if IMDS in json.dumps(p)]


def test_the_published_facts_name_the_teams_service_account():
    run = with_s3()
    for ns in ("vision", "nlp"):
        (cm,) = [o for o in objects(run).values() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == platform_facts.CONFIGMAP and o["metadata"]["namespace"] == ns]
        assert json.loads(cm["data"][platform_facts.KEY])["serviceAccount"] == tn.TEAM_SERVICE_ACCOUNT


# --- admission and the jobs trainctl and the portal build ------------------------------------------


def test_the_admission_policy_allows_a_team_job_only_its_team_service_account_or_default():
    policy = admission.trainjob_policy(["gpu-pool"], instance_types=["g5.xlarge"])
    checks = [v for v in policy["spec"]["validations"] if "serviceAccountName" in v["expression"]]
    assert len(checks) == 2  # runtimePatches and podTemplateOverrides
    for v in checks:
        assert f"ps.?serviceAccountName.orValue('default') in ['{tn.TEAM_SERVICE_ACCOUNT}', 'default']" in v["expression"]
        assert v["message"].endswith(f"serviceAccountName: a team's job runs as its namespace's {tn.TEAM_SERVICE_ACCOUNT} or default service account")


def _build(tmp_path, version: str, facts: dict | None):
    from trainctl import code
    from trainctl import objects as o

    (tmp_path / "train.py").write_text("print(1)\n")
    req = o.Request(namespace="vision", nodes=2, command=["python", "train.py"], name="t", runtime_name="torch", trainer_version=version)
    req = o.with_facts(req, facts, instance_type_given=True)
    return o.build(req, code.collect(tmp_path))[1]


@pytest.mark.parametrize("version", ["v2.1.0", "v2.3.0"])
def test_trainctl_runs_a_team_job_as_the_published_service_account_in_both_trainer_shapes(tmp_path, version):
    facts = {"pools": [{"name": "gpu-pool", "instanceTypes": ["g5.xlarge"], "efa": False}], "serviceAccount": tn.TEAM_SERVICE_ACCOUNT}
    job = _build(tmp_path, version, facts)
    assert trainer_api.read_pod_customization(job["spec"])["serviceAccountName"] == tn.TEAM_SERVICE_ACCOUNT
    assert trainer_api.dropped_by_kueue(job) == []  # Kueue 0.19.2 keeps it (PodSpecPatch.serviceAccountName is in Trainer v2.2.1's types)
    # the initializers (system nodes) get no pod spec, so no identity
    for patch in job["spec"].get("runtimePatches", []):
        for j in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            assert j["name"] == trainer_api.TRAINER_JOB or "spec" not in j["template"]["spec"]["template"]
    # a cluster that publishes none (or no facts at all): the namespace's default, as before
    assert "serviceAccountName" not in trainer_api.read_pod_customization(_build(tmp_path, version, {**facts, "serviceAccount": None})["spec"])
    assert "serviceAccountName" not in trainer_api.read_pod_customization(_build(tmp_path, version, None)["spec"])


def test_kueue_keeps_a_patchs_service_account():
    assert not [f for f in trainer_api.KUEUE_DROPPED_FIELDS if f.endswith(".serviceAccountName")]


def test_the_shipped_teams_stack_gives_vision_its_identity_and_nlp_none():
    from tests.conftest import run_stack

    run = run_stack("teams")
    assocs = {(r.inputs["namespace"], r.inputs["serviceAccount"]) for r in run.by_type(ASSOCIATION) if r.inputs.get("serviceAccount") == tn.TEAM_SERVICE_ACCOUNT}
    assert assocs == {("vision", tn.TEAM_SERVICE_ACCOUNT)}
    (role,) = [r for r in run.by_type(ROLE) if r.inputs.get("name") == team_role_name(run_cluster_name(run), "vision")]
    assert json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}


def run_cluster_name(run) -> str:
    (cluster,) = [r for r in run.registrations if r.type == "eks:index:Cluster"]
    return cluster.inputs["name"]


# --- the bucket's owner (s3:ResourceAccount) -------------------------------------------------------------


def test_every_statement_holds_only_for_buckets_of_the_stacks_account():
    """A bucket of the same name in another account (S3 names are global) is nothing to the team."""
    policy = s3_access_policy(grants(VISION_S3), account=OWN)
    assert all(st["Condition"]["StringEquals"] == {"s3:ResourceAccount": OWN} for st in policy["Statement"])
    other = "999988887777"
    assert identity_allowed(policy, s3("s3:GetObject", "vision-datasets", "imagenet/a.jpg"))
    assert not identity_allowed(policy, s3("s3:GetObject", "vision-datasets", "imagenet/a.jpg", owner=other))
    assert not identity_allowed(policy, s3("s3:ListBucket", "vision-datasets", prefix="imagenet/", owner=other))
    assert identity_allowed(policy, s3("s3:PutObject", "vision-results", "runs/a.pt"))
    assert not identity_allowed(policy, s3("s3:PutObject", "vision-results", "runs/a.pt", owner=other))
    whole = s3_access_policy(grants([{"bucket": "vision-datasets"}]), account=OWN)
    assert identity_allowed(whole, s3("s3:ListBucket", "vision-datasets")) and not identity_allowed(whole, s3("s3:ListBucket", "vision-datasets", owner=other))


def test_a_cross_account_grant_is_not_held_to_the_stacks_account_and_only_it():
    raw = [{"bucket": "partner-data", "prefix": "shared/", "crossAccount": True}, *VISION_S3]
    policy = s3_access_policy(grants(raw), account=OWN)
    other = "999988887777"
    assert identity_allowed(policy, s3("s3:GetObject", "partner-data", "shared/a.bin", owner=other))
    assert identity_allowed(policy, s3("s3:ListBucket", "partner-data", prefix="shared/", owner=other))
    assert not identity_allowed(policy, s3("s3:PutObject", "partner-data", "shared/a.bin", owner=other))  # read is still read
    assert not identity_allowed(policy, s3("s3:GetObject", "vision-datasets", "imagenet/a.jpg", owner=other))  # the others keep the condition
    assert grants([{"bucket": "b-data"}])[0].cross_account is False


def test_one_buckets_grants_agree_on_cross_account():
    (line,) = problems([{"bucket": "shared-data", "prefix": "a/"}, {"bucket": "shared-data", "prefix": "b/", "crossAccount": True}])
    assert "tenants.vision.s3" in line and "crossAccount" in line and "\n" not in line
