"""A SLURM allocation as the inventory sees it: which job holds the nodes, which nodes,
and what each job's Ray gets of its own (a block of ports; the sbatch script's Ray also a
short temp dir per job, `/tmp/rayjob-JOBID`; `up`'s Ray has its cluster's short temp dir
like any host-mode cluster, `layout.node_short_ray_dir`).

`up` records the allocation in the cluster's local state (`slurm.json`), so that every
later command (`status`, `submit`, `jobs`, `logs`, `down`) loads an inventory whose head
and workers are the allocated nodes, reached through the login node.

The port block is a function of the job id alone: two jobs sharing a node (OverSubscribe,
or one user's two allocations) never meet on a port, and every node of one job agrees on
the ports without talking. The rendered sbatch script does the same arithmetic in bash
(`bash_port_base`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any

from provisioner.inventory.models import Hop, Inventory, Node, RayPorts, Role

BLOCKS_START = 20000  # below Linux's ephemeral range (32768-60999)
BLOCK_SIZE = 100
BLOCKS = 120  # 20000-31999
# Each port's offset in a block: the inventory's own block layout (`RayPorts.from_base`).
_LAYOUT = RayPorts.from_base(BLOCKS_START, BLOCK_SIZE)
OFFSETS = {name: port - BLOCKS_START for name, port in vars(_LAYOUT).items()}
RECORD = "slurm.json"


def port_base(job_id: int) -> int:
    """The first port of the job's block."""
    return BLOCKS_START + (job_id % BLOCKS) * BLOCK_SIZE


def bash_port_base(job_id_var: str = "SLURM_JOB_ID") -> str:
    """The same as `port_base`, as a bash arithmetic expression."""
    return f"$(( {BLOCKS_START} + (${job_id_var} % {BLOCKS}) * {BLOCK_SIZE} ))"


def job_ports(job_id: int) -> RayPorts:
    """Every Ray port of the job: its block."""
    return RayPorts.from_base(port_base(job_id), BLOCK_SIZE)


def temp_dir(job_id: int) -> str:
    """The sbatch script's short Ray temp dir on every node: Ray's socket paths under it
    stay far below the 107-byte limit of a Unix socket path (a long $HOME would not)."""
    return f"/tmp/rayjob-{job_id}"


@dataclass(frozen=True)
class AllocatedNode:
    name: str  # SLURM's node name
    address: str  # the address SLURM reaches it by (NodeAddr, resolved to an IP)


@dataclass(frozen=True)
class Allocation:
    """The job that holds the nodes, and the nodes once it runs (first: the head)."""

    job_id: int
    nodes: tuple[AllocatedNode, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Allocation:
        nodes = tuple(AllocatedNode(str(n["name"]), str(n["address"])) for n in data["nodes"])
        return cls(int(data["job_id"]), nodes)


def read_allocation(inventory: Inventory) -> Allocation | None:
    """The allocation `up` recorded for this cluster (None: none, or unreadable)."""
    try:
        data = json.loads((inventory.state_dir / RECORD).read_text())
        return Allocation.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_allocation(inventory: Inventory, allocation: Allocation) -> None:
    """Record it (0600, written whole then renamed)."""
    from provisioner.local import private_dir

    folder = inventory.state_dir
    private_dir(folder)
    tmp = folder / f".{RECORD}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(allocation.to_json(), f)
    os.replace(tmp, folder / RECORD)


def forget_allocation(inventory: Inventory) -> None:
    (inventory.state_dir / RECORD).unlink(missing_ok=True)


def behind_login(login: Node, name: str, address: str, role: Role) -> Node:
    """An allocated node, reached through the login node (one more ProxyJump hop)."""
    ssh = login.ssh
    hop = Hop(login.name, login.address, ssh.user, ssh.port, ssh.key)
    jump = f"{ssh.user}@{login.address}:{ssh.port}"
    return Node(
        name,
        address,
        role,
        replace(ssh, hops=(*ssh.hops, hop), jump=f"{ssh.jump},{jump}" if ssh.jump else jump),
    )


def with_allocation(inventory: Inventory, allocation: Allocation | None) -> Inventory:
    """The inventory whose head and workers are the allocation's running nodes, with the
    job's port block and temp dir; unchanged when there are none yet."""
    if inventory.slurm is None or inventory.login is None or allocation is None:
        return inventory
    if not allocation.nodes:
        return inventory
    login = inventory.login
    nodes = [
        behind_login(login, n.name, n.address, "head" if i == 0 else "worker")
        for i, n in enumerate(allocation.nodes)
    ]
    return replace(
        inventory,
        head=nodes[0],
        workers=tuple(nodes[1:]),
        ports=job_ports(allocation.job_id),
        allocated=True,
    )
