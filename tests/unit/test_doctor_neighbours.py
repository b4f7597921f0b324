"""This cluster's Ray, another cluster's, a stale one: judged on facts from real lab nodes.

golden/doctor/two_clusters_{head,worker}.txt: facts.sh's output on a lab's head and first
worker while two clusters ran there: `i15` (Ray's usual ports, docker) and `i15-b`
(`ray: {port_base: 20000}`, docker) with a job running (a `time.sleep` playbook submitted
with `--detach`). Captured as scripts/capture_goldens.py's `facts_text` runs facts.sh
(no listener), on the 3-node lab of tests/e2e/test_shared_nodes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.findings import Finding
from provisioner.checks.intent import Plan
from provisioner.checks.neighbours import free_base, port_owner, rays_on_node
from provisioner.cluster.up import _refuse_foreign_gcs
from provisioner.doctor.run import DoctorReport, node_findings
from provisioner.errors import OperationError
from provisioner.inventory import Inventory, Node, RayPorts, SSHSettings
from provisioner.runtime import judges
from provisioner.runtime.docker.doctor import parse as docker_parse
from provisioner.runtime.docker.runtime import CAPS as DOCKER_CAPS
from provisioner.runtime.protocol import RayState

GOLDEN = Path(__file__).parent / "golden" / "doctor"
SSH = SSHSettings(user="lab")
HEAD = Node("provisioner-i15-0", "10.250.115.10", "head", SSH)
WORKER = Node("provisioner-i15-1", "10.250.115.11", "worker", SSH)


def facts(name: str, node: Node) -> NodeFacts:
    return parse_facts(node.name, (GOLDEN / f"{name}.txt").read_text(), runtime=docker_parse)


def plan_for(cluster: str, ports: RayPorts, free: int | None = None) -> Plan:
    return Plan(ports=ports, head=HEAD.name, cluster=cluster, free_base=free, caps=DOCKER_CAPS)


def by_check(findings: list[Finding], check: str) -> list[Finding]:
    return [f for f in findings if f.check == check]


def test_each_ray_is_told_with_its_cluster_ports_and_job() -> None:
    rays = {r.cluster: r for r in rays_on_node(facts("two_clusters_head", HEAD))}
    assert set(rays) == {"i15", "i15-b"}
    a, b = rays["i15"], rays["i15-b"]
    assert a.via == "container ray-i15" and b.via == "container ray-i15-b"
    assert b.job and not a.job
    assert {6379, 8076, 8077, 8078, 8079, 8090, 52365} <= a.ports
    assert set(range(10002, 20000)) <= a.ports
    assert {20000, 20003, 20004, 20005, 20006, 20007, 20008} <= b.ports
    assert set(range(20100, 21000)) <= b.ports and not a.ports & set(range(20000, 21000))
    owners = [port_owner(facts("two_clusters_head", HEAD), p) for p in (6379, 20000, 22)]
    assert [o.cluster if o else None for o in owners] == ["i15", "i15-b", None]
    workers = {r.cluster: r for r in rays_on_node(facts("two_clusters_worker", WORKER))}
    assert set(workers) == {"i15", "i15-b"} and not workers["i15-b"].job


def test_a_third_cluster_on_overlapping_ports_is_an_error_naming_the_other() -> None:
    head, worker = facts("two_clusters_head", HEAD), facts("two_clusters_worker", WORKER)
    ports = RayPorts.from_base(20500)
    free = free_base([head, worker], ports)
    assert free == 21000
    plan = plan_for("i15-c", ports, free)
    found = by_check(node_findings(HEAD, head, plan, judges(plan.runtime)), "ray.cluster")
    (error,) = [f for f in found if f.severity == "error"]
    assert error.message == (
        "cluster i15-b's Ray (container ray-i15-b, a job is running) uses port(s) "
        "20500-20508, 20600-20999 that this cluster needs"
    )
    assert "ray: {port_base: 21000}" in error.fix and "leave it running" in error.fix
    (fine,) = [f for f in found if f.severity == "ok"]
    assert fine.message.startswith("cluster i15's Ray (container ray-i15) runs here on other")
    everything = node_findings(HEAD, head, plan, judges(plan.runtime)) + node_findings(
        WORKER, worker, plan, judges(plan.runtime)
    )
    # nothing else blames the other clusters, and no fix removes or stops them
    assert not [f for f in everything if f.check == "ray.stale" and f.severity == "error"]
    assert not any("rm -f" in f.fix or "provisioner down" in f.fix for f in found)
    assert not any("ray-i15" in f.fix for f in everything)


def test_another_cluster_on_its_own_block_is_fine_and_its_own_ray_is_this_clusters() -> None:
    head = facts("two_clusters_head", HEAD)
    for cluster, ports, other in (
        ("i15-b", RayPorts.from_base(20000), "i15"),
        ("i15", RayPorts(), "i15-b"),
    ):
        found = by_check(
            node_findings(HEAD, head, plan_for(cluster, ports), judges("docker")),
            "ray.cluster",
        )
        assert [(f.severity, f.message.split("'s Ray")[0]) for f in found] == [
            ("ok", f"cluster {other}")
        ]


def test_the_usual_ports_meet_the_usual_ports() -> None:
    """Two clusters left on Ray's usual ports: the second is stopped, naming the first."""
    head = facts("two_clusters_head", HEAD)
    plan = plan_for("other", RayPorts(), 21000)
    errors = [
        f for f in node_findings(HEAD, head, plan, judges(plan.runtime)) if f.severity == "error"
    ]
    assert {f.check for f in errors} == {"ray.cluster"}
    messages = " ".join(f.message for f in errors)
    assert "cluster i15's Ray" in messages and "6379" in messages and "10001-19999" in messages


