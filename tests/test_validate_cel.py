"""CEL rules of the CRDs (x-kubernetes-validations): the evaluator's cel-go semantics, rules on rendered
objects, transition rules between two renders, runtimeRef resolution and the inferred Trainer version."""

from __future__ import annotations

import copy
import pathlib

import celpy
import pytest
import yaml

from tests.conftest import dev_config, objects, run_config, run_stack
from tools import cel, render
from tools import validate as v

# --- the evaluator: where cel-python 0.5.0 differs from cel-go -------------------------------------------


def outcome(expression: str, **variables):
    """('value', v) or ('error', kind) of an expression in tools.cel."""
    try:
        return "value", cel.evaluate(expression, **variables)
    except cel.CELError as ex:
        return "error", ex.kind


def stock(expression: str, **variables):
    """The same in unpatched cel-python (its interpreter)."""
    env = celpy.Environment()
    try:
        value = env.program(env.compile(expression)).evaluate({k: celpy.json_to_cel(x) for k, x in variables.items()})
    except Exception:  # cel-python raises errors (also out of || and &&)
        return "error", None
    return "value", cel.to_python(value)


# (expression, self, what cel-go gives)
CEL_GO = [
    # has() evaluates its operand: an error there is an error, not false
    ("has(self.spec.field)", {}, ("error", "runtime")),
    ("!has(self.spec.field)", {}, ("error", "runtime")),
    ("has(self.spec) && has(self.spec.field)", {}, ("value", False)),
    ("has(self.spec.field)", {"spec": {"field": 1}}, ("value", True)),
    ("has(self.spec.field)", {"spec": {}}, ("value", False)),
    # filter(): an erroring predicate is an error, absorbed only where || / && decide without it
    ("[0, 1, 2].filter(x, 2 / x == 2)", {}, ("error", "runtime")),
    ("[0, 1, 2].filter(x, 2 / x == 2).size() == 1", {}, ("error", "runtime")),
    ("true || [0, 1].filter(x, 2 / x == 2).size() == 1", {}, ("value", True)),
    ("[1, 2].filter(x, x > 1)", {}, ("value", [2])),
    ("[1, 2].map(x, x > 1, x * 10)", {}, ("value", [20])),
    ("[0, 1].exists(x, 2 / x == 2)", {}, ("value", True)),
    ("[0, 1].exists(x, 2 / x == 7)", {}, ("error", "runtime")),
    ("[0, 1].all(x, 2 / x == 7)", {}, ("value", False)),
    ("[0, 1].all(x, 2 / x == 2)", {}, ("error", "runtime")),
    ("[0, 1].exists_one(x, 2 / x == 2)", {}, ("error", "runtime")),
    # heterogeneous equality: values of other types are unequal, numbers compare by value
    ("1 == 'a'", {}, ("value", False)),
    ("1 != 'a'", {}, ("value", True)),
    ("1 == 1.0", {}, ("value", True)),
    ("1u == 1", {}, ("value", True)),
    ("null == 1", {}, ("value", False)),
    ("[1, 'a'] == ['a', 1]", {}, ("value", False)),
    ("{'a': 1} == {'a': 'x'}", {}, ("value", False)),
    ("'a' in [1, 'a']", {}, ("value", True)),
    ("1 in [1.0]", {}, ("value", True)),
    ("self > 0 || self in ['auto', 'cpu', 'gpu']", "auto", ("value", True)),
    ("self > 0 || self in ['auto', 'cpu', 'gpu']", "many", ("error", "runtime")),
    ("self > 0 || self in ['auto', 'cpu', 'gpu']", 4, ("value", True)),
    # int() as strconv.ParseInt / a checked truncation
    ("int('42')", {}, ("value", 42)),
    ("int('-42')", {}, ("value", -42)),
    ("int(' 42')", {}, ("error", "runtime")),
    ("int('1_000')", {}, ("error", "runtime")),
    ("int('0x10')", {}, ("error", "runtime")),
    ("int('1.5')", {}, ("error", "runtime")),
    ("int(-2.9)", {}, ("value", -2)),
    ("int(1e19)", {}, ("error", "runtime")),
    # list indexes within bounds only
    ("[1, 2][-1]", {}, ("error", "runtime")),
    ("[1, 2][2]", {}, ("error", "runtime")),
    ("[1, 2][1]", {}, ("value", 2)),
    # the rest of cel-go's strictness
    ("size(null)", {}, ("error", "runtime")),
    ("(1 / 0 == 1) ? true : true", {}, ("error", "runtime")),
    ("true && 1", {}, ("error", "runtime")),
    ("false && 1", {}, ("value", False)),
    ("1 < 2.5", {}, ("value", True)),
    ("string(true)", {}, ("value", "true")),
    ("size('héllo')", {}, ("value", 5)),
]


