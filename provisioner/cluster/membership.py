"""Membership follows the inventory: the nodes a cluster ran on last, and those that left.

`up` records the nodes it brought up in the cluster's local state
(`<state>/clusters/CLUSTER/nodes.json`: each node with how to reach it), so that a later
`up` or `down` knows the nodes that have left the inventory since, and can still reach
them to remove this cluster's Ray (and its token) there. A node the GCS lists alive that
neither the inventory nor the record knows is reached with the head's SSH settings.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.cluster.headprobe import GcsNode
from provisioner.console import Reporter
from provisioner.inventory import Hop, Inventory, Node, Role, SSHSettings
from provisioner.node import layout
from provisioner.remote import Pool, fan_out
from provisioner.runtime.protocol import Runtime

RECORD = "nodes.json"


def record_path(inventory: Inventory) -> Path:
    return inventory.state_dir / RECORD


def _path(value: Path | None) -> str | None:
    return str(value) if value is not None else None


def node_to_json(node: Node) -> dict[str, Any]:
    """Pure: a node and how to reach it, as JSON."""
    s = node.ssh
    return {
        "name": node.name,
        "address": node.address,
        **({"ray_address": node.data_address} if node.data_address else {}),
        "role": node.role,
        "ssh": {
            "user": s.user,
            "port": s.port,
            "key": _path(s.key),
            "known_hosts": [str(p) for p in s.known_hosts],
            "host_key_policy": s.host_key_policy,
            "jump": s.jump,
            "connect_timeout": s.connect_timeout,
            "hops": [
                {
                    "name": h.name,
                    "address": h.address,
                    "user": h.user,
                    "port": h.port,
                    "key": _path(h.key),
                }
                for h in s.hops
            ],
            "proxy_command": s.proxy_command,
        },
    }


def node_from_json(data: dict[str, Any]) -> Node:
    """Pure: the inverse of `node_to_json`."""
    s = data["ssh"]
    ssh = SSHSettings(
        user=str(s["user"]),
        port=int(s["port"]),
        key=Path(s["key"]) if s.get("key") else None,
        known_hosts=tuple(Path(p) for p in s.get("known_hosts") or ()),
        host_key_policy="accept-new" if s.get("host_key_policy") == "accept-new" else "strict",
        jump=s.get("jump"),
        connect_timeout=float(s.get("connect_timeout", 10.0)),
        hops=tuple(
            Hop(
                str(h["name"]),
                str(h["address"]),
                str(h["user"]),
                int(h["port"]),
                Path(h["key"]) if h.get("key") else None,
            )
            for h in s.get("hops") or ()
        ),
        proxy_command=s.get("proxy_command"),
    )
    role: Role = "head" if data.get("role") == "head" else "worker"
    data_address = str(data["ray_address"]) if data.get("ray_address") else None
    return Node(str(data["name"]), str(data["address"]), role, ssh, data_address=data_address)


def record_nodes(
    inventory: Inventory,
    also: Iterable[Node] = (),
    *,
    token: str | None = None,
    held: Mapping[str, str] | None = None,
) -> None:
    """Remember the inventory's nodes as the ones this cluster runs on (mode 0600), and
    `also` (nodes that left but still hold this cluster's Ray: the next run retries).

    `token`: the fingerprint of the token the inventory's nodes hold now; `held`: address
    -> the fingerprint of the token each of `also` holds (token.fingerprint)."""
    path = record_path(inventory)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    held = held or {}
    entries = [{**node_to_json(n), "token": token} for n in inventory.nodes]
    entries += [{**node_to_json(n), "token": held.get(n.address)} for n in also]
    text = json.dumps({"nodes": entries}, indent=1)
    tmp = path.with_name(f".{RECORD}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text + "\n")
    tmp.replace(path)


def _record(inventory: Inventory) -> list[dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        nodes = json.loads(record_path(inventory).read_text())["nodes"]
        if isinstance(nodes, list):
            return nodes
    return []


def recorded_nodes(inventory: Inventory) -> list[Node]:
    """The nodes of the last `up` ([] when none is recorded or the record is unreadable)."""
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return [node_from_json(n) for n in _record(inventory)]
    return []


def recorded_tokens(inventory: Inventory) -> dict[str, str]:
    """Address -> the fingerprint of the token that node held when last recorded (a node
    recorded without one is left out: it may hold the current token)."""
    return {
        str(n["address"]): str(n["token"])
        for n in _record(inventory)
        if isinstance(n, dict) and n.get("token") and n.get("address")
    }


def departed(inventory: Inventory, recorded: Iterable[Node], gcs: Iterable[GcsNode]) -> list[Node]:
    """Pure: the nodes this cluster ran on that the inventory no longer lists: recorded
    ones, and addresses the GCS lists alive (reached with the head's SSH settings)."""
    if inventory.slurm is not None:
        return []  # the allocation is the membership: its nodes change with every job
    listed = {a for n in inventory.nodes for a in (n.name, *n.addresses)}
    gone: dict[str, Node] = {}
    for node in recorded:
        if node.address not in listed and node.name not in listed:
            gone.setdefault(node.address, node)
    for g in gcs:
        if g.alive and g.ip not in listed and g.ip not in gone:
            gone[g.ip] = Node(g.ip, g.ip, "worker", inventory.head.ssh)
    return list(gone.values())


def outside_inventory(inventory: Inventory, gcs: Iterable[GcsNode]) -> list[GcsNode]:
    """Pure: the nodes the GCS lists alive at an address the inventory does not name."""
    listed = {n.ray_address for n in inventory.nodes}
    return [g for g in gcs if g.alive and g.ip not in listed]


def forget_command(cluster: str) -> str:
    """Remove the cluster's token and TLS certificates from a node: a container restarted
    there later (Docker's restart policy) then finds neither and cannot join."""
    return f"rm -rf {layout.node_token_path(cluster)} {layout.node_tls_dir(cluster)}"


@dataclass
class Removal:
    """This cluster's Ray removed from nodes that left the inventory."""

    nodes: list[Node] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Node]:
        return [n for n in self.nodes if n.name in self.errors]

    def to_json(self) -> dict[str, Any]:
        return {
            "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
            "removed": self.removed,
            "errors": self.errors,
        }


def remove_departed(
    nodes: list[Node], pool: Pool, runtime: Runtime, report: Reporter, *, deadline: float = 90
) -> Removal:
    """Stop this cluster's Ray on nodes that left the inventory and take its token away."""
    cluster = runtime.inventory.cluster

    def one(node: Node) -> None:
        report(f"{node.name} ({node.address}): left the inventory; removing this cluster's Ray")
        session = pool.session(node)
        # the token first: should the stop fail, a restart there cannot join any more
        session.run(forget_command(cluster), timeout=20).check()
        session.run(runtime.stop_command(node), timeout=60).check()
        report(f"{node.name} ({node.address}): this cluster's Ray removed (it left the inventory)")

    group = fan_out(nodes, one, deadline=deadline)
    return Removal(
        nodes=list(nodes),
        removed=[n.name for n in nodes if n.name in group.results],
        errors=group.reasons(),
    )
