"""A SLURM allocation as the inventory sees it: which job holds the nodes, which nodes,
and what each job's Ray gets of its own (a block of ports; the sbatch script's Ray also a
private temp dir per job and node, made by `mktemp`; `up`'s Ray has its cluster's short
temp dir like any host-mode cluster, `layout.node_short_ray_dir`).

The login node is not trusted with the control machine: the node names and addresses it
answers are checked here (`AllocatedNode`), when they are parsed and when the record is
read back, since a name becomes a folder here (the node's logs) and an address an SSH
target. A name is a host name (letters, digits, '_', '.', '-', not starting with '.' or
'-'), never a path.

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
import re
from dataclasses import dataclass, replace
from typing import Any

from provisioner.errors import InputError
from provisioner.inventory.address import address_problem as checked_problem
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


# A node name as SLURM may give it (a host name, one folder name here), checked whole
# (fullmatch: no trailing newline either); its address is checked as every address is
# (address.py: an IP address, its IPv6 scope id an interface's name, or a DNS name).
_NODE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")
NAME_FIX = (
    "nothing was recorded; a SLURM node name is a host name (letters, digits, '.', '_', '-'): "
    "find out why the login node answers this (a misconfigured or compromised login node, "
    "or a wrapper of `scontrol` on its PATH) before using it"
)


def node_name_problem(name: str) -> str | None:
    """Why `name` is not a node name SLURM may give (None: it is one)."""
    if not _NODE_NAME.fullmatch(name):
        return f"node name {name!r} is not a host name"
    return None


def address_problem(address: str) -> str | None:
    """Why `address` is not an IP address or a DNS name (None: it is one): the one
    address check (address.py), as a node's address."""
    why = checked_problem(address)
    return f"node {why}" if why else None


@dataclass(frozen=True)
class AllocatedNode:
    """A node of the allocation, as the login node named it: checked when made, so no
    unchecked name or address from the scheduler exists past the parser (InputError)."""

    name: str  # SLURM's node name
    address: str  # the address SLURM reaches it by (NodeAddr, resolved to an IP)

    def __post_init__(self) -> None:
        why = node_name_problem(self.name) or address_problem(self.address)
        if why:
            raise InputError(f"refused a node of the SLURM allocation: {why}", NAME_FIX)


@dataclass(frozen=True)
class Allocation:
    """The job that holds the nodes, and the nodes once it runs (first: the head)."""

    job_id: int
    nodes: tuple[AllocatedNode, ...] = ()
    # The job's comment (`sbatch --comment`) is `provisioner-TAG`, TAG random per job: with
    # the job's name and user it tells this cluster's job from any other job that has (or
    # gets) the same id. "" in a record of an older provisioner: name and user only.
    tag: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "tag": self.tag,
            "nodes": [{"name": n.name, "address": n.address} for n in self.nodes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Allocation:
        nodes = tuple(AllocatedNode(str(n["name"]), str(n["address"])) for n in data["nodes"])
        tag = str(data.get("tag", ""))
        if not re.fullmatch(r"[0-9a-f]{0,64}", tag):
            raise ValueError(f"tag {tag!r}")
        return cls(int(data["job_id"]), nodes, tag)


def read_allocation(inventory: Inventory) -> Allocation | None:
    """The allocation `up` recorded for this cluster (None: none, or unreadable). A record
    whose node names or addresses are not host names is refused (InputError, exit 2): they
    are checked again here, where they are read back, not only where they were parsed."""
    path = inventory.state_dir / RECORD
    try:
        data = json.loads(path.read_text())
        return Allocation.from_json(data)
    except InputError as exc:
        raise InputError(
            f"the recorded SLURM allocation holds a node that is refused: {exc.message}",
            f"remove {path} (and cancel the job on the login node with `scancel "
            f"{data.get('job_id', 'JOBID')}`), then run `provisioner up` again",
            where=str(path),
        ) from None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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
    hop = Hop(login.name, login.address, ssh.user, ssh.port, ssh.key, ssh.identity_files)
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
