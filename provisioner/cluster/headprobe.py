"""Ask the head's container about the cluster: the GCS's node list, the placement probe."""

from __future__ import annotations

import json
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
    session: Session, inventory: Inventory, *, timeout: float = 60
) -> list[dict[str, Any]]:
    """One task pinned to each alive node: [{"ip", "ok", "ran_on"|"error"}]."""
    address = commands.head_address(inventory)
    args = ["place", address, str(timeout)]
    found: list[dict[str, Any]] = _run(session, inventory, args, timeout + 30)["placement"]
    return found


def alive_addresses(nodes: list[dict[str, Any]]) -> set[str]:
    """Addresses of the nodes the GCS lists as alive."""
    return {n["ip"] for n in nodes if n.get("alive")}
