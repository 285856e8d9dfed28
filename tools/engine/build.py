"""Build the Pulumi engine (``make engine-build``) and give the environment that runs it.

The CLI (``pulumi``) and the Kubernetes provider (``pulumi-resource-kubernetes``) are built from their
Go modules at the versions ``versions.py`` pins, with the local control plane's build machinery
(``tools.cluster.build``: cached under ``<cache>/bin/<unit>/``). The engine runs with a PULUMI_HOME of
its own (``out/engine/pulumi-home`` or a test's), never the user's ``~/.pulumi``, whose plugins are our
language host (``tools/engine/pulumi-language-python``) and the provider, and no plugin from PATH.

Usage: python -m tools.engine.build   (prints what it built and how long it took)
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import versions
from tools.cluster import build

HOST_DIR = pathlib.Path(__file__).resolve().parent  # pulumi-language-python, our language host
PROJECT_DIR = HOST_DIR.parent.parent
EXEC_SCRIPT = "pulumi-language-python-exec"
PROVIDER_SCHEMA_DIR = "cmd/pulumi-resource-kubernetes"  # schema.json and terraform-mapping.json in the provider module


def cli() -> build.Unit:
    return build.Unit(
        versions.PULUMI_CLI_MODULE,
        versions.PULUMI_CLI_VERSION,
        {"pulumi": f"{versions.PULUMI_CLI_MODULE}/cmd/pulumi"},
        replaces=True,
        version_var=f"{versions.PULUMI_SDK_MODULE}/go/common/version.Version",
        stamp=versions.PULUMI_CLI_VERSION,
    )


# Our main for the provider: the module's own cmd/pulumi-resource-kubernetes embeds schema-embed.json and
# terraform-mapping-embed.json, which its `go generate` writes (not in the module); _provider_files writes them.
PROVIDER_MAIN = """// The Pulumi Kubernetes provider: serves the provider module's plugin with its schema.
package main

import (
	_ "embed"

	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider"
	"github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/version"
)

//go:embed schema-embed.json
var schema []byte

//go:embed terraform-mapping-embed.json
var terraformMapping []byte

func main() {
	provider.Serve("kubernetes", version.Version, schema, terraformMapping)
}
"""


def provider_version() -> str:
    """The version the provider binary reports: the release its commit is."""
    return versions.PULUMI_KUBERNETES_PROVIDER_RELEASE


def _provider_files(package_dir: pathlib.Path) -> None:
    source = build.module_dir(versions.PULUMI_KUBERNETES_PROVIDER_MODULE, versions.PULUMI_KUBERNETES_PROVIDER_VERSION) / PROVIDER_SCHEMA_DIR
    schema = json.loads((source / "schema.json").read_text())
    schema["version"] = provider_version()  # what the release build's generate step stamps
    (package_dir / "schema-embed.json").write_text(json.dumps(schema, separators=(",", ":")))
    mapping = json.loads((source / "terraform-mapping.json").read_text())
    (package_dir / "terraform-mapping-embed.json").write_text(json.dumps(mapping, separators=(",", ":")))


def kubernetes_provider() -> build.Unit:
    return build.Unit(
        versions.PULUMI_KUBERNETES_PROVIDER_MODULE,
        versions.PULUMI_KUBERNETES_PROVIDER_VERSION,
        {"pulumi-resource-kubernetes": f"{build.BUILD_MODULE}/pulumi-resource-kubernetes"},
        main=PROVIDER_MAIN,
        prepare=_provider_files,
        replaces=True,
        replace_pins={versions.PULUMI_KUBERNETES_SDK_MODULE: versions.PULUMI_KUBERNETES_SDK_GO_VERSION},
        version_var=f"{versions.PULUMI_KUBERNETES_PROVIDER_MODULE}/pkg/version.Version",
        stamp=provider_version(),
    )


def units() -> list[build.Unit]:
    return [cli(), kubernetes_provider()]


def sdk_plugin_version(package: str) -> str:
    """The provider version the installed Python SDK ``package`` asks the engine for (its pulumi-plugin.json)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise build.BuildError(f"the Python package {package} is not installed (make venv)")
    return json.loads((pathlib.Path(spec.origin).parent / "pulumi-plugin.json").read_text())["version"]


