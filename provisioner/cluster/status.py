"""What is running: per node SSH, this cluster's Ray (container or processes), what it
runs, Ray liveness; the cluster's counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.cluster import allocation, headprobe, subnet
from provisioner.cluster.headprobe import GcsNode
from provisioner.console import Reporter, quiet
from provisioner.errors import ProvisionerError
from provisioner.inventory import Inventory, Node
from provisioner.inventory.loader import require_nodes
from provisioner.node import commands
from provisioner.remote import Pool, fan_out
from provisioner.runtime.context import ClusterContext
from provisioner.runtime.protocol import Capabilities, RayState, Runtime


@dataclass
class NodeStatus:
    host: str
    name: str
    role: str
    ssh_ok: bool
    container: str | None  # this cluster's Ray on the node: running, exited, absent; None: no SSH
    image_ok: bool | None  # runs what the cluster pins; None when unknown (no pin, no Ray)
    ray_alive: bool
    resources: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    oom_killed: bool = False
    error: str | None = None
    reason: str | None = None  # why the node is not healthy, in words (None: healthy)
    ray_host: str = ""  # the address Ray uses there, when not `host` (`ray: {address}`)

    @property
    def healthy(self) -> bool:
        return (
            self.ssh_ok
            and self.container == "running"
            and self.ray_alive
            and (self.image_ok is not False)
        )


@dataclass
class ClusterStatus:
    cluster: str
    nodes: list[NodeStatus]
    expected_nodes: int
    alive_nodes: int
    address: str
    runtime: str  # the runtime's name
    caps: Capabilities  # what it does (the table's columns, the reasons' words)
    gcs_error: str | None = None
    states: dict[str, RayState] = field(default_factory=dict, repr=False)
    gcs: list[GcsNode] = field(default_factory=list, repr=False)  # the GCS's node list

    @property
    def outside(self) -> list[GcsNode]:
        """Nodes the GCS lists alive at an address the inventory does not name."""
        listed = {n.ray_host or n.host for n in self.nodes}
        return [g for g in self.gcs if g.alive and g.ip not in listed]

    @property
    def healthy(self) -> bool:
        return (
            self.alive_nodes == self.expected_nodes
            and all(n.healthy for n in self.nodes)
            and not self.outside
        )

    def node(self, name: str) -> NodeStatus:
        return next(n for n in self.nodes if name in (n.name, n.host))

    def to_json(self) -> dict[str, Any]:
        listed = {n.ray_host or n.host for n in self.nodes}
        return {
            "cluster": self.cluster,
            "runtime": self.runtime,
            "nodes": [asdict(n) for n in self.nodes],
            "alive_nodes": self.alive_nodes,
            "expected_nodes": self.expected_nodes,
            "healthy": self.healthy,
            "address": self.address,
            "gcs_error": self.gcs_error,
            "gcs_nodes": [
                {"node_id": g.node_id, "ip": g.ip, "alive": g.alive, "in_inventory": g.ip in listed}
                for g in self.gcs
            ],
            "outside_inventory": [g.ip for g in self.outside],
        }


def ray_states(
    inventory: Inventory, pool: Pool, runtime: Runtime, *, deadline: float = 30
) -> tuple[dict[str, RayState], dict[str, ProvisionerError]]:
    """This cluster's Ray on every node, by node name (one round trip each); errors by name."""
    command = runtime.state_command()

    def one(node: Node) -> RayState:
        result = pool.session(node).run(command, timeout=deadline)
        result.check()
        return runtime.parse_state(result.stdout)

    group = fan_out(inventory.nodes, one, deadline=deadline)
    return dict(group.results), dict(group.errors)


