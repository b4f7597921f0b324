"""Before `up` starts anything: the doctor's verdict, less what `up` itself will fix.

The doctor sees this cluster's own running Ray as "a Ray is already running" and "port in
use". On a node where this cluster's container exists, `up` either keeps that Ray (it is
healthy) or replaces the container, so those findings are waived there and only there.
A missing image is a warning the push fixes. Every other error stops `up` (unless forced).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provisioner.console import Reporter, quiet
from provisioner.doctor import DoctorReport, Finding, run_doctor
from provisioner.errors import OperationError
from provisioner.inventory import Inventory
from provisioner.remote import Pool

# Findings that this cluster's own Ray container explains on the node that runs it.
OWN_RAY_CHECKS = frozenset({"ray.stale", "ports.free", "ports.worker_range"})


@dataclass
class Preflight:
    report: DoctorReport
    blocking: list[Finding] = field(default_factory=list)
    waived: list[Finding] = field(default_factory=list)
    forced: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            **self.report.to_json(),
            "blocking": [f.to_dict() for f in self.blocking],
            "waived": [f.to_dict() for f in self.waived],
            "forced": self.forced,
        }


def split(findings: list[Finding], own_nodes: set[str]) -> tuple[list[Finding], list[Finding]]:
    """Pure: (errors that stop `up`, errors waived because this cluster's Ray explains them)."""
    blocking: list[Finding] = []
    waived: list[Finding] = []
    for f in findings:
        if f.severity != "error":
            continue
        if f.check in OWN_RAY_CHECKS and f.host in own_nodes:
            waived.append(f)
        else:
            blocking.append(f)
    return blocking, waived


class DoctorStopped(OperationError):
    """The doctor found errors `up` cannot fix; nothing was started."""

    def __init__(self, preflight: Preflight) -> None:
        lines = [f"{f.host}: {f.check}: {f.message}" for f in preflight.blocking]
        super().__init__(
            f"the doctor found {len(preflight.blocking)} error(s); nothing was started:\n"
            + "\n".join(lines),
            "fix the findings above (`provisioner doctor -i INVENTORY` shows evidence and fixes), "
            "or run `provisioner up --force` to go on anyway",
        )
        self.preflight = preflight


def own_nodes(doctor: DoctorReport, cluster: str) -> set[str]:
    """Pure: the nodes that hold a container of this cluster, in any state."""
    return {name for name, facts in doctor.facts.items() if facts.holds_cluster(cluster)}


def check(
    inventory: Inventory,
    *,
    force: bool = False,
    report: Reporter = quiet,
    pool: Pool | None = None,
) -> Preflight:
    """Run the doctor; raise DoctorStopped on errors `up` cannot fix (unless `force`).

    Findings that this cluster's own containers explain are waived on their nodes."""
    doctor = run_doctor(inventory, report=report, pool=pool)
    blocking, waived = split(doctor.findings, own_nodes(doctor, inventory.cluster))
    result = Preflight(doctor, blocking, waived, forced=force and bool(blocking))
    for host in sorted({f.host for f in waived}):
        checks = sorted({f.check for f in waived if f.host == host})
        report(f"{host}: {', '.join(checks)}: this cluster's own Ray (up keeps or replaces it)")
    if blocking and not force:
        raise DoctorStopped(result)
    for f in blocking:
        report(f"{f.host}: {f.check}: {f.message} (going on: --force)")
    return result