@pytest.mark.parametrize("expression,self_value,expected", CEL_GO, ids=[f"{i}:{c[0]}" for i, c in enumerate(CEL_GO)])
def test_evaluator_follows_cel_go(expression, self_value, expected):
    assert outcome(expression, self=self_value) == expected


# Where the pinned cel-python's own interpreter gives another answer: the cases above are not vacuous.
STOCK_DIFFERS = [
    ("has(self.spec.field)", {}),  # false, not an error
    ("!has(self.spec.field)", {}),  # true: a rule that silently passes
    ("true || [0, 1].filter(x, 2 / x == 2).size() == 1", {}),  # raises past ||
    ("1 == 'a'", {}),  # raises
    ("1 == 1.0", {}),  # raises
    ("int(' 42')", {}),  # 42
    ("int('1_000')", {}),  # 1000
    ("[1, 2][-1]", {}),  # 2
]


@pytest.mark.parametrize("expression,self_value", STOCK_DIFFERS, ids=[c[0] for c in STOCK_DIFFERS])
def test_stock_cel_python_differs_where_patched(expression, self_value):
    assert stock(expression, self=self_value) != outcome(expression, self=self_value)


def test_kubernetes_library_functions():
    assert cel.evaluate("self.split('@')[0]", self="al2023@v20261105") == "al2023"
    assert cel.evaluate("self.find('^[^@]+')", self="al2023@latest") == "al2023"
    assert cel.evaluate("self.find('^z')", self="abc") == ""
    assert cel.evaluate("self.findAll('[0-9]')", self="a1b2") == ["1", "2"]
    assert cel.evaluate("self.matches('^[a-z]+$') && !self.matches('^b')", self="abc") is True
    assert cel.evaluate("self.startsWith('kubernetes.io/') && self.endsWith('name')", self="kubernetes.io/hostname") is True
    assert cel.evaluate("quantity(self).isGreaterThan(quantity('1000Mi')) && quantity('1Gi') == quantity('1024Mi')", self="2Gi") is True
    assert cel.evaluate("isQuantity('1.5Gi') && !isQuantity('1.5 Gi')") is True
    assert cel.evaluate("isURL('https://example.com/x') && !isURL('example') && url('https://h:8443/p').getPort() == '8443'") is True
    assert cel.evaluate("self.lowerAscii() + '.' + ['a', 'b'].join('-')", self="AbC") == "abc.a-b"
    assert cel.evaluate("optional.none().orValue(3) + optional.of(1).value()") == 4
    assert outcome("'%s'.format(['x'])") == ("error", "unsupported")


def test_every_rule_of_every_crd_compiles_and_evaluates(need_schemas):
    """Each rule in the schema files, on a sample of its node, gives a bool (cel-go would too)."""
    count = 0
    failures = []
    for path in sorted(v.schemas_dir().rglob("*.yaml")):
        crd = v._load_crd(path)
        for ver in crd["spec"]["versions"]:
            for schema, where in rule_nodes(ver["schema"]["openAPIV3Schema"], f"{path.relative_to(v.schemas_dir())} {ver['name']}"):
                value = sample(schema)
                if where.endswith(" "):  # the root: rules see metadata.name
                    value["metadata"] = {"name": "sample"}
                for rule in schema[cel.VALIDATIONS]:
                    count += 1
                    try:
                        program = cel.compile_rule(rule["rule"])
                        result = program.run({"self": cel.to_cel(value, schema), "oldSelf": cel.to_cel(value, schema)})
                        if not isinstance(cel.to_python(result), bool):
                            failures.append((where, rule["rule"], f"returned {result!r}"))
                    except cel.CELError as ex:
                        failures.append((where, rule["rule"], f"{ex.kind}: {ex}"))
    assert count > 200
    assert failures == []


