"""Ask Ray on the head about the cluster: the GCS's node list, the placement probe.

probe.py runs where Ray runs on the head (the runtime's `python_command`: inside the
container, or with the node's own interpreter) and prints one marked JSON line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from provisioner.cluster.probe import MARK
from provisioner.errors import OperationError
from provisioner.node import commands
from provisioner.remote import Session
from provisioner.runtime.protocol import Runtime


@dataclass(frozen=True)
class GcsNode:
    """One node as the GCS lists it."""

    node_id: str
    ip: str
    alive: bool
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GcsNode:
        return cls(
            node_id=str(data["node_id"]),
            ip=str(data["ip"]),
            alive=bool(data.get("alive")),
            resources={str(k): float(v) for k, v in (data.get("resources") or {}).items()},
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
        )


def _script() -> bytes:
    return resources.files("provisioner.cluster").joinpath("probe.py").read_bytes()


def _run(session: Session, runtime: Runtime, args: list[str], timeout: float) -> Any:
    command = runtime.python_command(*args)
    result = session.run(command, timeout=timeout, stdin=_script())
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise OperationError(
        f"the probe on the head ({runtime.name} runtime) failed: {result.tail(8) or 'no output'}",
        "see `provisioner logs` for the head's Ray logs",
        where=runtime.inventory.head.name,
    )


def gcs_nodes(session: Session, runtime: Runtime, *, timeout: float = 30) -> list[GcsNode]:
    """Every node the GCS knows."""
    address = commands.head_address(runtime.inventory)
    found = _run(session, runtime, ["nodes", address], timeout)["nodes"]
    return [GcsNode.from_json(n) for n in found]


def placement(
    session: Session,
    runtime: Runtime,
    node_ids: list[str],
    *,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """One task pinned to each of `node_ids`: [{"ip", "ok", "ran_on"|"error"}]."""
    address = commands.head_address(runtime.inventory)
    args = ["place", address, str(timeout), ",".join(node_ids)]
    found: list[dict[str, Any]] = _run(session, runtime, args, timeout + 30)["placement"]
    return found


@dataclass(frozen=True)
class Joined:
    """What `join` saw: the GCS's nodes, the placement results, and when each step ended
    (seconds since the probe started on the head: import, init, joined, placed)."""

    nodes: list[GcsNode]
    placement: list[dict[str, Any]]
    timings: dict[str, float]


def join(
    session: Session,
    runtime: Runtime,
    *,
    timeout: float,
    stale: frozenset[str] = frozenset(),
    place: bool = True,
) -> Joined:
    """Wait on the head until every inventory address has a fresh alive node, then (if
    `place`) run the placement probe there.

    One `ray.init` for both: on a busy head each connection costs seconds.
    """
    inventory = runtime.inventory
    address = commands.head_address(inventory)
    ips = ",".join(n.ray_address for n in inventory.nodes)
    args = ["join", address, str(timeout), ips, ",".join(sorted(stale)), "1" if place else "0"]
    found = _run(session, runtime, args, timeout + 90)
    return Joined(
        [GcsNode.from_json(n) for n in found["nodes"]],
        list(found.get("placement", [])),
        dict(found.get("timings", {})),
    )


def fresh_nodes(nodes: list[GcsNode], stale: frozenset[str] = frozenset()) -> dict[str, GcsNode]:
    """Pure: address -> the alive node there, leaving out node IDs in `stale`.

    A raylet killed with its container stays "alive" in the GCS until its health checks
    fail (tens of seconds); its replacement registers under a new node ID meanwhile.
    """
    return {n.ip: n for n in nodes if n.alive and n.node_id not in stale}
