"""The preflight doctor: one fact-gathering round trip per node, pure checks, findings."""

from provisioner.checks.findings import Finding
from provisioner.doctor.run import CATALOGUE, DoctorReport, run_doctor

__all__ = ["CATALOGUE", "DoctorReport", "Finding", "run_doctor"]