def test_up_force_never_takes_another_clusters_gcs_for_its_own(tmp_path: Path) -> None:
    """`up --force` past the doctor: the head's GCS port held by another cluster's Ray
    stops it before anything starts (the GCS wait would otherwise see that GCS)."""

    head = facts("two_clusters_head", HEAD)
    report = DoctorReport(findings=[], nodes=[HEAD.name], facts={HEAD.name: head})
    other = Inventory(path=tmp_path / "i.yaml", cluster="other", head=HEAD, workers=(WORKER,))
    with pytest.raises(OperationError) as caught:
        _refuse_foreign_gcs(other, report, {HEAD.name: RayState()})
    assert "the GCS port 6379 is held by cluster i15's Ray" in caught.value.message
    assert "nothing was started" in caught.value.message
    # the cluster's own running head, or a free GCS port: nothing to refuse
    _refuse_foreign_gcs(other, report, {HEAD.name: RayState(status="running")})
    moved = Inventory(
        path=tmp_path / "i.yaml",
        cluster="other",
        head=HEAD,
        workers=(WORKER,),
        ports=RayPorts.from_base(23000),
    )
    _refuse_foreign_gcs(moved, report, {HEAD.name: RayState()})


def test_host_mode_rays_are_told_by_their_node_directory() -> None:
    """golden/doctor/host_two_clusters_head.txt: the host-mode lab's head with `i15-host`
    (usual ports) and `i15-host-b` (port_base 22000) running from the node's own Python.
    The lab node is itself a container, whose ID every process's cgroup names: a container
    the node's Docker does not list is the node's own, not a Ray container."""
    node = Node("provisioner-i15-host-0", "10.250.116.10", "head", SSH)
    head = facts("host_two_clusters_head", node)
    rays = {r.cluster: r for r in rays_on_node(head)}
    assert set(rays) == {"i15-host", "i15-host-b"}
    b = rays["i15-host-b"]
    assert b.via == "processes in the temp dir of cluster i15-host-b"
    assert {22000, 22003, 22004, 22005, 22006, 22007, 22008} <= b.ports
    assert set(range(22100, 23000)) <= b.ports
    idle = [p.pid for p in head.ray_owners if p.title == "ray::IDLE"]
    assert idle and all(any(pid in r.pids for r in rays.values()) for pid in idle)
    plan = Plan(
        ports=RayPorts.from_base(22500), head=node.name, cluster="i15-host-c", caps=DOCKER_CAPS
    )
    (error,) = [
        f
        for f in node_findings(node, head, plan, judges(plan.runtime))
        if f.check == "ray.cluster" and f.severity == "error"
    ]
    assert error.message.startswith(
        "cluster i15-host-b's Ray (processes in the temp dir of cluster i15-host-b) uses "
        "port(s) 22500-22508, 22600-22999"
    )
    stale = [
        f for f in node_findings(node, head, plan, judges(plan.runtime)) if f.check == "ray.stale"
    ]
    assert [f.severity for f in stale] == ["ok"]


def test_the_heads_store_naming_the_clusters_folder_is_not_a_ray_of_that_cluster() -> None:
    """The store's command line names the cluster's node folder (its data), as a host-mode
    Ray's does; it is no Ray: another cluster's doctor must not count it as one."""
    from dataclasses import replace

    from provisioner.checks.facts import Listener, RayProcess

    base = facts("two_clusters_head", HEAD)
    store = RayProcess(pid=4242, ppid=1, title="weed-0123456789", cluster="i15-c")
    raylet = RayProcess(pid=4343, ppid=1, title="raylet", cluster="i15-d")  # a control
    listening = (*base.listening, Listener("10.250.115.10", 23306, "weed-0123456789", 4242))
    seen = replace(base, ray_owners=(*base.ray_owners, store, raylet), listening=listening)
    clusters = {r.cluster for r in rays_on_node(seen)}
    assert "i15-c" not in clusters and "i15-d" in clusters
    assert port_owner(seen, 23306) is None
