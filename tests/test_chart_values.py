"""The local control plane's check of our Helm values against a chart without values.schema.json
(tools/cluster/charts.unknown_keys), on small charts written here; and which of the shipped
stacks' releases have a chart the local control plane renders. The real charts, rendered and
applied, are judged in tests/e2e/test_charts.py."""

from __future__ import annotations

import pathlib

import pytest
import yaml

import versions
from tools.cluster import charts
from tools.cluster.plan import Release


def _chart(root: pathlib.Path, name: str, values: dict, templates: dict[str, str], dependencies: list[dict] | None = None) -> pathlib.Path:
    d = root / name
    (d / "templates").mkdir(parents=True)
    meta = {"apiVersion": "v2", "name": name, "version": "1.0.0", **({"dependencies": dependencies} if dependencies else {})}
    (d / "Chart.yaml").write_text(yaml.safe_dump(meta))
    (d / "values.yaml").write_text(yaml.safe_dump(values))
    for fname, text in templates.items():
        (d / "templates" / fname).write_text(text)
    return d


@pytest.fixture
def chart(tmp_path):
    parent = _chart(tmp_path, "ctl", {
        "replicas": 1,
        "nodeSelector": {},
        "controller": {"resources": {"requests": {"cpu": "1"}}, "env": []},
        "settings": {"clusterName": "", "featureGates": {"nodeRepair": False}},
        "sub": {"install": True},
    }, {
        "deployment.yaml": "replicas: {{ .Values.replicas }}\n{{- with .Values.affinity }}\naffinity: {{ toYaml . }}{{ end }}\n"
                           "{{ index .Values \"podLabels\" \"team\" }}\n{{ .Values.webhook.port }}\n{{ toYaml .Values.controller.resources }}\n",
    }, dependencies=[{"name": "sub", "version": "0.1.0", "condition": "sub.install"}])
    _chart(parent / "charts", "sub", {"image": {"repository": "x", "tag": "y"}, "replicas": 1}, {"d.yaml": "{{ .Values.replicas }}\n"})
    return parent


def test_keys_in_values_yaml_pass(chart):
    ours = {"replicas": 2, "controller": {"resources": {"limits": {"memory": "1Gi"}}}, "settings": {"clusterName": "c", "featureGates": {"nodeRepair": True}}}
    assert charts.unknown_keys(chart, ours, "ctl") == []


def test_an_empty_map_in_values_yaml_takes_any_keys(chart):
    assert charts.unknown_keys(chart, {"nodeSelector": {"training-platform/node-role": "system"}}, "ctl") == []


def test_a_map_a_template_reads_whole_takes_any_keys_and_one_it_does_not_only_its_own(chart):
    assert charts.unknown_keys(chart, {"controller": {"resources": {"limits": {"memory": "1Gi"}}}}, "ctl") == []
    assert charts.unknown_keys(chart, {"controller": {"env": [], "envFrom": []}}, "ctl") == ["release ctl: values key controller.envFrom is unknown to chart ctl (not in its values.yaml, read by no template)"]


def test_keys_a_template_reads_pass_though_values_yaml_leaves_them_out(chart):
    # read whole (with/toYaml), by index, or below a path a template reads
    ours = {"affinity": {"nodeAffinity": {"anything": 1}}, "podLabels": {"team": "a"}, "webhook": {"port": 9443}}
    assert charts.unknown_keys(chart, ours, "ctl") == []


def test_an_unknown_key_is_one_line_naming_the_release_and_the_key(chart):
    problems = charts.unknown_keys(chart, {"replica": 2, "settings": {"featureGates": {"nodeRepare": True}}, "webhook": {"host": "x"}}, "karpenter")
    assert problems == [
        "release karpenter: values key replica is unknown to chart ctl (not in its values.yaml, read by no template)",
        "release karpenter: values key settings.featureGates.nodeRepare is unknown to chart ctl (not in its values.yaml, read by no template)",
        "release karpenter: values key webhook.host is unknown to chart ctl (not in its values.yaml, read by no template)",
    ]


def test_a_subcharts_keys_are_checked_against_the_subchart(chart):
    assert charts.unknown_keys(chart, {"sub": {"install": True, "image": {"tag": "v1"}, "replicas": 3}}, "ctl") == []
    assert charts.unknown_keys(chart, {"sub": {"imag": {"tag": "v1"}}}, "ctl") == ["release ctl: values key sub.imag is unknown to chart ctl/charts/sub (not in its values.yaml, read by no template)"]


