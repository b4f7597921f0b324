"""Before `up` starts anything: the doctor's verdict, less what `up` itself will fix.

The doctor sees this cluster's own running Ray as "a Ray is already running" and "port in
use"; it turns those into warnings on the nodes where this cluster's Ray runs (the one
own-Ray waiver, `doctor.api.explained_by_own_ray`), since `up` keeps that Ray or replaces
it. A missing image is a warning the push fixes. Every other error stops `up` (unless
forced); another cluster's Ray on this cluster's ports stops it even when forced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provisioner.console import Reporter, quiet
from provisioner.doctor import DoctorReport, Finding, run_doctor
from provisioner.doctor.gather import stop_listeners
from provisioner.errors import OperationError
from provisioner.remote import Pool
from provisioner.runtime.context import ClusterContext


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


def blocking_errors(findings: list[Finding]) -> list[Finding]:
    """Pure: the errors that stop `up` (the doctor has already turned what this cluster's
    own Ray explains into warnings)."""
    return [f for f in findings if f.severity == "error"]


NEVER_FORCED = frozenset({"ray.cluster"})


class DoctorStopped(OperationError):
    """The doctor found errors `up` cannot fix; nothing was started. `unforceable`: the
    errors that stopped even `up --force`."""

    def __init__(self, preflight: Preflight, unforceable: list[Finding] | None = None) -> None:
        shown = unforceable or preflight.blocking
        lines = [f"{f.host}: {f.check}: {f.message}" for f in shown]
        fix = (
            "fix the findings above (`provisioner doctor -i INVENTORY` shows evidence and fixes), "
            "or run `provisioner up --force` to go on anyway"
        )
        if unforceable:
            fix = f"{unforceable[0].fix} (--force never starts onto another cluster's ports)"
        super().__init__(
            f"the doctor found {len(shown)} error(s); nothing was started:\n" + "\n".join(lines),
            fix,
        )
        self.preflight = preflight


def check(
    context: ClusterContext,
    pool: Pool | None = None,
    report: Reporter = quiet,
    *,
    force: bool = False,
    keep_listeners: bool = False,
) -> Preflight:
    """Run the doctor; raise DoctorStopped on errors `up` cannot fix (unless `force`).

    What this cluster's own running Ray explains is waived by the doctor (one waiver).
    `keep_listeners` (with a `pool`): the doctor's listeners are left for the caller to end
    (the report's `listeners`), except when this raises: then they are ended here."""
    keep = keep_listeners and pool is not None
    doctor = run_doctor(context, pool, report, ray_state=True, keep_listeners=keep)
    blocking = blocking_errors(doctor.findings)
    waived = list(doctor.waived)
    result = Preflight(doctor, blocking, waived, forced=force and bool(blocking))
    for host in sorted({f.host for f in waived}):
        checks = sorted({f.check for f in waived if f.host == host})
        report(f"{host}: {', '.join(checks)}: this cluster's own Ray (up keeps or replaces it)")
    # Another cluster's Ray on this cluster's ports: no --force starts onto them (this
    # cluster's Ray could not bind them, and its workers would take the other's ports).
    others = [f for f in blocking if f.check in NEVER_FORCED]
    if blocking and (not force or others):
        result.forced = False
        if pool is not None and doctor.listeners:
            stop_listeners(pool, context.inventory, doctor.listeners)
        raise DoctorStopped(result, others if force else [])
    for f in blocking:
        report(f"{f.host}: {f.check}: {f.message} (going on: --force)")
    return result
