"""`up`'s reading of the doctor, and of the GCS: its own Ray is waived (by the doctor) on its
own nodes, nothing else; replaced raylets do not count."""

from __future__ import annotations

from provisioner.cluster import headprobe
from provisioner.cluster.headprobe import GcsNode
from provisioner.cluster.preflight import blocking_errors
from provisioner.cluster.probe import best_per_address
from provisioner.doctor import Finding


def f(check: str, host: str, severity: str = "error") -> Finding:
    return Finding(check, severity, host, f"{check} on {host}")  # type: ignore[arg-type]


def test_every_error_blocks_and_warnings_never_do() -> None:
    # What this cluster's own running Ray explains, the doctor has turned into warnings
    # already (tests/unit/test_doctor_own_ray.py): up waives nothing itself.
    findings = [f("net.reachability", "h"), f("docker.daemon", "h"), f("shell.env", "w1")]
    assert blocking_errors(findings) == findings
    assert blocking_errors([f("image.present", "w1", "warning"), f("ports.free", "w1", "ok")]) == []


def test_a_replaced_raylet_still_listed_alive_is_not_counted() -> None:
    old = GcsNode("old", "10.0.0.12", True)
    head = GcsNode("h", "10.0.0.10", True)
    dead = GcsNode("d", "10.0.0.11", False)
    nodes = [head, old, dead]
    assert set(headprobe.fresh_nodes(nodes, frozenset({"old"}))) == {"10.0.0.10"}
    new = GcsNode("new", "10.0.0.12", True)
    fresh = headprobe.fresh_nodes([*nodes, new], frozenset({"old"}))
    assert fresh == {"10.0.0.10": head, "10.0.0.12": new}


def test_placement_keeps_one_result_per_address_and_a_success_wins() -> None:
    # The GCS can list two alive IDs at one address (a raylet killed without a goodbye and
    # its replacement): the task pinned to the dead one fails, the other runs there.
    dead = {"ip": "10.0.0.12", "ok": False, "error": "TaskUnschedulableError: gone"}
    live = {"ip": "10.0.0.12", "ok": True, "ran_on": "10.0.0.12"}
    head = {"ip": "10.0.0.10", "ok": True, "ran_on": "10.0.0.10"}
    assert best_per_address([head, dead, live]) == [head, live]
    assert best_per_address([live, dead]) == [live]
    # an address whose only tasks failed keeps its failure (the first one)
    other = {"ip": "10.0.0.12", "ok": False, "error": "no answer within 10s"}
    assert best_per_address([head, dead, other]) == [head, dead]
