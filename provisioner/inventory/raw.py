"""What an inventory file says, before SSH config and defaults fill the gaps."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from provisioner.inventory.fields import Where
from provisioner.inventory.models import DEFAULT_RUNTIME, RayPorts, Slurm


@dataclass
class RawSSH:
    """SSH settings given explicitly (None: not said, so ~/.ssh/config or a default applies)."""

    user: str | None = None
    port: int | None = None
    key: Path | None = None
    key_at: Where | None = None  # where the inventory names the key (its line)
    key_field: str = ""  # and by which field, as an error names it
    jump: str | None = None  # ProxyJump: [user@]host[:port][,...]


@dataclass
class RawHost:
    name: str
    address: str
    where: Where
    ssh: RawSSH = field(default_factory=RawSSH)
    # ssh command-line options around the explicit ones, in Ansible's order: ssh_args
    # before, ssh_common_args and ssh_extra_args after (first one wins in ssh)
    args_before: tuple[str, ...] = ()
    args_after: tuple[str, ...] = ()
    args_where: Where | None = None
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    gpus: tuple[str, ...] | None = None
    data_address: str | None = None  # `ray: {address}`: Ray's address (None: SSH's)


@dataclass
class RawInventory:
    path: Path
    cluster: str
    head: RawHost
    workers: list[RawHost]
    ssh: RawSSH = field(default_factory=RawSSH)
    known_hosts: tuple[Path, ...] = ()
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    ports: RayPorts = field(default_factory=RayPorts)
    image_lock: Path | None = None
    shm_size: int | None = None
    object_store_memory: int | None = None
    runtime: str = DEFAULT_RUNTIME
    runtime_where: str = ""
    runtime_field: str = "runtime"
    ray_python: str | None = None
    tls: bool = True  # TLS on Ray's channels (node.tls)
    price_per_node_hour: float | None = None  # for a job's cost (summary.json)
    storage: str = "head"  # Tune's shared storage: "head" (the head's store), "path", "none"
    storage_path: str = ""  # with "path": the folder every node mounts
    ray_subnet: str | None = None  # `ray: {subnet}`: each node's Ray address is its own there
    ray_subnet_where: str = ""  # FILE:LINE of it
    # SLURM (`scheduler:`): the login node (also `head` until the allocation is known)
    slurm: Slurm | None = None


def relative_path(base: Path, value: str) -> Path:
    """A path from an inventory: ~ expanded, relative to the inventory's folder."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base.parent / path)
