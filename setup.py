"""The wheel holds what trainctl runs and nothing that loads Pulumi (pyproject.toml has the rest).

``k8s`` and ``workloads`` are packages of the Pulumi program as well: their own modules (the
Kubernetes components, the TrainJob stacks) stay in the repository; the wheel takes only their
``__init__`` and their pure subpackages (builders, pods, programs). tests/test_packaging.py checks
that no module of the wheel imports Pulumi.
"""

from setuptools import setup
from setuptools.command.build_py import build_py

PROGRAM_PACKAGES = ("k8s", "workloads")


class PureBuildPy(build_py):
    def find_package_modules(self, package, package_dir):
        found = super().find_package_modules(package, package_dir)
        if package in PROGRAM_PACKAGES:
            return [(pkg, module, path) for pkg, module, path in found if module == "__init__"]
        return found


setup(cmdclass={"build_py": PureBuildPy})
