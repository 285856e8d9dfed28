"""A job's env and Secret references (config/job_env.py): the rules, the stack's TrainJobs and
TrainJob stacks, trainctl submit --env/--secret-env (cluster, dry run, local), trainctl secret,
the portal's submit API, the team's Role and the Secret admission policy. docs/env-and-secrets.md."""

from __future__ import annotations

import base64
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from config import job_env
from config.job_models import DdpJobSettings
from config.run_config import RUN_PROJECT, load_run
from config.schema import ConfigErrors, validate_section
from config.settings import load_settings
from k8s.builders import admission, runtimes, trainer_api
from k8s.builders import tenants as tn
from tests.conftest import dev_config, objects, run_config, stack_file
from tests.test_tenants import TWO_TEAMS
from trainctl import cli, code, secret_cmd
from trainctl import objects as tobjects
from trainctl.portal import submission
from workloads.builders import trainjobs as tj

TOKEN = "hf_" + "a1B2c3D4e5F6g7H8i9J0kLmN"  # shaped like a Hugging Face token
WANDB = "0123456789abcdef0123456789abcdef01234567"  # 40 hex digits: a W&B API key's shape


# --- the rules -------------------------------------------------------------------------------------


def _platform_env_names(tmp_path) -> set[str]:
    """Every variable name the platform's builders put in a TrainJob's trainer env or its runtimes'
    trainer container (``node``, where the Trainer puts ``spec.trainer.env``)."""
    names: set[str] = set()
    for o in objects(run_config(dev_config(**TWO_TEAMS))).values():
        if o["kind"] == "TrainJob":
            names |= {e["name"] for e in o["spec"]["trainer"].get("env", [])}
        if o["kind"] == "ClusterTrainingRuntime":
            for j in o["spec"]["template"]["spec"]["replicatedJobs"]:
                for c in j["template"]["spec"]["template"]["spec"]["containers"]:
                    if c["name"] == "node":
                        names |= {e["name"] for e in c.get("env", [])}
    (tmp_path / "train.py").write_text("print(1)\n")
    (tmp_path / "requirements.txt").write_text("numpy\n")
    for version in ("v2.1.0", "v2.3.0"):
        req = tobjects.Request(namespace="vision", nodes=2, command=["python", "train.py"], name="t", runtime_name="torch", trainer_version=version)
        names |= {e["name"] for e in tobjects.build(req, code.collect(tmp_path))[1]["spec"]["trainer"]["env"]}
    names |= {e["name"] for e in runtimes.EFA_ENV}
    return names


def test_every_name_the_platform_sets_is_refused_but_the_defaults_a_job_may_change(tmp_path):
    names = _platform_env_names(tmp_path)
    assert {"TRAINING_JOB_NAME", "NODE_NAME", "FI_PROVIDER", runtimes.GRACE_ENV} <= names  # the collection works
    for name in names:
        assert job_env.reserved_why(name) or name in job_env.OVERRIDABLE, name
    assert set(job_env.OVERRIDABLE) <= {e["name"] for e in runtimes.BASE_ENV}
    assert all(job_env.reserved_why(n) is None for n in job_env.OVERRIDABLE)


@pytest.mark.parametrize("name", ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_ENDPOINT", "MASTER_ADDR", "RANK", "LOCAL_RANK",
                                  "WORLD_SIZE", "TF_CONFIG", "NVIDIA_VISIBLE_DEVICES", "TRAINING_ANYTHING", "TORCHELASTIC_RUN_ID"])
def test_the_trainers_torchruns_and_the_platforms_names_are_refused(name):
    assert "set by the platform" in (job_env.name_problem(name) or "")


def test_nvidia_prefix_matches_the_admission_policy():
    assert "NVIDIA_" == admission.NVIDIA_ENV_PREFIX and admission.NVIDIA_ENV_PREFIX in job_env.RESERVED_PREFIXES