def exec_script() -> pathlib.Path:
    """pulumi-language-python-exec of the SDK module at the CLI's version, from the Go module cache."""
    return build.module_dir(versions.PULUMI_SDK_MODULE, versions.PULUMI_SDK_VERSION) / "python" / "cmd" / EXEC_SCRIPT


def default_home() -> pathlib.Path:
    """This checkout's PULUMI_HOME (out/ is ignored by git): the plugins installed there name this
    checkout's language host, so two checkouts sharing the build cache do not share it."""
    return PROJECT_DIR / "out" / "engine" / "pulumi-home"


def missing() -> list[str]:
    """What ``make engine-build`` has not built yet (empty when the engine is ready)."""
    return [f"{u.module}@{u.version}" for u in units() if not u.built]


def _link(target: pathlib.Path, link: pathlib.Path) -> None:
    if link.is_symlink() and os.readlink(link) == str(target):
        return
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def install_plugins(home: pathlib.Path) -> None:
    """The engine's plugins in ``home`` (a PULUMI_HOME), as links: our language host with the SDK's exec
    script beside it, and the Kubernetes provider as the version the pinned Python SDK asks for.

    Provider versions: the proxy serves the provider's code at one commit only, release 4.25.0
    (versions.py), older than the Python SDK's release (requirements.txt). The program's SDK asks the engine for "kubernetes"
    at its own version (pulumi-plugin.json) and the engine, with ambient plugins off, loads it from
    ``plugins/resource-kubernetes-v<that version>/``: that is where the binary goes, so the engine runs it
    and never tries a download. The binary is stamped with its true version (4.25.0, in its
    GetPluginInfo and schema); the engine does not compare that with the
    directory's, and ``pulumi about`` lists the directory's, so ``make engine-build`` prints the skew.
    Stamping the binary as the SDK's version would hide it. Pinning the Python SDK to 4.25.0 instead
    would make the versions agree, but changes what the whole program is built and checked against
    (render, tests) nine minor releases back, for the engine's sake: that is the project's call.
    """
    plugins = home / "plugins"
    host = plugins / f"language-python-{versions.PULUMI_CLI_VERSION}"
    host.mkdir(parents=True, exist_ok=True)
    _link(HOST_DIR / "pulumi-language-python", host / "pulumi-language-python")
    _link(exec_script(), host / EXEC_SCRIPT)
    provider = plugins / f"resource-kubernetes-v{sdk_plugin_version('pulumi_kubernetes')}"
    provider.mkdir(parents=True, exist_ok=True)
    _link(kubernetes_provider().path("pulumi-resource-kubernetes"), provider / "pulumi-resource-kubernetes")


def env(home: pathlib.Path | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the engine runs in: its own PULUMI_HOME with the plugins installed, plugins from
    there only (none from PATH), our host on this Python, no update check."""
    home = home or default_home()
    install_plugins(home)
    out = dict(os.environ if base is None else base)
    out.update(
        {
            "PULUMI_HOME": str(home),
            "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
            "PULUMI_LANGUAGE_PYTHON_HOST_PYTHON": sys.executable,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DIY_BACKEND_NO_LEGACY_WARNING": "true",
        }
    )
    return out


def pulumi() -> pathlib.Path:
    return cli().path("pulumi")


def main() -> int:
    started = time.monotonic()
    try:
        for unit in units():
            build.build(unit, label="engine")
            for binary in unit.binaries:
                path = unit.path(binary)
                info = json.loads((unit.bin_dir / ".built").read_text())
                print(f"engine: {binary} {unit.version}: {path} ({path.stat().st_size / 2**20:.0f} MiB, built in {info['seconds']:.0f} s)")
        script = exec_script()
        install_plugins(default_home())
        print(
            f"engine: the Kubernetes provider is release {provider_version()} ({versions.PULUMI_KUBERNETES_PROVIDER_MODULE}@{versions.PULUMI_KUBERNETES_PROVIDER_VERSION},"
            f" the proxy serves no other), installed as the plugin version v{sdk_plugin_version('pulumi_kubernetes')} the pinned Python SDK asks for"
        )
    except build.BuildError as err:
        print(f"engine build: {err}", file=sys.stderr)
        return 2
    print(f"engine build: ready in {time.monotonic() - started:.0f} s; PULUMI_HOME {default_home()} (plugins: our language host with {script}, the Kubernetes provider)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