def rule_nodes(node, where, path=""):
    if isinstance(node, dict):
        if node.get(cel.VALIDATIONS):
            yield node, f"{where} {path}"
        for k, sub in node.items():
            if k != cel.VALIDATIONS:
                yield from rule_nodes(sub, where, f"{path}/{k}" if k not in ("properties", "items", "additionalProperties") else path)
    elif isinstance(node, list):
        for sub in node:
            yield from rule_nodes(sub, where, path)


def sample(schema, depth=0):
    """A value of a schema node, every property set (to a few levels)."""
    if "default" in schema:
        return copy.deepcopy(schema["default"])
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("x-kubernetes-int-or-string"):
        return 1
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        if depth > 5:
            return {}
        if schema.get("properties"):
            return {k: sample(s, depth + 1) for k, s in schema["properties"].items()}
        extra = schema.get("additionalProperties")
        return {"key": sample(extra, depth + 1)} if isinstance(extra, dict) else {}
    if kind == "array":
        return [sample(schema.get("items") or {}, depth + 1)] if depth <= 5 else []
    return {"string": "1", "integer": 1, "number": 1.5, "boolean": True}.get(kind, {})


# --- rules on custom resources ---------------------------------------------------------------------------


def rendered(kind: str, stack_objects: dict | None = None) -> dict:
    found = [o for o in (stack_objects or objects(run_stack("dev"))).values() if o["kind"] == kind]
    assert found, f"no {kind} rendered"
    return copy.deepcopy(found[0])


def test_ec2nodeclass_network_interface_rules(need_schemas):
    node_class = rendered("EC2NodeClass")
    node_class["spec"]["networkInterfaces"] = [
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
        {"networkCardIndex": 1, "deviceIndex": 0, "interfaceType": "efa-only"},
    ]
    assert v.validate(node_class) == []
    two_primary = copy.deepcopy(node_class)
    two_primary["spec"]["networkInterfaces"][1] = {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}
    problems = v.validate(two_primary)
    assert len(problems) == 1 and "spec.networkInterfaces: networkInterfaces must not have duplicate networkCardIndex and deviceIndex pairs" in problems[0]
    two_efa = copy.deepcopy(node_class)
    two_efa["spec"]["networkInterfaces"].append({"networkCardIndex": 1, "deviceIndex": 1, "interfaceType": "efa-only"})
    problems = v.validate(two_efa)
    assert len(problems) == 1 and "at most one efa device per network card" in problems[0]
    no_primary = copy.deepcopy(node_class)
    no_primary["spec"]["networkInterfaces"] = no_primary["spec"]["networkInterfaces"][1:]
    assert any("must include a primary interface" in p for p in v.validate(no_primary))


def test_nodepool_rules(need_schemas):
    pool = rendered("NodePool")
    assert v.validate(pool) == []
    restricted = copy.deepcopy(pool)
    restricted["spec"]["template"]["spec"]["requirements"].append({"key": "karpenter.sh/nodepool", "operator": "In", "values": ["x"]})
    problems = v.validate(restricted)
    assert problems and all("requirements[" in p and ".key" in p for p in problems), problems
    empty_in = copy.deepcopy(pool)
    empty_in["spec"]["template"]["spec"]["requirements"].append({"key": "example.com/team", "operator": "In", "values": []})
    assert any("requirements with operator 'In' must have a value defined" in p for p in v.validate(empty_in))
    not_a_number = copy.deepcopy(pool)
    not_a_number["spec"]["template"]["spec"]["requirements"].append({"key": "example.com/size", "operator": "Gt", "values": ["big"]})
    assert any("could not evaluate rule" in p and "int(x.values[0])" in p for p in v.validate(not_a_number))


def test_trainjob_and_runtime_rules(need_schemas):
    job = rendered("TrainJob")
    assert v.validate(job) == []
    job["metadata"]["name"] = "Bad_Name"
    assert any("metadata.name must match RFC 1035 DNS label format" in p for p in v.validate(job))
    job["metadata"]["name"] = "a" * 64
    assert any("metadata.name must be no more than 63 characters" in p for p in v.validate(job))
    runtime = rendered("ClusterTrainingRuntime", objects(run_config(dev_config(trainer={"version": "v2.1.0"}))))
    torch = runtime["spec"]["mlPolicy"]["torch"]
    for value, ok in [("auto", True), ("gpu", True), (4, True), ("many", False), (0, False)]:
        torch["numProcPerNode"] = value  # x-kubernetes-int-or-string
        problems = v.cel_problems(runtime, "v2.1.0")
        assert (problems == []) == ok, (value, problems)


