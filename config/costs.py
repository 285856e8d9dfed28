"""What a stack costs per hour at its configured sizes, from the price table (``prices.yaml``, its
source and date there), and the EC2 vCPU quotas its GPU jobs need. ``make cost STACK=<stack>``
prints it (tools/cost.py); the README's figures come from it (tests/test_costs.py).

Priced: the EKS control plane, the managed node groups at ``desiredSize``, each enabled job's GPU
nodes while it runs. Named but not priced (no confirmed price in the table): NAT gateways, the
checkpoint file system, the portal's load balancer, the deploy-time GPU smoke check, CloudWatch,
data transfer. Quotas: EC2's on-demand quotas count vCPUs per group of families (the EC2 User
Guide's quota types, e.g. "Running On-Demand P instances"); a job's vCPUs come from the GPU catalog.
"""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from config import catalog, vpc_endpoints

if TYPE_CHECKING:
    from config.settings import Settings

_DATA = pathlib.Path(__file__).with_name("prices.yaml")

QUOTAS = {"g": "Running On-Demand G and VT instances", "p": "Running On-Demand P instances"}
"""GPU instance category -> the EC2 on-demand vCPU quota it counts against."""


@dataclass(frozen=True)
class Prices:
    region: str
    date: str
    eks_control_plane_per_hour: float
    instances: dict[str, float]
    interface_endpoint_per_az_hour: float = 0.0
    endpoint_per_gb: float = 0.0


@functools.cache
def prices() -> Prices:
    raw: dict[str, Any] = yaml.safe_load(_DATA.read_text())
    return Prices(region=raw["region"], date=str(raw["date"]), eks_control_plane_per_hour=float(raw["eksControlPlanePerHour"]), instances={k: float(v) for k, v in raw["instances"].items()},
                  interface_endpoint_per_az_hour=float(raw["interfaceEndpointPerAzHour"]), endpoint_per_gb=float(raw["endpointPerGb"]))


@dataclass
class Line:
    what: str
    count: int
    instance_type: str | None
    per_hour: float | None  # None: the table has no price for it

    @property
    def total(self) -> float | None:
        return None if self.per_hour is None else self.per_hour * self.count


@dataclass
class Estimate:
    stack: str
    region: str
    prices: Prices
    always_on: list[Line] = field(default_factory=list)
    jobs: dict[str, list[Line]] = field(default_factory=dict)
    unpriced: list[str] = field(default_factory=list)
    quotas: dict[str, int] = field(default_factory=dict)  # quota name -> vCPUs with every enabled job running

    @property
    def always_on_per_hour(self) -> float:
        return sum(line.total or 0.0 for line in self.always_on)

    def job_per_hour(self, name: str) -> float:
        return sum(line.total or 0.0 for line in self.jobs[name])

    @property
    def all_jobs_per_hour(self) -> float:
        return self.always_on_per_hour + sum(self.job_per_hour(n) for n in self.jobs)

    @property
    def missing_prices(self) -> list[str]:
        lines = [*self.always_on, *(x for ls in self.jobs.values() for x in ls)]
        return sorted({line.instance_type for line in lines if line.per_hour is None and line.instance_type})


def quota_needs(s: Settings) -> dict[str, int]:
    """EC2 on-demand vCPU quota name -> the vCPUs the stack's enabled jobs need of it at once."""
    needs: dict[str, int] = {}
    for job in s.trainjobs.jobs().values():
        info = catalog.lookup(job.instance_type)
        quota = QUOTAS.get(info.category, f"Running On-Demand {info.category.upper()} instances")
        needs[quota] = needs.get(quota, 0) + job.num_nodes * info.vcpu
    return needs


