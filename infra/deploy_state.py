"""What earlier deploys of this stack left in the account, read back as plain values.

A few decisions depend on what was deployed before, not on the stack config: who created the
cluster (EKS gave that principal the bootstrap admin entry) and which Trainer release is installed
(an in-place switch between releases is not an upgrade Helm can do). Each is kept in an SSM
parameter named after the cluster and read synchronously before anything is registered; a
missing parameter means a first deploy.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from config.names import SSM_PARAMETER

BOOTSTRAP_ADMIN = "bootstrap-admin"
TRAINER_VERSION = "trainer-version"
RETAINED_BUILDS = "retained-builds"  # infra/registry.py pushed_image: the state's image build is retain_on_delete


def parameter_name(cluster_name: str, key: str) -> str:
    return SSM_PARAMETER.name("/training-platform", cluster_name, key, sep="/")


def read_parameter(name: str, opts: pulumi.InvokeOptions | None = None) -> str | None:
    """The parameter's value, or None when it does not exist (any other error is raised)."""
    try:
        return aws.ssm.get_parameter(name=name, opts=opts).value
    except Exception as err:  # noqa: BLE001 - the provider reports a missing parameter as an error
        # SSM GetParameter's error code for a missing name is ParameterNotFound (SSM API
        # Reference, GetParameter "Errors"); the provider's message carries it. Not checked
        # against a live account: if the text differed, a first deploy would fail loudly here.
        if "ParameterNotFound" not in str(err):
            raise
        return None


def trainer_switch_error(*, installed: str | None, wanted: str, allow_upgrade_from: str | None) -> str | None:
    """Why switching the installed Trainer release to ``wanted`` is refused, or None.

    v2.1.0 ships its CRDs in the chart's ``crds/`` folder (never upgraded by Helm), v2.3.0 renders
    them as templates, and JobSet's CRD is in ``crds/`` in both: the switch needs the procedure of
    docs/trainer-upgrade.md first, which ``trainer.allowUpgradeFrom`` acknowledges. Going back
    from v2.3.0 would delete the templated CRDs, and with them every TrainJob.
    """
    if installed is None or installed == wanted:
        return None
    order = ["v2.1.0", "v2.3.0"]
    if installed in order and wanted in order and order.index(wanted) < order.index(installed):
        return f"Trainer {installed} is installed; going back to {wanted} would delete its CRDs and every TrainJob: not supported"
    if allow_upgrade_from != installed:
        return (
            f"Trainer {installed} is installed and {wanted} is not an in-place upgrade (CRDs): follow docs/trainer-upgrade.md, "
            f"then set trainer.allowUpgradeFrom: {installed}"
        )
    return None
