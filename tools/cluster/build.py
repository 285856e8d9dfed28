"""Build the local control plane's components from their released Go modules, once per version.

Every binary comes from the Go module proxy at the version ``versions.py`` pins, built with the
machine's Go and kept under ``<cache>/bin/<unit>/`` (``<cache>`` is ``$TRAINING_PLATFORM_CACHE`` or
``~/.cache/training-platform``). A unit that is already built is not built again.

``k8s.io/kubernetes`` cannot be ``go install``ed: its go.mod replaces every ``k8s.io/*`` staging
module with a directory of its own tree. We build it from a small module of ours that requires it and
replaces each of those staging modules with its release at the matching ``v0.<minor>.<patch>``.
The other modules have no replace directives; they are built the same way, from a module of ours
that requires them.

Usage: python -m tools.cluster.build --stack dev | --all   (prints what it built and how long it took)
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import versions

BUILD_MODULE = "training-platform.local/build"
STAGING_REPLACE = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s*=>\s*\./staging/src/(k8s\.io/[A-Za-z0-9._-]+)\s*$")


class BuildError(Exception):
    """A component that could not be built, as one line for the user."""


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TRAINING_PLATFORM_CACHE") or pathlib.Path.home() / ".cache" / "training-platform")


@dataclass(frozen=True)
class Unit:
    """One build: binaries (name -> Go package) of one module at one version."""

    module: str
    version: str
    binaries: dict[str, str] = field(default_factory=dict)  # binary -> package
    staging: bool = False  # k8s.io/kubernetes: built through a module of ours with replace directives
    main: str | None = None  # Go source of our own main package (the binary's package is then ours)
    version_var: str | None = None  # a Go string variable the build stamps with ``stamp`` (-X)
    stamp: str | None = None
    replaces: bool = False  # copy the module's own replace directives into our build module (replaced_go_mod)
    replace_pins: dict[str, str] = field(default_factory=dict)  # sibling module -> version, where not the same commit's
    prepare: Callable[[pathlib.Path], None] | None = None  # writes extra files into our main's package directory

    @property
    def name(self) -> str:
        return f"{self.module.replace('/', '_')}@{self.version}"

    @property
    def bin_dir(self) -> pathlib.Path:
        return cache_dir() / "bin" / self.name

    def path(self, binary: str) -> pathlib.Path:
        return self.bin_dir / binary

    @property
    def ldflags(self) -> str:
        flags = "-s -w"
        if self.version_var is not None:
            flags += f" -X {self.version_var}={self.stamp}"
        if self.staging:
            # what the Kubernetes release build stamps (hack/lib/version.sh): clients such as Kueue
            # parse the API server's /version
            major, minor = self.version.removeprefix("v").split(".")[:2]
            for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
                flags += f" -X {pkg}.gitVersion={self.version} -X {pkg}.gitMajor={major} -X {pkg}.gitMinor={minor} -X {pkg}.gitTreeState=clean -X {pkg}.buildDate=1970-01-01T00:00:00Z"
        return flags

    @property
    def built(self) -> bool:
        stamp = self.bin_dir / ".built"
        if not stamp.is_file() or not all(self.path(b).is_file() for b in self.binaries):
            return False
        try:
            info = json.loads(stamp.read_text())
        except ValueError:
            return False
        # a main of ours rebuilds when its source changes (a stamp from before digests were kept passes)
        same_pins = info.get("replace_pins", {}) == self.replace_pins
        return info.get("ldflags") == self.ldflags and info.get("main", self.main_digest) == self.main_digest and same_pins

    @property
    def main_digest(self) -> str | None:
        return hashlib.sha256(self.main.encode()).hexdigest() if self.main is not None else None


def kubernetes(minor: str) -> Unit:
    if minor not in versions.LOCAL_KUBERNETES_RELEASES:
        raise BuildError(f"no local Kubernetes release pinned for {minor} (versions.LOCAL_KUBERNETES_RELEASES has {', '.join(versions.LOCAL_KUBERNETES_RELEASES)})")
    cmds = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
    return Unit("k8s.io/kubernetes", versions.LOCAL_KUBERNETES_RELEASES[minor], {c: f"k8s.io/kubernetes/cmd/{c}" for c in cmds}, staging=True)


def trainer(version: str) -> Unit:
    return Unit(versions.TRAINER_MODULE, version, {"trainer-controller-manager": f"{versions.TRAINER_MODULE}/cmd/trainer-controller-manager"})


def jobset(trainer_version: str) -> Unit:
    # the JobSet manager's main package is the module root
    return Unit(versions.JOBSET_MODULE, versions.TRAINER_VERSIONS[trainer_version]["jobset"], {"jobset": versions.JOBSET_MODULE})


def kueue() -> Unit:
    return Unit(versions.KUEUE_MODULE, "v" + versions.KUEUE_VERSION, {"kueue": f"{versions.KUEUE_MODULE}/cmd/kueue"})


def karpenter() -> Unit:
    return Unit(versions.KARPENTER_CORE_MODULE, versions.KARPENTER_CORE_VERSION, {"karpenter-kwok": f"{versions.KARPENTER_CORE_MODULE}/kwok"})


ETCD_MAIN = """// The etcd server: its released server module's own entry point (etcdmain.Main), built here
// because the etcd/v3 root module (which holds etcd's main.go) replaces its siblings by path.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
"""


def etcd() -> Unit:
    return Unit(versions.ETCD_MODULE, versions.ETCD_VERSION, {"etcd": f"{BUILD_MODULE}/etcd"}, main=ETCD_MAIN)


def kwok() -> Unit:
    return Unit(versions.KWOK_MODULE, versions.KWOK_VERSION, {"kwok": f"{versions.KWOK_MODULE}/cmd/kwok"})


def helm() -> Unit:
    """Our ``helm-template`` main on the Helm SDK (not ``cmd/helm``: no registry, storage or cluster
    client to compile), rendering a chart as ``helm template`` does."""
    main = (pathlib.Path(__file__).parent / "helm_template.go").read_text()
    return Unit(versions.HELM_MODULE, versions.HELM_VERSION, {"helm-template": f"{BUILD_MODULE}/helm-template"}, main=main)


def units_for(kubernetes_minor: str, trainer_version: str, with_kueue: bool) -> list[Unit]:
    out = [kubernetes(kubernetes_minor), jobset(trainer_version), trainer(trainer_version), karpenter(), kwok(), etcd()]
    return out + ([kueue()] if with_kueue else [])


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("the go command is not on PATH: install Go (1.26 or newer) to build the local control plane")
    return go


def _run(unit: Unit, args: list[str], cwd: pathlib.Path, log: pathlib.Path, env: dict[str, str]) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(args)}\n")
        fh.flush()
        proc = subprocess.run(args, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
        raise BuildError(f"building {unit.module}@{unit.version} failed ({' '.join(args[:2])} exit {proc.returncode}): {' | '.join(tail)} (whole log: {log})")


def _download(module: str, version: str, field: str, env: dict[str, str] | None = None) -> pathlib.Path:
    """``go mod download -json``: the path it reports in ``field`` (GoMod: the go.mod; Dir: the files)."""
    proc = subprocess.run([_go(), "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, env=env, check=False)
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    if proc.returncode != 0 or field not in info:
        raise BuildError(f"cannot download {module}@{version} from the Go module proxy: {info.get('Error') or proc.stderr.strip()[-300:]}")
    return pathlib.Path(info[field])


def staging_go_mod(kubernetes_go_mod: str, version: str) -> str:
    """Our build module's go.mod: k8s.io/kubernetes at ``version`` with each of its staging
    replace directives (``k8s.io/x => ./staging/src/k8s.io/x``) pointing at ``k8s.io/x v0.<minor>.<patch>``."""
    staging_version = "v0." + version.removeprefix("v").split(".", 1)[1]
    replaces = []
    for line in kubernetes_go_mod.splitlines():
        m = STAGING_REPLACE.match(line)
        if m:
            replaces.append(f"\t{m.group(1)} => {m.group(2)} {staging_version}")
    if not replaces:
        raise BuildError(f"k8s.io/kubernetes@{version} go.mod lists no staging replace directives")
    go_line = next((line for line in kubernetes_go_mod.splitlines() if line.startswith("go ")), "go 1.24")
    return f"module training-platform.local/kubernetes-build\n\n{go_line}\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n" + "\n".join(replaces) + "\n)\n"


def sibling_version(version: str) -> str:
    """The version of a module that lives in the same repository commit as one at ``version``: the
    same tag, or for a pseudo-version its commit (``go mod tidy`` writes that as the sibling's own
    pseudo-version)."""
    m = re.fullmatch(r"v\d+\.\d+\.\d+-(?:[0-9A-Za-z.]+\.)?\d{14}-([0-9a-f]{12})", version)
    return m.group(1) if m else version


def replaced_go_mod(module: str, version: str, module_go_mod: str, pins: dict[str, str] | None = None) -> str:
    """Our build module's go.mod for a module whose go.mod has replace directives (which ``go install
    pkg@version`` refuses): each ``a => b v`` is copied; each ``a => ../dir`` (a sibling module of the
    same repository) becomes ``a => a <pins[a] or the sibling's version at the same commit>``."""
    replaces = []
    body = re.sub(r"//.*", "", module_go_mod)
    lines = [line.strip() for block in re.findall(r"^replace\s*\((.*?)^\)", body, re.S | re.M) for line in block.splitlines()]
    lines += re.findall(r"^replace\s+([^(\n].*)$", body, re.M)
    for line in filter(None, lines):
        left, _, right = (part.strip() for part in line.partition("=>"))
        target = right.split()
        if target[0].startswith(("./", "../")):
            name = left.split()[0]
            replaces.append(f"\t{name} => {name} {(pins or {}).get(name, sibling_version(version))}")
        else:
            replaces.append(f"\t{left} => {right}")
    go_line = next((line for line in module_go_mod.splitlines() if line.startswith("go ")), "go 1.24")
    body = f"module {BUILD_MODULE}\n\n{go_line}\n\nrequire {module} {version}\n"
    return body + ("\nreplace (\n" + "\n".join(replaces) + "\n)\n" if replaces else "")