def test_a_chart_with_a_schema_is_left_to_helm(chart):
    (chart / "values.schema.json").write_text('{"type": "object", "additionalProperties": false}')
    assert charts.unknown_keys(chart, {"replica": 2}, "ctl") == []


@pytest.mark.parametrize(("chart_ref", "version", "module"), [
    (versions.TRAINER_CHART, versions.TRAINER_VERSIONS[versions.DEFAULT_TRAINER_VERSION]["chart"], versions.TRAINER_MODULE),
    (versions.KUEUE_CHART, versions.KUEUE_VERSION, versions.KUEUE_MODULE),
    (versions.KARPENTER_CHART, versions.KARPENTER_VERSION, versions.KARPENTER_AWS_MODULE),
])
def test_the_charts_of_the_locally_built_components_come_from_their_modules(chart_ref, version, module):
    source = charts.chart_source(Release("r", "ns", chart_ref, version, False))
    assert source is not None and source.module == module and source.chart_version == version


def test_the_trainer_chart_brings_the_jobset_its_release_pins():
    for trainer, pins in versions.TRAINER_VERSIONS.items():
        source = charts.chart_source(Release("kubeflow-trainer", "kubeflow-system", versions.TRAINER_CHART, pins["chart"], True))
        assert source is not None and source.module_version == trainer
        assert [(s.module, s.module_version) for s in source.subcharts] == [(versions.JOBSET_MODULE, pins["jobset"])]


def test_a_trainer_chart_version_that_is_not_pinned_is_refused():
    with pytest.raises(charts.ChartError, match="not a pinned Trainer release"):
        charts.chart_source(Release("kubeflow-trainer", "kubeflow-system", versions.TRAINER_CHART, "9.9.9", True))


def test_device_plugin_charts_are_said_not_to_be_rendered():
    release = Release("nvidia-device-plugin", "kube-system", versions.NVIDIA_DEVICE_PLUGIN_CHART, versions.NVIDIA_DEVICE_PLUGIN_VERSION, False)
    assert charts.chart_source(release) is None
    assert "ships in no Go module" in charts.not_rendered_reason(release)


def test_only_trainer_v2_1_0s_release_build_appends_its_tag_as_appversion():
    got = {t: charts.chart_source(Release("kubeflow-trainer", "kubeflow-system", versions.TRAINER_CHART, pins["chart"], True)) for t, pins in versions.TRAINER_VERSIONS.items()}
    assert {t: s.published_app_version for t, s in got.items() if s is not None} == {t: (t if t == "v2.1.0" else "") for t in versions.TRAINER_VERSIONS}


def _module_chart(tmp_path, monkeypatch, meta: dict) -> charts.ChartSource:
    d = tmp_path / "module" / "charts" / "ctl"
    (d / "templates").mkdir(parents=True)
    (d / "Chart.yaml").write_text("# the tag's file\n" + yaml.safe_dump(meta))
    monkeypatch.setattr(charts.build, "module_dir", lambda module, version: tmp_path / "module")
    return charts.ChartSource("example.com/ctl", "v1.0.0", "charts/ctl", "1.0.0", published_app_version="v1.0.0")


def test_the_appversion_a_release_build_appends_is_in_the_assembled_chart(tmp_path, monkeypatch):
    source = _module_chart(tmp_path, monkeypatch, {"apiVersion": "v2", "name": "ctl", "version": "1.0.0"})
    out = charts.assemble(source, tmp_path / "out")
    assert yaml.safe_load((out / "Chart.yaml").read_text()) == {"apiVersion": "v2", "name": "ctl", "version": "1.0.0", "appVersion": "v1.0.0"}


def test_a_chart_that_already_has_the_appversion_its_release_build_appends_is_refused(tmp_path, monkeypatch):
    source = _module_chart(tmp_path, monkeypatch, {"apiVersion": "v2", "name": "ctl", "version": "1.0.0", "appVersion": "1.0.0"})
    with pytest.raises(charts.ChartError, match="already has appVersion 1.0.0"):
        charts.assemble(source, tmp_path / "out")