def test_rule_that_cannot_be_evaluated_is_reported():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        cel.VALIDATIONS: [
            {"rule": "self.a.format([1]) != ''", "message": "unsupported function"},
            {"rule": "self.a ==", "message": "syntax error"},
            {"rule": "int(self.a) > 0", "message": "runtime error"},
            {"rule": "self.a", "message": "not a bool"},
        ],
    }
    problems = cel.rule_problems({"a": "x"}, schema)
    assert len(problems) == 4
    assert all(p.startswith("<root>: could not evaluate rule ") for p in problems), problems


def test_defaults_messages_and_schema_typing():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "default": 5},
            "ratio": {"type": "number"},
            "x-y": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
        },
        cel.VALIDATIONS: [
            {"rule": "self.a == 5"},
            {"rule": "self.x__dash__y != 'bad'", "messageExpression": "'x-y is ' + self.x__dash__y"},
            {"rule": "!has(self.ratio) || self.ratio == 1", "message": "ratio must be 1"},
        ],
    }
    obj = {"x-y": "ok"}
    assert cel.rule_problems(obj, schema) == []
    assert obj == {"x-y": "ok"}  # defaults go to a copy
    assert cel.rule_problems({"a": 6, "x-y": "bad", "ratio": 2}, schema) == ["<root>: failed rule: self.a == 5", "<root>: x-y is bad", "<root>: ratio must be 1"]
    assert cel.rule_problems({"x-y": "ok", "ratio": 1}, schema) == []  # number: 1 is a double, equal to int 1


def test_transition_rules_correlate_like_the_api_server():
    item = {"type": "object", "properties": {"name": {"type": "string"}, "v": {"type": "integer"}}, cel.VALIDATIONS: [{"rule": "self.v == oldSelf.v", "message": "v is immutable"}]}
    schema = {
        "type": "object",
        "properties": {
            "byName": {"type": "array", "items": item, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
            "atomic": {"type": "array", "items": item},
            "set": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", cel.VALIDATIONS: [{"rule": "self == oldSelf", "message": "set is immutable"}]},
            "counter": {"type": "integer", cel.VALIDATIONS: [{"rule": "!oldSelf.hasValue() || self >= oldSelf.value()", "message": "counter only grows", "optionalOldSelf": True}]},
            "created": {"type": "string", cel.VALIDATIONS: [{"rule": "oldSelf.hasValue()", "message": "evaluated on create", "optionalOldSelf": True}]},
        },
    }
    old = {"byName": [{"name": "a", "v": 1}, {"name": "b", "v": 2}], "atomic": [{"name": "a", "v": 1}], "set": ["x", "y"], "counter": 3}
    new = {"byName": [{"name": "b", "v": 2}, {"name": "a", "v": 1}, {"name": "c", "v": 9}], "atomic": [{"name": "a", "v": 5}], "set": ["y", "x"], "counter": 4}
    assert cel.rule_problems(new, schema, old) == []  # reordered map list and set, new item, atomic list items uncorrelated
    changed = {**new, "byName": [{"name": "a", "v": 7}], "set": ["x"], "counter": 2}
    assert cel.rule_problems(changed, schema, old) == ["byName[0]: v is immutable", "set: set is immutable", "counter: counter only grows"]
    assert cel.rule_problems({"created": "x"}, schema) == ["created: evaluated on create"]  # optionalOldSelf: oldSelf is none on create
    assert cel.rule_problems(changed, schema) == []  # transition rules need an old object


def test_kueue_schemas_are_indexed_and_their_rules_checked(need_schemas):
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "gpu"}, "spec": {"nodeLabels": {"pool": "gpu"}, "topologyName": "default"}}
    assert v.crd_schema("kueue.x-k8s.io/v1beta2", "ClusterQueue") is not None
    assert v.validate(flavor) == []
    moved = copy.deepcopy(flavor)
    moved["spec"]["topologyName"] = "other"
    assert v.cel_problems(moved, old=flavor) == ["ResourceFlavor/gpu: update: spec: topologyName is immutable when topologyName is set"]


