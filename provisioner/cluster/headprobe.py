"""Ask the head's container about the cluster: the GCS's node list, the placement probe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from provisioner.cluster import commands
from provisioner.cluster.probe import MARK
from provisioner.errors import OperationError
from provisioner.inventory import Inventory
from provisioner.remote import Session


def _script() -> bytes:
    return resources.files("provisioner.cluster").joinpath("probe.py").read_bytes()


def _run(session: Session, inventory: Inventory, args: list[str], timeout: float) -> Any:
    command = commands.exec_python_command(inventory.cluster, *args)
    result = session.run(command, timeout=timeout, stdin=_script())
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    raise OperationError(
        f"the probe in the head container failed: {result.tail(8) or 'no output'}",
        "see `provisioner logs` for the head's Ray logs",
        where=inventory.head.name,
    )


def gcs_nodes(
    session: Session, inventory: Inventory, *, timeout: float = 30
) -> list[dict[str, Any]]:
    """Every node the GCS knows: [{"node_id", "ip", "alive", "resources", "labels"}]."""
    address = commands.head_address(inventory)
    nodes: list[dict[str, Any]] = _run(session, inventory, ["nodes", address], timeout)["nodes"]
    return nodes


def placement(
    session: Session,
    inventory: Inventory,
    node_ids: list[str],
    *,
    timeout: float = 60,
) -> list[dict[str, Any]]:
    """One task pinned to each of `node_ids`: [{"ip", "ok", "ran_on"|"error"}]."""
    address = commands.head_address(inventory)
    args = ["place", address, str(timeout), ",".join(node_ids)]
    found: list[dict[str, Any]] = _run(session, inventory, args, timeout + 30)["placement"]
    return found


@dataclass(frozen=True)
class Joined:
    """What `join` saw: the GCS's nodes, the placement results, and when each step ended
    (seconds since the probe started in the head container: import, init, joined, placed)."""

    nodes: list[dict[str, Any]]
    placement: list[dict[str, Any]]
    timings: dict[str, float]


def join(
    session: Session,
    inventory: Inventory,
    *,
    timeout: float,
    stale: frozenset[str] = frozenset(),
    place: bool = True,
) -> Joined:
    """Wait in the head container until every inventory address has a fresh alive node,
    then (if `place`) run the placement probe there.

    One `ray.init` for both: on a busy head each connection costs seconds.
    """
    address = commands.head_address(inventory)
    ips = ",".join(n.address for n in inventory.nodes)
    args = ["join", address, str(timeout), ips, ",".join(sorted(stale)), "1" if place else "0"]
    found = _run(session, inventory, args, timeout + 90)
    return Joined(
        list(found["nodes"]), list(found.get("placement", [])), dict(found.get("timings", {}))
    )


def alive_addresses(nodes: list[dict[str, Any]], stale: frozenset[str] = frozenset()) -> set[str]:
    """Addresses of the nodes the GCS lists as alive (leaving out the node IDs in `stale`)."""
    return set(fresh_nodes(nodes, stale))


def fresh_nodes(
    nodes: list[dict[str, Any]], stale: frozenset[str] = frozenset()
) -> dict[str, dict[str, Any]]:
    """Pure: address -> the alive node there, leaving out node IDs in `stale`.

    A raylet killed with its container stays "alive" in the GCS until its health checks
    fail (tens of seconds); its replacement registers under a new node ID meanwhile.
    """
    return {n["ip"]: n for n in nodes if n.get("alive") and n.get("node_id") not in stale}
