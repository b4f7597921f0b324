"""What is running: per node SSH, container, image, Ray liveness; the cluster's counts."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from provisioner.cluster import commands, headprobe
from provisioner.console import Reporter, quiet
from provisioner.errors import ProvisionerError
from provisioner.inventory import Inventory, Node
from provisioner.remote import Pool, fan_out


@dataclass
class ContainerFacts:
    """`docker inspect` of a node's Ray container; `None` fields when it does not exist."""

    status: str = "absent"  # absent | running | exited | restarting | created ...
    image: str | None = None
    started_at: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    oom_killed: bool = False

    @property
    def running(self) -> bool:
        return self.status == "running"


def parse_container_facts(stdout: str) -> ContainerFacts:
    """Parse the one JSON line of `commands.container_facts_command` (`null`: absent)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    data = json.loads(lines[-1]) if lines else None
    if not data:
        return ContainerFacts()
    return ContainerFacts(
        status=str(data.get("status") or "unknown"),
        image=data.get("image"),
        started_at=data.get("started_at"),
        restarts=int(data.get("restarts") or 0),
        exit_code=data.get("exit_code"),
        oom_killed=bool(data.get("oom_killed")),
    )


@dataclass
class NodeStatus:
    host: str
    name: str
    role: str
    ssh_ok: bool
    container: str | None  # None when SSH failed
    image_ok: bool | None  # None when unknown (no pin, no container)
    ray_alive: bool
    resources: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    oom_killed: bool = False
    error: str | None = None

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
    gcs_error: str | None = None
    facts: dict[str, ContainerFacts] = field(default_factory=dict, repr=False)
    gcs: list[dict[str, Any]] = field(default_factory=list, repr=False)  # the GCS's node list

    @property
    def healthy(self) -> bool:
        return self.alive_nodes == self.expected_nodes and all(n.healthy for n in self.nodes)

    def node(self, name: str) -> NodeStatus:
        return next(n for n in self.nodes if name in (n.name, n.host))

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "nodes": [asdict(n) for n in self.nodes],
            "alive_nodes": self.alive_nodes,
            "expected_nodes": self.expected_nodes,
            "healthy": self.healthy,
            "address": self.address,
            "gcs_error": self.gcs_error,
        }


def image_matches(facts: ContainerFacts, image_id: str | None) -> bool | None:
    """Whether the container runs the pinned image (by ID); None when either is unknown."""
    if image_id is None or facts.image is None:
        return None
    return facts.image == image_id


def container_facts(
    pool: Pool, inventory: Inventory, *, deadline: float = 30
) -> tuple[dict[str, ContainerFacts], dict[str, ProvisionerError]]:
    """The Ray container's facts on every node, by node name; errors by node name."""
    command = commands.container_facts_command(inventory.cluster)

    def one(node: Node) -> ContainerFacts:
        result = pool.session(node).run(command, timeout=deadline)
        result.check()
        return parse_container_facts(result.stdout)

    group = fan_out(inventory.nodes, one, deadline=deadline)
    return dict(group.results), dict(group.errors)


def gather(
    pool: Pool, inventory: Inventory, *, image_id: str | None, report: Reporter = quiet
) -> ClusterStatus:
    """Look at every node (one SSH round trip each) and ask the head's GCS who is alive."""
    facts, errors = container_facts(pool, inventory)
    gcs: list[dict[str, Any]] = []
    gcs_error: str | None = None
    head_facts = facts.get(inventory.head.name)
    if head_facts is not None and head_facts.running:
        report(f"{inventory.head.name}: asking the GCS for its nodes")
        try:
            gcs = headprobe.gcs_nodes(pool.session(inventory.head), inventory)
        except ProvisionerError as exc:
            gcs_error = str(exc)
    elif inventory.head.name in errors:
        gcs_error = f"the head is unreachable: {errors[inventory.head.name]}"
    else:
        gcs_error = "the head's Ray container is not running"
    return assemble(inventory, facts, errors, gcs, image_id=image_id, gcs_error=gcs_error)


def assemble(
    inventory: Inventory,
    facts: dict[str, ContainerFacts],
    errors: dict[str, ProvisionerError],
    gcs: list[dict[str, Any]],
    *,
    image_id: str | None,
    gcs_error: str | None = None,
) -> ClusterStatus:
    """Pure: join per-node facts and the GCS's node list into a ClusterStatus."""
    alive = {n["ip"]: n for n in gcs if n.get("alive")}
    nodes: list[NodeStatus] = []
    for node in inventory.nodes:
        f = facts.get(node.name)
        err = errors.get(node.name)
        ray = alive.get(node.address)
        nodes.append(
            NodeStatus(
                host=node.address,
                name=node.name,
                role=node.role,
                ssh_ok=err is None,
                container=f.status if f else None,
                image_ok=image_matches(f, image_id) if f else None,
                ray_alive=ray is not None and bool(f and f.running),
                resources=dict(ray.get("resources", {})) if ray else {},
                restarts=f.restarts if f else 0,
                oom_killed=f.oom_killed if f else False,
                error=str(err) if err else None,
            )
        )
    return ClusterStatus(
        cluster=inventory.cluster,
        nodes=nodes,
        expected_nodes=len(inventory.nodes),
        alive_nodes=sum(1 for n in nodes if n.ray_alive),
        address=commands.head_address(inventory),
        gcs_error=gcs_error,
        facts=dict(facts),
        gcs=list(gcs),
    )
