"""The engine's build (tools/engine/build.py on tools/cluster/build.py): the go.mod of our build module for
a module with replace directives, and the units' pins and version stamps."""

from __future__ import annotations

import versions
from tools.cluster import build
from tools.engine import build as engine

PKG_GO_MOD = """module github.com/pulumi/pulumi/pkg/v3

go 1.26.6

replace github.com/pulumi/pulumi/sdk/v3 => ../sdk

replace github.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e

replace (
	example.com/a => ../a // a sibling
	example.com/b v1.0.0 => example.com/c v1.2.0
)

require github.com/pulumi/pulumi/sdk/v3 v3.274.1
"""


def test_replace_directives_are_copied_and_siblings_become_modules_at_the_same_commit():
    tagged = build.replaced_go_mod("github.com/pulumi/pulumi/pkg/v3", "v3.274.1", PKG_GO_MOD)
    assert "go 1.26.6" in tagged and "require github.com/pulumi/pulumi/pkg/v3 v3.274.1" in tagged
    assert "\tgithub.com/pulumi/pulumi/sdk/v3 => github.com/pulumi/pulumi/sdk/v3 v3.274.1\n" in tagged
    assert "\tgithub.com/atotto/clipboard => github.com/tgummerer/clipboard v0.0.0-20241001131231-d02d263e614e\n" in tagged
    assert "\texample.com/a => example.com/a v3.274.1\n" in tagged
    assert "\texample.com/b v1.0.0 => example.com/c v1.2.0\n" in tagged
    pseudo = build.replaced_go_mod("github.com/pulumi/pulumi/pkg/v3", "v4.0.0-20260115033456-f47bc2d6f199", PKG_GO_MOD, {"example.com/a": "v1.0.0"})
    assert "\tgithub.com/pulumi/pulumi/sdk/v3 => github.com/pulumi/pulumi/sdk/v3 f47bc2d6f199\n" in pseudo
    assert "\texample.com/a => example.com/a v1.0.0\n" in pseudo


def test_pseudo_versions_name_their_commit():
    assert build.sibling_version("v4.0.0-20260115033456-f47bc2d6f199") == "f47bc2d6f199"
    assert build.sibling_version("v4.2.1-0.20260115033456-f47bc2d6f199") == "f47bc2d6f199"
    assert build.sibling_version("v3.274.1") == "v3.274.1"


def test_units_build_the_pinned_versions_and_stamp_them():
    cli, provider = engine.units()
    assert (cli.module, cli.version) == (versions.PULUMI_CLI_MODULE, versions.PULUMI_CLI_VERSION)
    assert f"-X {versions.PULUMI_SDK_MODULE}/go/common/version.Version={versions.PULUMI_CLI_VERSION}" in cli.ldflags
    assert (provider.module, provider.version) == (versions.PULUMI_KUBERNETES_PROVIDER_MODULE, versions.PULUMI_KUBERNETES_PROVIDER_VERSION)
    assert provider.ldflags.endswith(f"/pkg/version.Version={versions.PULUMI_KUBERNETES_PROVIDER_RELEASE}")
    assert provider.replace_pins == {versions.PULUMI_KUBERNETES_SDK_MODULE: versions.PULUMI_KUBERNETES_SDK_GO_VERSION}
    assert cli.bin_dir.parent == provider.bin_dir.parent == build.cache_dir() / "bin"
