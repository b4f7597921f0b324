"""Whose Ray runs on a node: this cluster's, another cluster's, or a stale one (pure).

facts.sh tells, for every Ray process and every listening process, its parent, the
container it runs in (its cgroup: Docker's or Podman's; the runtime's section lists the
containers, `RuntimeFacts.containers`) and the cluster whose temp dir its command line names
(host mode: /tmp/prov-CLUSTER, or `~/.provisioner/clusters/CLUSTER/ray` before); for
raylet and gcs_server, the ports on their command line. A process belongs to the cluster
of its container's `provisioner.cluster` label, else to the cluster its command line
names, else to its parent's; a Ray process that belongs to no cluster is stale. Ray's
workers (`ray::...`) are children of their raylet, so they count with it; a
`ray::JobSupervisor` means a job runs there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.checks.facts import Container, NodeFacts, RayProcess
from provisioner.inventory import PORT_BLOCK, RayPorts

# the head's store (node.storage.binary_path: weed-SHA256): its command line names the
# cluster's node folder, as a host-mode Ray's does, but it is no Ray
STORE_PROCESS = "weed-"

# The --flags of raylet and gcs_server that name a port this node listens on, by the name
# RayPorts gives it (the worker range apart).
_FLAG_PORTS = {
    "gcs_server_port": "gcs",
    "node_manager_port": "node_manager",
    "object_manager_port": "object_manager",
    "metrics_agent_port": "dashboard_agent_grpc",
    "listen_port": "dashboard_agent_http",
    "metrics_export_port": "metrics_export",
    "runtime_env_agent_port": "runtime_env_agent",
}
JOB_TITLE = "ray::JobSupervisor"
# Where `port_base` suggestions start: clear of Ray's usual ports (workers 10002-19999)
# and below Linux's outgoing ports (32768 and up) first, then above those.
SUGGESTED_BASES: tuple[int, ...] = (
    *range(20000, 32000, PORT_BLOCK),
    *range(40000, 64000, PORT_BLOCK),
)


@dataclass
class RayOnNode:
    """One Ray on a node: its cluster ('' when none owns it) and what it holds."""

    cluster: str
    via: str  # how it was recognised: "container ray-x", "processes in the temp dir of ..."
    pids: list[int] = field(default_factory=list)
    ports: set[int] = field(default_factory=set)  # from its command lines and its listeners
    job: bool = False  # a job's supervisor runs there

    def describe(self) -> str:
        what = f"cluster {self.cluster}'s Ray" if self.cluster else "a Ray of no cluster"
        return f"{what} ({self.via}{', a job is running' if self.job else ''})"


def _container_of(process: RayProcess, containers: tuple[Container, ...]) -> Container | None:
    if not process.container:
        return None
    for c in containers:
        if c.id and (process.container.startswith(c.id) or c.id.startswith(process.container)):
            return c
    return None


def _owner(
    process: RayProcess,
    by_pid: dict[int, RayProcess],
    containers: tuple[Container, ...],
) -> tuple[str, str] | None:
    """(cluster, via) of a process, following its parents among the known processes."""
    seen: set[int] = set()
    current: RayProcess | None = process
    while current is not None and current.pid not in seen:
        seen.add(current.pid)
        container = _container_of(current, containers)
        if container is not None:
            return container.cluster_label, f"container {container.name}"
        # a container the node's runtime does not list is the node's own (the machine is
        # itself a container): the process counts as the node's
        if current.cluster:
            return current.cluster, f"processes in the temp dir of cluster {current.cluster}"
        current = by_pid.get(current.ppid)
    return None


def _flag_ports(process: RayProcess) -> set[int]:
    flags = dict(process.flags)
    ports = {int(v) for k, v in flags.items() if k in _FLAG_PORTS and v.isdigit()}
    low, high = flags.get("min_worker_port", ""), flags.get("max_worker_port", "")
    if low.isdigit() and high.isdigit() and int(low) <= int(high):
        ports |= set(range(int(low), int(high) + 1))
    return ports


def rays_on_node(facts: NodeFacts) -> list[RayOnNode]:
    """Every Ray on the node, one per owner (stale processes together), in a stable order."""
    by_pid = {p.pid: p for p in facts.ray_owners}
    rays: dict[tuple[str, str], RayOnNode] = {}
    listeners_of: dict[int, set[int]] = {}
    for listener in facts.listening:
        if listener.pid is not None:
            listeners_of.setdefault(listener.pid, set()).add(listener.port)
    for process in facts.ray_owners:
        if process.title.startswith(STORE_PROCESS):
            continue  # the store every node shares: ports.free knows its ports
        is_ray = process.title in ("raylet", "gcs_server") or process.title.startswith("ray::")
        owner = _owner(process, by_pid, facts.runtime.containers)
        if not is_ray and (owner is None or not owner[0]):
            continue  # a listener of no cluster and no Ray: ports.free names it
        if owner is None:
            owner = ("", "processes")
        ray = rays.setdefault(owner, RayOnNode(cluster=owner[0], via=owner[1]))
        ray.pids.append(process.pid)
        ray.ports |= _flag_ports(process) | listeners_of.get(process.pid, set())
        ray.job = ray.job or process.title == JOB_TITLE
    # A running provisioner container whose processes were not seen (restarting) still counts.
    for c in facts.runtime.containers:
        if c.cluster_label and c.state in ("running", "restarting"):
            rays.setdefault(
                (c.cluster_label, f"container {c.name}"),
                RayOnNode(cluster=c.cluster_label, via=f"container {c.name} ({c.state})"),
            )
    return sorted(rays.values(), key=lambda r: (r.cluster == "", r.cluster, r.via))


def port_owner(facts: NodeFacts, port: int) -> RayOnNode | None:
    """The Ray that listens on `port` on the node, if a Ray does."""
    holders = {listener.pid for listener in facts.listening if listener.port == port}
    for ray in rays_on_node(facts):
        if holders & set(ray.pids):
            return ray
    return None


def free_base(facts: list[NodeFacts], current: RayPorts) -> int | None:
    """Pure: the first suggested `port_base` whose whole block is free on every node (no
    listener, no other Ray's ports) and not `current`'s."""
    taken: set[int] = set()
    for f in facts:
        taken |= {listener.port for listener in f.listening}
        for ray in rays_on_node(f):
            taken |= ray.ports
    for base in SUGGESTED_BASES:
        block = set(range(base, base + PORT_BLOCK))
        if not block & taken and base != current.gcs:
            return base
    return None
