"""Ports Ray needs free on a node, who holds a busy one, and a Ray left running."""

from __future__ import annotations

import shlex

from provisioner.doctor.facts import Listener, NodeFacts
from provisioner.doctor.findings import Finding, error, ok, warning
from provisioner.doctor.plan import Plan
from provisioner.doctor.ports import needed_ports
from provisioner.inventory import Node

RAY_PROCESSES = ("raylet", "gcs_server", "ray::")


def _holder(listener: Listener) -> str:
    if listener.process:
        return f"{listener.process} (pid {listener.pid})"
    return "a process of another user (run the doctor with passwordless sudo to name it)"


def _is_ray(listener: Listener) -> bool:
    return listener.process.startswith(RAY_PROCESSES)


def check_ports(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    by_port: dict[int, list[Listener]] = {}
    for listener in f.listening:
        by_port.setdefault(listener.port, []).append(listener)
    findings = []
    for name, port in needed_ports(node, plan.ports).items():
        if port not in by_port:
            continue
        holders = by_port[port]
        evidence = "; ".join(f"{h.address}:{h.port} {_holder(h)}" for h in holders)
        if any(_is_ray(h) for h in holders):
            fix = (
                f"a Ray is still running on {node.name}: "
                "provisioner down -i INVENTORY, or `ray stop` there"
            )
        else:
            fix = (
                f"stop what holds port {port} on {node.name}, "
                f"or pick another port (ray.ports.{name} in the inventory)"
            )
        findings.append(
            error(
                "ports.free",
                node.name,
                f"port {port} ({name}) is in use by {_holder(holders[0])}",
                evidence,
                fix,
            )
        )
    if not findings:
        findings.append(
            ok("ports.free", node.name, f"{len(needed_ports(node, plan.ports))} Ray ports free")
        )
    busy_range = sorted({p for p in by_port if plan.ports.min_worker <= p <= plan.ports.max_worker})
    if busy_range:
        shown = ", ".join(f"{p} {_holder(by_port[p][0])}" for p in busy_range[:5])
        findings.append(
            warning(
                "ports.worker_range",
                node.name,
                f"{len(busy_range)} port(s) of Ray's worker range "
                f"{plan.ports.min_worker}-{plan.ports.max_worker} in use",
                shown + (" ..." if len(busy_range) > 5 else ""),
                "stop those services or move the range (ray.ports.min_worker / max_worker)",
            )
        )
    return findings


def check_stale_ray(node: Node, f: NodeFacts, shared: bool = False) -> list[Finding]:
    """A Ray already running on the node: an error (it takes ports and memory), or on
    shared nodes (`shared`: another job's cluster on this allocation's nodes) a warning."""
    evidence = []
    if f.ray_processes:
        evidence.append("processes: " + "; ".join(line.strip() for line in f.ray_processes[:5]))
    ray_containers = [
        c
        for c in f.containers
        if c.state == "running" and (c.cluster_label or c.name.startswith("ray"))
    ]
    if ray_containers:
        evidence.append(
            "containers: " + ", ".join(f"{c.name} ({c.image}, {c.state})" for c in ray_containers)
        )
    if evidence and f.ray_session:
        evidence.append(f"session: {f.ray_session}")
    if not evidence:
        note = " (an old session directory is left in /tmp/ray, harmless)" if f.ray_session else ""
        return [ok("ray.stale", node.name, "no Ray running" + note)]
    names = " ".join(shlex.quote(c.name) for c in ray_containers)  # node text: quoted
    fix = "provisioner down -i INVENTORY"
    if ray_containers:
        fix += f" (or docker rm -f {names} on {node.name})"
    if f.ray_processes:
        fix += (
            f"; for a Ray started by hand: stop it where it was started on {node.name} "
            "(`ray stop` would stop every Ray there, other users' too)"
        )
    if shared:
        return [
            warning(
                "ray.stale",
                node.name,
                "another Ray runs on this shared node (another job's, on its own ports)",
                "\n".join(evidence),
                "nothing to do: this cluster's ports are checked apart (ports.free)",
            )
        ]
    return [
        error(
            "ray.stale",
            node.name,
            "a Ray is already running on this node",
            "\n".join(evidence),
            fix,
        )
    ]