@pytest.mark.parametrize("name,ok", [("NCCL_DEBUG", True), ("_X1", True), ("wandb_project", True), ("1X", False), ("A-B", False), ("A.B", False), ("", False), ("A B", False), ("X" * 254, False)])
def test_names_follow_the_shell_rule(name, ok):
    assert (job_env.name_problem(name) is None) is ok


@pytest.mark.parametrize("ref,parsed", [("wandb/api-key", ("wandb", "api-key")), ("a.b/K_1.x", ("a.b", "K_1.x")), ("Wandb/k", None), ("wandb", None), ("wandb/", None), ("/k", None), ("a/b/c", None)])
def test_secret_references(ref, parsed):
    assert job_env.secret_ref(ref) == parsed


def test_a_secret_shaped_or_secret_named_value_is_refused_without_showing_it():
    found = job_env.problems({"HF_TOKEN": "x" * 12, "SOME_VAR": TOKEN, "WANDB_API_KEY": WANDB, "NCCL_DEBUG": "INFO", "EMPTY_TOKEN": ""}, {})
    assert sorted(n for _, n, _ in found) == ["HF_TOKEN", "SOME_VAR", "WANDB_API_KEY"]
    assert all("--secret-env" in why and TOKEN not in why and WANDB not in why for _, _, why in found)


# --- the stack's TrainJobs and TrainJob stacks ------------------------------------------------------


def test_a_stack_job_carries_its_env_and_secret_references_on_both_trainer_versions():
    env = {"NCCL_DEBUG": "INFO", "WANDB_PROJECT": "mnist"}
    secret_env = {"WANDB_API_KEY": "wandb/api-key"}
    for version in ("v2.3.0", "v2.1.0"):
        cfg = dev_config(trainer={"version": version}, trainjobs={"ddp": {"env": env, "secretEnv": secret_env}})
        (job,) = [o for o in objects(run_config(cfg)).values() if o["kind"] == "TrainJob" and o["metadata"]["labels"].get(tn.JOB_LABEL) == "ddp"]
        entries = job["spec"]["trainer"]["env"]
        assert entries[-3:] == [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "WANDB_PROJECT", "value": "mnist"},
                                {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}}], version
        assert trainer_api.dropped_by_kueue(job) == []  # Kueue's Trainer types keep spec.trainer.env


def test_bad_stack_env_is_refused_one_line_each_all_at_once_without_values():
    raw = stack_file("dev")["config"]
    sections = {k.split(":", 1)[1]: v for k, v in raw.items() if k.startswith("training-platform:")}
    sections["trainjobs"] = {**sections["trainjobs"], "ddp": {**sections["trainjobs"]["ddp"], "env": {"PET_NNODES": "4", "WANDB_API_KEY": WANDB, "a-b": "1"}, "secretEnv": {"X": "nope", "PET_NNODES": "a/b"}}}
    with pytest.raises(ConfigErrors) as err:
        load_settings(sections, stack="dev", region=raw["aws:region"])
    text = str(err.value)
    keys = set(err.value.keys)
    assert {"trainjobs.ddp.env.PET_NNODES", "trainjobs.ddp.env.WANDB_API_KEY", "trainjobs.ddp.env.a-b", "trainjobs.ddp.secretEnv.X", "trainjobs.ddp.secretEnv.PET_NNODES"} <= keys
    assert WANDB not in text and "nope" not in text and len(text.splitlines()) == len(err.value.errors)


def test_a_trainjob_stack_takes_env_and_secret_env():
    names = {k: w.name for k, w in tj.WORKLOADS.items()}
    dev = "organization/training-platform/dev"
    run = load_run({"platform": dev, "ddp": {"env": {"NCCL_DEBUG": "INFO"}, "secretEnv": {"WANDB_API_KEY": "wandb/api-key"}}}, stack="nightly", base_names=names)
    assert run.job.env == {"NCCL_DEBUG": "INFO"} and run.job.secret_env == {"WANDB_API_KEY": "wandb/api-key"}
    with pytest.raises(ConfigErrors) as err:
        load_run({"platform": dev, "ddp": {"env": {"TF_CONFIG": "{}", "GH": TOKEN}}}, stack="nightly", base_names=names)
    assert set(err.value.keys) == {f"{RUN_PROJECT}:ddp.env.TF_CONFIG", f"{RUN_PROJECT}:ddp.env.GH"} and TOKEN not in str(err.value)


