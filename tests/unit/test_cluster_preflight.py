"""`up`'s reading of the doctor: its own Ray is waived on its own nodes, nothing else."""

from __future__ import annotations

from provisioner.cluster.preflight import OWN_RAY_CHECKS, split
from provisioner.doctor import Finding


def f(check: str, host: str, severity: str = "error") -> Finding:
    return Finding(check, severity, host, f"{check} on {host}")  # type: ignore[arg-type]


def test_own_ray_waived_only_where_this_cluster_runs() -> None:
    findings = [f("ray.stale", "h"), f("ports.free", "h"), f("ports.free", "w2")]
    blocking, waived = split(findings, own_nodes={"h"})
    assert [x.host for x in waived] == ["h", "h"]
    assert blocking == [f("ports.free", "w2")]


def test_other_errors_always_block() -> None:
    findings = [f("net.reachability", "h"), f("docker.daemon", "h"), f("shell.env", "w1")]
    blocking, waived = split(findings, own_nodes={"h", "w1"})
    assert blocking == findings and waived == []


def test_warnings_and_oks_never_block() -> None:
    findings = [f("image.present", "w1", "warning"), f("ports.free", "w1", "ok")]
    assert split(findings, own_nodes=set()) == ([], [])


def test_waived_checks_are_the_own_ray_ones() -> None:
    assert OWN_RAY_CHECKS == {"ray.stale", "ports.free", "ports.worker_range"}