def build(unit: Unit, *, echo=print, label: str = "cluster") -> float:
    """Build ``unit`` unless it is built; the seconds it took (0.0 when cached)."""
    if unit.built:
        return 0.0
    go = _go()
    started = time.monotonic()
    work = cache_dir() / "build" / unit.name
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(unit.bin_dir, ignore_errors=True)
    work.mkdir(parents=True)
    unit.bin_dir.mkdir(parents=True)
    log = work / "build.log"
    env = {**os.environ, "GOFLAGS": "-trimpath -buildvcs=false", "CGO_ENABLED": "0"}
    echo(f"{label}: building {unit.module}@{unit.version} ({', '.join(unit.binaries)}); log {log}")
    # a module of ours that requires the component (``go install pkg@version`` asks the proxy for the
    # module's version list to check deprecation, which a proxy may refuse)
    if unit.staging:
        go_mod = staging_go_mod(_download(unit.module, unit.version, "GoMod", env).read_text(), unit.version)
    elif unit.replaces:
        go_mod = replaced_go_mod(unit.module, unit.version, _download(unit.module, unit.version, "GoMod", env).read_text(), unit.replace_pins)
    else:
        go_mod = f"module {BUILD_MODULE}\n\ngo 1.24\n\nrequire {unit.module} {unit.version}\n"
    (work / "go.mod").write_text(go_mod)
    if unit.main is not None:
        for binary in unit.binaries:
            (work / binary).mkdir()
            (work / binary / "main.go").write_text(unit.main)
            if unit.prepare is not None:
                unit.prepare(work / binary)
    else:
        imports = "\n".join(f'\t_ "{pkg}"' for pkg in unit.binaries.values())
        (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    _run(unit, [go, "mod", "tidy"], work, log, env)
    for binary, pkg in unit.binaries.items():
        _run(unit, [go, "build", f"-ldflags={unit.ldflags}", "-o", str(unit.path(binary)), pkg], work, log, env)
    seconds = time.monotonic() - started
    (unit.bin_dir / ".built").write_text(
        json.dumps(
            {
                "module": unit.module,
                "version": unit.version,
                "seconds": round(seconds, 1),
                "ldflags": unit.ldflags,
                **({"main": unit.main_digest} if unit.main is not None else {}),
                **({"replace_pins": unit.replace_pins} if unit.replace_pins else {}),
            }
        )
        + "\n"
    )
    echo(f"{label}: built {unit.module}@{unit.version} in {seconds:.0f} s")
    return seconds


def build_all(units: list[Unit], *, echo=print) -> float:
    return sum(build(u, echo=echo) for u in units)


def module_dir(module: str, version: str) -> pathlib.Path:
    """The module's files (CRDs, webhook manifests) in the Go module cache, downloaded if needed."""
    return _download(module, version, "Dir")
