"""The preflight doctor: one fact-gathering round trip per node, pure checks, findings."""

from provisioner.doctor.api import DoctorReport, run_doctor
from provisioner.doctor.findings import CATALOGUE, Finding

__all__ = ["CATALOGUE", "DoctorReport", "Finding", "run_doctor"]
