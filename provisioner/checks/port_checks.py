"""Ports Ray needs free on a node, who holds a busy one, and a Ray left running: this
cluster's own, another cluster's (named, never to be removed for this one) or a stale one."""

from __future__ import annotations

import shlex

from provisioner.checks.facts import Listener, NodeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import Plan
from provisioner.checks.neighbours import STORE_PROCESS, RayOnNode, port_owner, rays_on_node
from provisioner.checks.ports import needed_ports
from provisioner.inventory import Node
from provisioner.node import layout

RAY_PROCESSES = ("raylet", "gcs_server", "ray::")


def _holder(listener: Listener) -> str:
    if listener.process:
        return f"{listener.process} (pid {listener.pid})"
    return "a process of another user (run the doctor with passwordless sudo to name it)"


def _is_store(listener: Listener) -> bool:
    return listener.process.startswith(STORE_PROCESS)


def _is_ray(listener: Listener) -> bool:
    return listener.process.startswith(RAY_PROCESSES)


def _another_cluster(ray: RayOnNode | None, plan: Plan) -> bool:
    return ray is not None and bool(ray.cluster) and not layout.is_named(ray.cluster, plan.cluster)


def block_fix(plan: Plan) -> str:
    """Move this cluster to a free port block (never the other cluster out of the way)."""
    if plan.free_base is None:
        return "give this cluster its own port block in the inventory: ray: {port_base: N}"
    return (
        f"give this cluster its own port block: ray: {{port_base: {plan.free_base}}} in the "
        "inventory (free on every node)"
    )


def _ranges(ports: set[int]) -> str:
    """'6379, 8076-8079, 10002-19999'."""
    out: list[str] = []
    for port in sorted(ports):
        if out and port == int(out[-1].rpartition("-")[2]) + 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{port}"
        else:
            out.append(str(port))
    return ", ".join(out)


def check_neighbours(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    """Another cluster's Ray on the node: an error naming the ports both need, else fine."""
    needed = set(needed_ports(node, plan.ports).values()) | set(plan.ports.worker_range)
    findings = []
    for ray in rays_on_node(f):
        if not _another_cluster(ray, plan):
            continue
        shared = needed & ray.ports
        if shared:
            findings.append(
                error(
                    "ray.cluster",
                    node.name,
                    f"{ray.describe()} uses port(s) {_ranges(shared)} that this cluster needs",
                    f"its ports here: {_ranges(ray.ports) or 'not known'}",
                    block_fix(plan) + f"; {ray.cluster} is another cluster: leave it running",
                )
            )
        else:
            findings.append(
                ok(
                    "ray.cluster",
                    node.name,
                    f"{ray.describe()} runs here on other ports ({_ranges(ray.ports) or '?'})",
                )
            )
    return findings


def check_ports(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    by_port: dict[int, list[Listener]] = {}
    for listener in f.listening:
        by_port.setdefault(listener.port, []).append(listener)
    findings = []
    others = 0
    wanted = needed_ports(node, plan.ports)
    if node.is_head:
        wanted |= plan.storage_ports
    for name, port in wanted.items():
        if port not in by_port:
            continue
        if name.startswith("storage.") and all(_is_store(h) for h in by_port[port]):
            continue  # a store of SeaweedFS on this cluster's store ports: its own, running
        owner = port_owner(f, port)
        if _another_cluster(owner, plan):
            others += 1  # ray.cluster names it, with the other cluster
            continue
        holders = by_port[port]
        evidence = "; ".join(f"{h.address}:{h.port} {_holder(h)}" for h in holders)
        if owner is not None and layout.is_named(owner.cluster, plan.cluster):
            fix = "this cluster's own Ray holds it: provisioner down -i INVENTORY stops it"
        elif owner is not None or any(_is_ray(h) for h in holders):
            fix = (
                f"a Ray that no cluster of provisioner owns holds it on {node.name}: stop it "
                "where it was started (`ray stop` would stop every Ray there, other clusters' "
                f"too), or {block_fix(plan)}"
            )
        else:
            one = (
                "or turn the head's store off: storage: {kind: none}"
                if name.startswith("storage.")
                else f"or move this one port: ray.ports.{name}"
            )
            fix = f"stop what holds port {port} on {node.name}, or {block_fix(plan)} ({one})"
        findings.append(
            error(
                "ports.free",
                node.name,
                f"port {port} ({name}) is in use by {_holder(holders[0])}",
                evidence,
                fix,
            )
        )
    if not findings and not others:
        findings.append(ok("ports.free", node.name, f"{len(wanted)} Ray ports free"))
    busy_range = sorted(
        p
        for p in by_port
        if plan.ports.min_worker <= p <= plan.ports.max_worker
        and not _another_cluster(port_owner(f, p), plan)
    )
    if busy_range:
        shown = ", ".join(f"{p} {_holder(by_port[p][0])}" for p in busy_range[:5])
        findings.append(
            warning(
                "ports.worker_range",
                node.name,
                f"{len(busy_range)} port(s) of Ray's worker range "
                f"{plan.ports.min_worker}-{plan.ports.max_worker} in use",
                shown + (" ..." if len(busy_range) > 5 else ""),
                f"stop those services, or {block_fix(plan)}",
            )
        )
    return findings


def check_stale_ray(
    node: Node, f: NodeFacts, cluster: str = "", shared: bool = False
) -> list[Finding]:
    """A Ray running on the node that is neither another cluster's (`check_neighbours`) nor,
    as far as the facts tell, this `cluster`'s (the own-Ray waiver judges that). On shared
    nodes (`shared`: a SLURM allocation, whose neighbours are other jobs' Rays in their own
    temp dirs and port blocks) it is a warning."""
    others = {
        pid for ray in rays_on_node(f) if ray.cluster and ray.cluster != cluster for pid in ray.pids
    }
    processes = [
        line
        for line in f.ray_processes
        if not (line.split() and line.split()[0].isdigit() and int(line.split()[0]) in others)
    ]
    evidence = []
    if processes:
        evidence.append("processes: " + "; ".join(line.strip() for line in processes[:5]))
    ray_containers = [
        c
        for c in f.runtime.containers
        if c.state == "running"
        and (c.cluster_label or c.name.startswith("ray"))
        and (not c.cluster_label or c.cluster_label == cluster or not cluster)
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
    if ray_containers and f.runtime.remove:
        fix += f" (or {f.runtime.remove} {names} on {node.name})"
    if processes:
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