def gather(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    runtime: Runtime,
    states: dict[str, RayState] | None = None,
) -> ClusterStatus:
    """Look at every node (one SSH round trip each, none when `states` are given) and ask
    the head's GCS who is alive."""
    errors: dict[str, ProvisionerError] = {}
    if states is None:
        states, errors = ray_states(inventory, pool, runtime)
    gcs: list[GcsNode] = []
    gcs_error: str | None = None
    head_state = states.get(inventory.head.name)
    if head_state is not None and head_state.running:
        report(f"{inventory.head.name}: asking the GCS for its nodes")
        try:
            gcs = headprobe.gcs_nodes(pool.session(inventory.head), runtime)
        except ProvisionerError as exc:
            gcs_error = str(exc)
    elif inventory.head.name in errors:
        gcs_error = f"the head is unreachable: {errors[inventory.head.name]}"
    else:
        gcs_error = "this cluster's Ray is not running on the head"
    return assemble(inventory, runtime, states, errors, gcs, gcs_error=gcs_error)


def status_cluster(
    cluster: ClusterContext, report: Reporter = quiet
) -> tuple[ClusterStatus, allocation.Job | None]:
    """`status`: the scheduler's job that holds the nodes first, as the queue shows it
    (None: no scheduler, or none recorded; one gone from the queue is an OperationError),
    then every node. Healthy when every node is and the job, if any, runs. `cluster`: the
    command's context (its runtime is built for the nodes, the pin as it read it)."""
    inventory = cluster.inventory
    job = allocation.job_status(inventory, report)
    inventory = require_nodes(inventory)
    with Pool(inventory) as pool:
        inventory = subnet.resolve_ray_subnet(inventory, pool, report)
        found = gather(inventory, pool, report, runtime=cluster.on(inventory).runtime)
    return found, job


def assemble(
    inventory: Inventory,
    runtime: Runtime,
    states: dict[str, RayState],
    errors: dict[str, ProvisionerError],
    gcs: list[GcsNode],
    *,
    gcs_error: str | None = None,
) -> ClusterStatus:
    """Pure: join per-node states and the GCS's node list into a ClusterStatus."""
    alive = {n.ip: n for n in gcs if n.alive}
    nodes: list[NodeStatus] = []
    for node in inventory.nodes:
        f = states.get(node.name)
        err = errors.get(node.name)
        ray = alive.get(node.ray_address)
        nodes.append(
            NodeStatus(
                host=node.address,
                ray_host=node.data_address or "",
                name=node.name,
                role=node.role,
                ssh_ok=err is None,
                container=f.status if f else None,
                image_ok=runtime.is_current(f) if f else None,
                ray_alive=ray is not None and bool(f and f.running),
                resources=dict(ray.resources) if ray else {},
                restarts=f.restarts if f else 0,
                oom_killed=f.oom_killed if f else False,
                error=str(err) if err else None,
                reason=reason(
                    runtime,
                    f,
                    err,
                    alive=ray is not None,
                    current=runtime.is_current(f) if f else None,
                    gcs_error=gcs_error,
                ),
            )
        )
    return ClusterStatus(
        cluster=inventory.cluster,
        nodes=nodes,
        expected_nodes=len(inventory.nodes),
        alive_nodes=sum(1 for n in nodes if n.ray_alive),
        address=commands.head_address(inventory),
        runtime=runtime.name,
        caps=runtime.caps,
        gcs_error=gcs_error,
        states=dict(states),
        gcs=list(gcs),
    )


def reason(
    runtime: Runtime,
    state: RayState | None,
    error: ProvisionerError | None,
    *,
    alive: bool,
    current: bool | None,
    gcs_error: str | None,
) -> str | None:
    """Pure: why a node is not healthy, in words for the status table (None: healthy)."""
    what = "its container" if runtime.caps.containers else "its Ray"
    if error is not None:
        return f"no SSH: {error.message}"
    if state is None:
        return "not asked"
    if state.status == "absent":
        return "this cluster's Ray is not running here: `provisioner up` starts it"
    if not state.running:
        how = f"{what} is {state.status}"
        if state.exit_code not in (None, 0):
            how += f" (exit code {state.exit_code})"
        if state.oom_killed:
            how += ", killed for lack of memory"
        if state.restarts:
            how += f", {state.restarts} restart(s)"
        return how + ": see `provisioner logs`"
    if current is False:
        return f"{what} runs something other than the pin: `provisioner up` replaces it"
    if not alive:
        if gcs_error:
            return f"not known alive: {gcs_error}"
        return "running, but the GCS does not list it alive: see `provisioner logs`"
    return None