def test_the_model_types_numbers_as_strings_and_refuses_other_values():
    obj, problems = validate_section(DdpJobSettings, {"enabled": True, "env": {"OMP_NUM_THREADS": 4, "B": None}}, "trainjobs.ddp")
    assert obj is None and [p.key for p in problems] == ["trainjobs.ddp.env.B"]


# --- trainctl submit ---------------------------------------------------------------------------------


def _submit(capsys, tmp_path, *flags: str) -> tuple[int, str, str]:
    (tmp_path / "train.py").write_text("print(1)\n")
    capsys.readouterr()
    rc = cli.main(["submit", "--dry-run", "-n", "vision", "--nodes", "1", "-o", "json", *flags, str(tmp_path), "--", "python", "train.py"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_submit_puts_env_and_secret_references_in_the_trainer_env(capsys, tmp_path):
    rc, out, err = _submit(capsys, tmp_path, "--env", "NCCL_DEBUG=INFO", "--env", "EMPTY=", "--env", "EQ=a=b", "--secret-env", "WANDB_API_KEY=wandb/api-key")
    assert rc == 0, err
    env = json.loads(out)["items"][1]["spec"]["trainer"]["env"]
    assert {"name": "NCCL_DEBUG", "value": "INFO"} in env and {"name": "EMPTY", "value": ""} in env and {"name": "EQ", "value": "a=b"} in env
    assert {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "api-key"}}} in env


def test_bad_env_flags_are_one_line_each_exit_2_nothing_printed_no_value_echoed(capsys, tmp_path):
    rc, out, err = _submit(capsys, tmp_path, "--env", "NCCL_DEBUG=INFO", "--env", "NCCL_DEBUG=TRACE", "--env", "PET_NNODES=3", "--env", f"MY_VAR={TOKEN}",
                           "--env", f"WANDB_API_KEY={WANDB}", "--env", TOKEN, "--env", "1X=1", "--secret-env", "K=not-a-ref", "--secret-env", "NCCL_DEBUG=a/b", "--env", f"={TOKEN}", "--nodes", "0")
    assert rc == 2 and out == ""
    lines = err.strip().splitlines()
    assert all(line.startswith("trainctl: error: ") for line in lines)
    for expected in ("--env NCCL_DEBUG: given twice", "--env PET_NNODES: set by the platform", "--env MY_VAR: the value looks like a secret", "--env WANDB_API_KEY: the value looks like a secret",
                     "--env argument 6: allowed: NAME=VALUE", "--env 1X: not a variable name", "--secret-env K: not a Secret reference", "--secret-env NCCL_DEBUG: also in env", "--env argument 8: allowed: NAME=VALUE", "--nodes 0"):
        assert sum(expected in line for line in lines) == 1, (expected, lines)
    assert len(lines) == 10, lines
    assert TOKEN not in err and WANDB not in err and "not-a-ref" not in err