# --- rendered stacks -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_rendered_stacks_pass_cel(need_schemas, stack, monkeypatch):
    runs = []
    original = cel.Program.run
    monkeypatch.setattr(cel.Program, "run", lambda self, variables: runs.append(self.text) or original(self, variables))
    objs = list(objects(run_stack(stack)).values())
    custom = [o for o in objs if v.raw_crd_schema(o["apiVersion"], o["kind"])]
    assert {"ClusterTrainingRuntime", "TrainJob", "NodePool", "EC2NodeClass"} <= {o["kind"] for o in custom}
    for obj in custom:
        assert v.cel_problems(obj) == []
        assert v.validate(obj) == []
    assert v.runtime_ref_problems(objs) == []
    assert len(runs) > 50
    if stack == "prod":  # EFA node classes: the network interface rules ran
        assert any("networkCardIndex" in r for r in runs)


def test_trainer_v2_1_0_render_passes_against_its_own_schemas(need_schemas):
    objs = objects(run_config(dev_config(trainer={"version": "v2.1.0"})))
    custom = [o for o in objs.values() if v.raw_crd_schema(o["apiVersion"], o["kind"], "v2.1.0")]
    assert {"ClusterTrainingRuntime", "TrainJob"} <= {o["kind"] for o in custom}
    for obj in custom:
        assert v.validate(obj, "v2.1.0") == []
    assert any(v.validate(o, "v2.3.0") for o in custom if o["kind"] == "TrainJob")  # the schemas do differ


def write_render(run, out: pathlib.Path) -> pathlib.Path:
    render.write(run, str(out))
    return out / run.stack / "manifests"


def test_cli_infers_the_trainer_version_from_the_plan(need_schemas, tmp_path, capsys):
    manifests = write_render(run_config(dev_config(trainer={"version": "v2.1.0"})), tmp_path / "v21")
    assert v.trainer_version_of(manifests)[0] == "v2.1.0"
    assert v.main([str(manifests)]) == 0
    assert "Trainer v2.1.0 (from the kubeflow-trainer chart 2.1.0" in capsys.readouterr().out
    assert v.main([str(manifests), "--trainer", "v2.3.0"]) == 1
    (manifests.parent / "plan.json").unlink()
    assert v.trainer_version_of(manifests)[0] is None
    assert v.main([str(manifests)]) == 1  # the default, v2.3.0, with a note
    assert "note: no " in capsys.readouterr().out


def runtime_file(manifests: pathlib.Path) -> pathlib.Path:
    """The manifest of a ClusterTrainingRuntime that has a failurePolicy (names are not fixed)."""
    for path in sorted(manifests.glob("*.yaml")):
        obj = yaml.safe_load(path.read_text())
        if obj["kind"] == "ClusterTrainingRuntime" and "failurePolicy" in obj["spec"]["template"]["spec"]:
            return path
    raise AssertionError("no ClusterTrainingRuntime with a failurePolicy rendered")


