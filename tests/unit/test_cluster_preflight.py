"""`up`'s reading of the doctor: its own Ray is waived on its own nodes, nothing else."""

from __future__ import annotations

from provisioner.cluster import headprobe
from provisioner.cluster.preflight import own_nodes, split
from provisioner.cluster.probe import best_per_address
from provisioner.doctor import DoctorReport, Finding
from provisioner.doctor.facts import NodeFacts, parse_facts


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


def test_a_replaced_raylet_still_listed_alive_is_not_counted() -> None:
    old = {"node_id": "old", "ip": "10.0.0.12", "alive": True}
    head = {"node_id": "h", "ip": "10.0.0.10", "alive": True}
    dead = {"node_id": "d", "ip": "10.0.0.11", "alive": False}
    nodes = [head, old, dead]
    assert headprobe.alive_addresses(nodes, frozenset({"old"})) == {"10.0.0.10"}
    new = {"node_id": "new", "ip": "10.0.0.12", "alive": True}
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


def test_own_nodes_are_those_holding_this_clusters_container_in_any_state() -> None:
    def told(containers: str) -> NodeFacts:
        return parse_facts("n", f"@@containers\n{containers}\n@@end\n")

    report = DoctorReport(
        findings=[],
        nodes=["h", "w1", "w2", "w3"],
        facts={
            "h": told("ray-lab\tabc123\trunning\tlab"),
            "w1": told("ray-lab\tabc123\texited\tlab"),
            "w2": told("ray-other\tabc123\trunning\tother\nweb\tnginx\trunning\t"),
            "w3": told(""),
        },
    )
    assert own_nodes(report, "lab") == {"h", "w1"}