def test_submit_local_refuses_secret_env_and_judges_env(capsys, tmp_path):
    (tmp_path / "train.py").write_text("print(1)\n")
    capsys.readouterr()
    rc = cli.main(["submit", "--local", "--dry-run", "--nodes", "1", "--secret-env", "A=wandb/k", "--env", "RANK=1", str(tmp_path), "--", "python", "train.py"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 2 and "reads no cluster Secrets" in lines[0] and "--env RANK: set by the platform" in lines[1]
    rc = cli.main(["submit", "--local", "--dry-run", "--nodes", "1", "--env", "NCCL_DEBUG=INFO", str(tmp_path), "--", "python", "train.py"])
    assert rc == 0 and "NCCL_DEBUG" in capsys.readouterr().out


# --- trainctl secret -----------------------------------------------------------------------------------


def test_secret_data_from_values_files_and_stdin(tmp_path):
    (tmp_path / "key").write_bytes(b"from-a-file\n")
    data = secret_cmd.data_of(["a=plain", f"b=@{tmp_path / 'key'}", "c=@-", "d="], stdin=io.BytesIO(b"piped"))
    assert data == {"a": b"plain", "b": b"from-a-file\n", "c": b"piped", "d": b""}
    body = secret_cmd.secret("wandb", "vision", data)
    assert body["type"] == "Opaque" and base64.b64decode(body["data"]["c"]) == b"piped"


def test_bad_secret_input_is_one_line_each_never_a_value(capsys, tmp_path):
    capsys.readouterr()
    rc = cli.main(["secret", "set", "-n", "vision", "Bad_Name", f"k={TOKEN}", f"k={WANDB}", "bad/key=1", TOKEN, f"f=@{tmp_path / 'missing'}", "s=@-", "t=@-"])
    out = capsys.readouterr()
    assert rc == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 6, lines
    assert "secret name 'Bad_Name'" in lines[0] and any("key k: given twice" in line for line in lines) and any("key 'bad/key'" in line for line in lines)
    assert any("argument 4: allowed: KEY=VALUE" in line for line in lines) and any("key f: cannot read" in line for line in lines) and any("key t: standard input" in line for line in lines)
    assert TOKEN not in out.err and WANDB not in out.err


class _FakeCore:
    """The calls trainctl secret makes, recorded; any read fails the test."""

    def __init__(self, exists: bool, refuse: int | None = None):
        self.exists, self.refuse, self.calls = exists, refuse, []

    def create_namespaced_secret(self, ns, body, **kw):
        self.calls.append(("create", ns, body["metadata"]["name"], kw))
        if self.refuse:
            raise ApiException(status=self.refuse, reason="Forbidden")
        if self.exists:
            raise ApiException(status=409, reason="Conflict")

    def replace_namespaced_secret(self, name, ns, body, **kw):
        self.calls.append(("replace", ns, name, kw))

    def delete_namespaced_secret(self, name, ns, **kw):
        self.calls.append(("delete", ns, name, kw))
        if not self.exists:
            raise ApiException(status=404, reason="Not Found")

    def __getattr__(self, name):
        raise AssertionError(f"trainctl secret called {name}: it never reads a Secret")


def _FakeCluster(core) -> Any:
    """A KubeApi stand-in with the fake CoreV1Api."""
    return SimpleNamespace(core=core, namespace="vision")


def test_set_creates_or_replaces_without_reading_and_decodes_no_answer():
    core = _FakeCore(exists=False)
    assert secret_cmd.put(_FakeCluster(core), secret_cmd.secret("s", "vision", {"k": b"v"})) == "created"
    core = _FakeCore(exists=True)
    assert secret_cmd.put(_FakeCluster(core), secret_cmd.secret("s", "vision", {"k": b"v"})) == "replaced"
    assert [c[0] for c in core.calls] == ["create", "replace"] and all(c[3] == {"_preload_content": False} for c in core.calls)
    assert secret_cmd.delete(_FakeCluster(_FakeCore(exists=False)), "s") is False
    with pytest.raises(Exception, match="not allowed: create secrets in vision"):
        secret_cmd.put(_FakeCluster(_FakeCore(exists=False, refuse=403)), secret_cmd.secret("s", "vision", {"k": b"v"}))


# --- the portal ----------------------------------------------------------------------------------------


def test_the_portal_takes_env_and_names_each_problem_by_field():
    spec = submission.JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, env=(("NCCL_DEBUG", "INFO"),), secret_env=(("WANDB_API_KEY", "wandb/k"),))
    req = submission.request_of(spec, None)
    assert dict(req.env) == {"NCCL_DEBUG": "INFO"} and dict(req.secret_env) == {"WANDB_API_KEY": "wandb/k"}
    bad = submission.JobSpec(namespace="vision", framework="pytorch", num_nodes=1, gpu_per_node=1, env=(("PET_NNODES", "1"), ("X", TOKEN)), secret_env=(("Y", "nope"),))
    with pytest.raises(submission.Problems) as err:
        submission.request_of(bad, None)
    fields = [p["field"] for p in err.value.problems]
    assert fields.count("env") == 2 and fields.count("secret_env") == 1 and TOKEN not in str(err.value.problems)


# --- RBAC and admission --------------------------------------------------------------------------------


def test_a_team_writes_secrets_but_never_reads_them():
    on_secrets = [r for r in tn.TEAM_RULES if "secrets" in r["resources"] and "" in r["apiGroups"]]
    assert on_secrets == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "update", "delete"]}]
    assert not [r for r in tn.TEAM_RULES if "*" in r["resources"] or "*" in r["verbs"]]