def test_previous_render_catches_an_immutable_field_change(need_schemas, tmp_path, capsys):
    run = run_stack("dev")
    old = write_render(run, tmp_path / "old")
    new = write_render(run, tmp_path / "new")
    assert v.main([str(new), "--previous", str(old)]) == 0
    path = runtime_file(new)
    runtime = yaml.safe_load(path.read_text())
    runtime["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] += 1
    path.write_text(yaml.safe_dump(runtime, sort_keys=False))
    capsys.readouterr()
    assert v.main([str(new)]) == 0  # a valid object on its own
    assert v.main([str(new), "--previous", str(old)]) == 1
    out = capsys.readouterr().out
    name = runtime["metadata"]["name"]
    assert f"ClusterTrainingRuntime/{name}: update: spec.template.spec.failurePolicy: Value is immutable" in out
    # an object with another name is a new object: no transition
    runtime["metadata"]["name"] += "-renamed"
    path.write_text(yaml.safe_dump(runtime, sort_keys=False))
    assert v.transition_problems(v.load_dir(old), v.load_dir(new)) == []


def test_trainjob_runtime_ref_must_resolve(need_schemas, tmp_path, capsys):
    objs = copy.deepcopy(list(objects(run_stack("dev")).values()))
    assert v.runtime_ref_problems(objs) == []
    job = next(o for o in objs if o["kind"] == "TrainJob")
    job["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    problems = v.runtime_ref_problems(objs)
    assert problems == [f"TrainJob/{job['metadata']['name']}: spec.runtimeRef: ClusterTrainingRuntime 'no-such-runtime' (trainer.kubeflow.org) is not among the rendered objects"]
    job["spec"]["runtimeRef"] = {"kind": "TrainingRuntime", "name": "x"}
    assert v.runtime_ref_problems(objs)
    namespaced = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime", "metadata": {"name": "x", "namespace": job["metadata"]["namespace"]}}
    assert v.runtime_ref_problems(objs + [namespaced]) == []
    manifests = write_render(run_stack("dev"), tmp_path / "r")
    path = next(p for p in manifests.glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] == "TrainJob")
    broken = yaml.safe_load(path.read_text())
    broken["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    path.write_text(yaml.safe_dump(broken, sort_keys=False))
    assert v.main([str(manifests)]) == 1
    assert "'no-such-runtime' (trainer.kubeflow.org) is not among the rendered objects" in capsys.readouterr().out


@pytest.mark.parametrize("change", [{"maxRestarts": 9}, {"shmSize": "128Gi"}, {"maxRestarts": 9, "shmSize": "128Gi"}])
def test_changing_runtime_settings_changes_no_immutable_field_of_a_kept_name(need_schemas, tmp_path, capsys, change):
    """The issue's check: two renders that differ in trainer settings pass --previous, and every
    TrainJob's runtimeRef resolves in the new render. maxRestarts renames the runtimes (their
    failurePolicy is immutable); shmSize keeps the names and changes only mutable fields."""
    old = write_render(run_stack("dev"), tmp_path / "old")
    new_run = run_config(dev_config(trainer=change))
    new = write_render(new_run, tmp_path / "new")
    assert v.main([str(new), "--previous", str(old)]) == 0, capsys.readouterr().out
    names = lambda d: {o["metadata"]["name"] for o in v.load_dir(d) if o["kind"] == "ClusterTrainingRuntime"}  # noqa: E731
    assert (names(old) == names(new)) == ("maxRestarts" not in change)
    # the same change made in place (the old names kept) is what the API server refuses
    if "maxRestarts" in change:
        renamed = tmp_path / "in-place"
        renamed.mkdir()
        old_by_label = {o["metadata"]["labels"]["training-platform/runtime"]: o["metadata"]["name"] for o in v.load_dir(old) if o["kind"] == "ClusterTrainingRuntime"}
        for obj in v.load_dir(new):
            if obj["kind"] == "ClusterTrainingRuntime":
                obj["metadata"]["name"] = old_by_label[obj["metadata"]["labels"]["training-platform/runtime"]]
                (renamed / f"{obj['metadata']['name']}.yaml").write_text(yaml.safe_dump(obj))
        assert v.transition_problems(v.load_dir(old), v.load_dir(renamed))
        # the TrainJobs' runtimeRef changes too: fine only because the program replaces TrainJobs
        # (replaceOnChanges: spec in plan.json) instead of updating them
        assert v.replaced_on_changes(new)
        unreplaced = v.transition_problems(v.load_dir(old), v.load_dir(new))
        assert unreplaced and all("spec.runtimeRef: field is immutable" in p for p in unreplaced)


@pytest.mark.parametrize("stack, version", [("workshop", "v2.1.0"), ("dev", "v2.3.0"), ("prod", "v2.3.0")])
def test_make_validate_passes_for_each_stack_against_its_own_trainer(need_schemas, tmp_path, capsys, stack, version):
    manifests = write_render(run_stack(stack), tmp_path)
    assert v.main([str(manifests)]) == 0, capsys.readouterr().out
    assert f"Trainer {version} (from the kubeflow-trainer chart" in capsys.readouterr().out


def test_ci_crd_fetch_list_matches_the_schema_layout(need_schemas):
    """tools.fetch_crds (for CI runners without ../shared) fetches exactly the files validate reads."""
    from tools import fetch_crds

    wanted = set(fetch_crds.sources())
    present = {str(p.relative_to(v.schemas_dir())) for p in v.schemas_dir().rglob("*.yaml")}
    assert wanted == present
    assert all(url.startswith("https://raw.githubusercontent.com/") and "/main/" not in url for url in fetch_crds.sources().values())
