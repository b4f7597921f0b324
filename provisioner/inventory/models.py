"""The inventory's data model: what the rest of the tool knows about the machines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from provisioner.local import state_root

Role = Literal["head", "worker", "login"]  # login: a SLURM login node, never a Ray node
HostKeyPolicy = Literal["strict", "accept-new"]
HOST_KEY_POLICIES: tuple[str, ...] = ("strict", "accept-new")

# The runtime an inventory that names none gets. The inventory knows runtime names only as
# data: which names exist, and what each does, is provisioner.runtime.registry's.
DEFAULT_RUNTIME = "docker"


@dataclass(frozen=True)
class Hop:
    """One jump host on the way to a node (ProxyJump), resolved through ssh_config."""

    name: str  # as ProxyJump names it (an alias, or user@host:port)
    address: str
    user: str
    port: int = 22
    key: Path | None = None
    identity_files: tuple[Path, ...] | None = None  # as SSHSettings.identity_files


@dataclass(frozen=True)
class SSHSettings:
    """How to reach one node over SSH."""

    user: str
    port: int = 22
    key: Path | None = None  # the key the inventory or ssh_config names (the first that exists)
    # The key files offered, in OpenSSH's order, after the agent's keys: those named
    # (ssh.key, then ssh_config's IdentityFile, tokens expanded) that exist or, when none is
    # named, OpenSSH's default keys (~/.ssh/id_*) that exist. None: not resolved through
    # ssh_config; `key` then, or without one the default keys found when connecting.
    identity_files: tuple[Path, ...] | None = None
    # Project known_hosts files, checked in addition to ~/.ssh/known_hosts; the first
    # one records keys accepted under host_key_policy "accept-new".
    known_hosts: tuple[Path, ...] = ()
    host_key_policy: HostKeyPolicy = "strict"
    jump: str | None = None  # ProxyJump as written: [user@]host[:port][,...]
    connect_timeout: float = 10.0
    # The route, first connection first: `hops` (ProxyJump, each resolved through
    # ssh_config) and a ProxyCommand (tokens expanded) that opens the first connection.
    hops: tuple[Hop, ...] = ()
    proxy_command: str | None = None


# A port block (`ray: {port_base: N}`): N to N+999, workers from N+100.
PORT_BLOCK = 1000
PORT_BASE_MIN = 1024
PORT_BASE_MAX = 65536 - PORT_BLOCK


@dataclass(frozen=True)
class RayPorts:
    """Every port Ray uses on a node. Ray leaves several random; we pin them all.

    Defaults of Ray itself: gcs 6379, dashboard 8265, client 10001, dashboard agent
    http 52365, worker ports 10002-19999. Fixed by provisioner (Ray picks random ones):
    object manager 8076, node manager 8077, dashboard agent grpc 8078, runtime env
    agent 8079, metrics export 8090.
    """

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001
    dashboard_agent_grpc: int = 8078
    dashboard_agent_http: int = 52365
    metrics_export: int = 8090
    node_manager: int = 8077
    object_manager: int = 8076
    runtime_env_agent: int = 8079
    min_worker: int = 10002
    max_worker: int = 19999

    @classmethod
    def from_base(cls, base: int, size: int = PORT_BLOCK) -> RayPorts:
        """Every port from one block of `size` ports starting at `base`.

        base+0 gcs, +1 dashboard, +2 client, +3 node manager, +4 object manager,
        +5 dashboard agent grpc, +6 dashboard agent http, +7 runtime env agent,
        +8 metrics export; the last nine tenths of the block are the worker ports (for the
        inventory's 1000: +100 to +999). Blocks that do not overlap never share a port.
        """
        if size < 100 or not 1024 <= base <= 65536 - size:
            raise ValueError(f"no block of {size} ports starts at {base} (1024-65535)")
        return cls(
            gcs=base,
            dashboard=base + 1,
            client=base + 2,
            node_manager=base + 3,
            object_manager=base + 4,
            dashboard_agent_grpc=base + 5,
            dashboard_agent_http=base + 6,
            runtime_env_agent=base + 7,
            metrics_export=base + 8,
            min_worker=base + size // 10,
            max_worker=base + size - 1,
        )

    def all_ports(self) -> frozenset[int]:
        """Every port this layout may listen on: the single ports and the worker range."""
        return frozenset(self.named().values()) | frozenset(self.worker_range)

    def overlaps(self, other: RayPorts) -> frozenset[int]:
        """The ports this layout shares with `other` (empty: they can run side by side)."""
        return self.all_ports() & other.all_ports()

    def named(self) -> dict[str, int]:
        """The single ports by name (the worker range excluded)."""
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("min_worker", "max_worker")
        }

    @property
    def worker_range(self) -> range:
        return range(self.min_worker, self.max_worker + 1)


_TIME = re.compile(
    r"^(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
    r"|(?P<h>\d+):(?P<m>\d+):(?P<s>\d+)|(?P<mm>\d+):(?P<ss>\d+)|(?P<min>\d+))$"
)


def time_seconds(text: str) -> int:
    """Seconds in a SLURM time limit (sbatch --time's formats); ValueError if not one."""
    m = _TIME.fullmatch(text)
    if not m:
        raise ValueError(text)
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:
        return ((g["d"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    if "h" in g:
        return (g["h"] * 60 + g["m"]) * 60 + g["s"]
    if "mm" in g:
        return g["mm"] * 60 + g["ss"]
    return g["min"] * 60


@dataclass(frozen=True)
class Slurm:
    """What to ask SLURM for. `login` is resolved into a Node by the inventory's builder."""

    partition: str | None = None
    nodes: int = 1
    time: str | None = None
    cpus_per_node: int | None = None
    gpus_per_node: int | None = None
    account: str | None = None
    extra_sbatch_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Node:
    """One machine of the cluster."""

    name: str
    address: str
    role: Role
    ssh: SSHSettings
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    # NVIDIA GPUs given to Ray: indices ("0") or UUIDs ("GPU-..."); None: all the node has
    # (or the first `resources: {GPU: n}` of them); (): none
    gpus: tuple[str, ...] | None = None
    # `ray: {address: ...}`: the address Ray uses on this node (--node-ip-address, the
    # head's GCS address), on the network that carries Ray's traffic; None: the SSH address
    data_address: str | None = None

    @property
    def is_head(self) -> bool:
        return self.role == "head"

    @property
    def ray_address(self) -> str:
        """The address Ray advertises and the other nodes reach this node's Ray at."""
        return self.data_address or self.address

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every address the node is known by: SSH's, then Ray's when it differs."""
        return tuple(dict.fromkeys((self.address, self.ray_address)))


@dataclass(frozen=True)
class Inventory:
    """The cluster as the user described it."""

    path: Path
    cluster: str
    head: Node
    workers: tuple[Node, ...]
    ports: RayPorts = field(default_factory=RayPorts)
    image_lock: Path | None = None
    shm_size: int | None = None  # bytes; None: about 30% of the node's memory
    object_store_memory: int | None = None  # bytes; None: Ray's default
    # how Ray runs on the nodes: a runtime's name, data here (provisioner.runtime.registry
    # knows the runtimes and refuses an unknown name, at `runtime_where`)
    runtime: str = DEFAULT_RUNTIME
    ray_python: str | None = None  # host runtime: the interpreter (None: a login shell's `ray`)
    tls: bool = True  # TLS on Ray's channels, with the cluster's own CA (node.tls)
    # what one node-hour costs the user: `submit` gives it to the job, whose summary.json
    # then has the run's cost (None: node-hours only)
    price_per_node_hour: float | None = None
    # SLURM: what to ask for, and the login node; the head and workers are the allocated
    # nodes once `up` has them (until then the head is the login node, and `allocated` False)
    slurm: Slurm | None = None
    login: Node | None = None
    allocated: bool = True
    runtime_where: str = ""  # where the inventory names its runtime (FILE:LINE)
    # `ray: {subnet: CIDR}`: each node's Ray address is its own address in that network, asked
    # of the node (cluster.subnet.resolve_ray_subnet gives the nodes their data_address, and
    # returns the inventory without it); a node's own `ray: {address}` wins
    ray_subnet: str | None = None
    ray_subnet_where: str = ""  # where the inventory names it (FILE:LINE)
    runtime_field: str = "runtime"  # and by what name (Ansible: provisioner_runtime)
    # Tune's storage every node shares (node.storage): "head", the S3 store the head
    # serves (default); "path", a filesystem every node mounts at `storage_path` (the
    # doctor proves it shared); or "none", Ray's own (a local folder on each node)
    storage: str = "head"
    storage_path: str = ""

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every node, head first."""
        return (self.head, *self.workers)

    def node(self, name: str) -> Node:
        """The node called `name` (or with that address, SSH's or Ray's)."""
        for node in self.nodes:
            if name == node.name or name in node.addresses:
                return node
        raise KeyError(name)

    @property
    def state_dir(self) -> Path:
        """This cluster's own state: the Ray token, accepted host keys, ..."""
        return state_root() / "clusters" / self.cluster