def test_the_secret_policy_is_bound_to_team_namespaces_for_team_principals_and_refuses_token_secrets():
    rendered = [o for o in objects(run_config(dev_config(**TWO_TEAMS))).values() if o["metadata"].get("name") == admission.SECRET_POLICY_NAME]
    policy = next(o for o in rendered if o["kind"] == "ValidatingAdmissionPolicy")
    binding = next(o for o in rendered if o["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["validationActions"] == ["Deny"] and binding["spec"]["matchResources"]["namespaceSelector"] == {"matchExpressions": [{"key": tn.TEAM_LABEL, "operator": "Exists"}]}
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["secrets"] and set(rule["operations"]) == {"CREATE", "UPDATE", "DELETE"} and policy["spec"]["failurePolicy"] == "Fail"
    assert f"'{tn.team_group('')}'" in policy["spec"]["matchConditions"][0]["expression"]
    assert f"!= '{admission.SA_TOKEN_SECRET_TYPE}'" in policy["spec"]["validations"][0]["expression"]


def test_the_secret_policy_refuses_deletes_that_answer_with_the_secret():
    """A DELETE leaving a finalizer pending answers with the Secret (admission.SECRET_DELETE_CHECK's comment);
    the policy refuses dryRun, a propagationPolicy other than Background, orphanDependents, and finalizers.
    Evaluated by the real API server in tests/e2e/test_env_secrets.py."""
    expressions = [v["expression"] for v in admission.secret_policy()["spec"]["validations"]]
    assert expressions[0].startswith("request.operation == 'DELETE' || ")  # object is null on DELETE
    assert admission.SECRET_FINALIZERS_CHECK in expressions and admission.SECRET_DELETE_FINALIZED_CHECK in expressions
    assert admission.SECRET_DELETE_CHECK in expressions
    check = admission.SECRET_DELETE_CHECK
    assert "!request.?dryRun.orValue(false)" in check and "request.options.?propagationPolicy.orValue('Background') == 'Background'" in check
    assert "!request.options.?orphanDependents.orValue(false)" in check
    assert "object.metadata.?finalizers.orValue([]).size() == 0" in admission.SECRET_FINALIZERS_CHECK
    assert "oldObject.metadata.?finalizers.orValue([]).size() == 0" in admission.SECRET_DELETE_FINALIZED_CHECK
    assert all(v["reason"] == "Forbidden" and "\n" not in v["message"] for v in admission.secret_policy()["spec"]["validations"])


def test_trainctl_secret_delete_sends_a_plain_delete():
    """What the policy lets through: no dryRun, no propagationPolicy other than Background, no orphanDependents."""
    calls = []

    class Core:
        def delete_namespaced_secret(self, name, namespace, **kw):
            calls.append((name, namespace, kw))

    class Cluster:
        core, namespace = Core(), "vision"

    assert secret_cmd.delete(Cluster(), "wandb") is True  # type: ignore[arg-type]
    ((name, ns, kw),) = calls
    assert (name, ns) == ("wandb", "vision") and set(kw) <= {"_preload_content", "propagation_policy"}
    assert kw.get("propagation_policy", "Background") == "Background"