def estimate(s: Settings, table: Prices | None = None) -> Estimate:
    table = table or prices()
    est = Estimate(stack=s.stack, region=s.region, prices=table)
    est.always_on.append(Line("EKS control plane", 1, None, table.eks_control_plane_per_hour))
    for name, group in (("arm", s.node_groups.arm), ("x86", s.node_groups.x86)):
        est.always_on.append(Line(f"node group {name}", group.desired_size, group.instance_type, table.instances.get(group.instance_type)))
    for name, job in s.trainjobs.jobs().items():
        est.jobs[name] = [Line(f"job {name}", job.num_nodes, job.instance_type, table.instances.get(job.instance_type))]
    est.quotas = quota_needs(s)
    net = s.network
    if not net.vpc_id:
        zones = len(net.availability_zones) or net.az_count
        est.unpriced.append(f"{1 if net.nat_gateways == 'single' else zones} NAT gateway(s) with their Elastic IPs, per hour and per GB processed"
                            + (" (S3 and ECR image layers skip them: the S3 gateway endpoint, no charge)" if net.s3_gateway_endpoint else ""))
        if net.s3_gateway_endpoint:
            est.always_on.append(Line("S3 gateway endpoint", 1, None, 0.0))  # no charge (prices.yaml)
        if net.interface_endpoints:
            est.always_on.append(Line(f"interface endpoints ({len(vpc_endpoints.INTERFACE_SERVICES)} x {zones} AZ)", len(vpc_endpoints.INTERFACE_SERVICES) * zones, None, table.interface_endpoint_per_az_hour))
            est.unpriced.append(f"data through the interface endpoints, ${table.endpoint_per_gb:.2f} per GB processed")
    if s.trainjobs.jobs() or s.tenants.teams():
        store = s.trainjobs.checkpoint_storage
        est.unpriced.append(f"FSx for Lustre PERSISTENT_2, {store.capacity_gib} GiB at {store.throughput_per_tib} MB/s/TiB, per GB-month" if store.type == "fsx" else "EFS, per GB-month stored")
    if s.smoke_checks.enabled:
        est.unpriced.append("the GPU smoke check: one GPU node for a few minutes at each pulumi up")
    if s.portal.enabled:
        est.unpriced.append("the portal's Application Load Balancer, per hour and per LCU")
    if s.observability.mode != "none":
        est.unpriced.append("CloudWatch metrics, logs and alarms (observability.mode cloudwatch)" if s.observability.mode == "cloudwatch" else f"the monitoring stack's share of the node groups (observability.mode {s.observability.mode})")
    est.unpriced.append("data transfer, EBS root volumes, ECR storage, SSM parameters")
    return est


def render(est: Estimate) -> str:
    """The estimate as the lines ``make cost`` prints."""
    p = est.prices

    def money(v: float | None) -> str:
        return "unpriced" if v is None else f"${v:,.2f}/h"

    out = [f"cost of stack {est.stack} ({est.region}) at its configured sizes, on-demand, USD per hour",
           f"prices: config/prices.yaml ({p.region}, {p.date}); they may differ in {est.region}" if p.region != est.region else f"prices: config/prices.yaml ({p.region}, {p.date})",
           "always on:"]
    for line in est.always_on:
        out.append(f"  {line.what:<22} {line.count:>3} x {line.instance_type or '':<14} {money(line.total)}")
    out.append(f"  {'total':<41} {money(est.always_on_per_hour)}")
    if est.jobs:
        out.append("while a job runs (GPU nodes, added to the above):")
        for lines in est.jobs.values():
            for line in lines:
                out.append(f"  {line.what:<22} {line.count:>3} x {line.instance_type or '':<14} {money(line.total)}")
        out.append(f"  {'every enabled job at once, all in':<41} {money(est.all_jobs_per_hour)}")
        out.append("vCPU quotas for every enabled job at once (EC2 Service Quotas, on-demand):")
        for quota, vcpus in sorted(est.quotas.items()):
            out.append(f"  {quota}: {vcpus} vCPUs")
    if est.missing_prices:
        out.append(f"no price in config/prices.yaml for: {', '.join(est.missing_prices)} (counted as 0)")
    out.append("not priced here: " + "; ".join(est.unpriced))
    return "\n".join(out)
