"""Pure facts about a lab: names, addresses, paths, the inventory it writes."""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.image.base_image import LABEL as LABEL  # the lab labels its nodes with it too
from provisioner.inventory.models import DEFAULT_RUNTIME
from provisioner.lab.flavours import DEFAULT_FLAVOUR, FLAVOURS, per_node
from provisioner.local import state_root
from provisioner.runtime.protocol import LabRecipe
from provisioner.runtime.registry import lab_recipe
from provisioner.runtime.registry import names as runtime_names

LAB_USER = "lab"
DEFAULT_NAME = "lab"
DEFAULT_SUBNET = "10.250.0.0/24"
FIRST_HOST = 10  # node i gets the subnet's address .10 + i
MAX_NODES = 32
_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,19}$")


@dataclass(frozen=True)
class LabNode:
    """One simulated machine."""

    name: str
    address: str
    role: str  # "head" | "worker"
    user: str = LAB_USER
    flavour: str = DEFAULT_FLAVOUR  # provisioner.lab.flavours.FLAVOURS
    # a lab with a data network (`lab up --data-subnet`): the node's address there, the one
    # Ray uses (its inventory's `ray: {address}`); "" without one
    data_address: str = ""

    @property
    def container(self) -> str:
        return self.name

    def to_json(self) -> dict[str, str]:
        data = {"data_address": self.data_address} if self.data_address else {}
        return {
            "name": self.name,
            "address": self.address,
            "user": self.user,
            "role": self.role,
            "flavour": self.flavour,
            **data,
        }


@dataclass(frozen=True)
class LabConfig:
    """What a lab is made of; everything else is derived from it."""

    name: str = DEFAULT_NAME
    subnet: str = DEFAULT_SUBNET
    nodes: int = 3
    # the runtime its inventory names; its nodes are built by that runtime's lab recipe
    # (`runtime.registry.lab_recipe`: e.g. nodes with Docker, with rootless Podman for a
    # login user without Docker, or with Ray in a virtualenv on the login shell's PATH)
    runtime: str = DEFAULT_RUNTIME
    # a SLURM cluster: node 0 is the login node (slurmctld), `nodes` compute nodes (slurmd,
    # Ray in a virtualenv as in host mode) reached only through it
    slurm: bool = False
    # the kind of each node (`--flavours`): one entry for all, or one per node
    flavours: tuple[str, ...] = (DEFAULT_FLAVOUR,)
    # a second network for Ray's traffic: SSH reaches the nodes only on `subnet`, Ray's
    # ports only on this one (iptables in each node); the inventory names each node's
    # address here as its `ray: {address}`
    data_subnet: str | None = None

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def from_env(
        cls,
        name: str | None = None,
        subnet: str | None = None,
        nodes: int = 3,
        runtime: str = DEFAULT_RUNTIME,
        slurm: bool = False,
        flavours: tuple[str, ...] = (DEFAULT_FLAVOUR,),
        data_subnet: str | None = None,
    ) -> LabConfig:
        return cls(
            name=name or os.environ.get("PROVISIONER_LAB_NAME") or DEFAULT_NAME,
            subnet=subnet or os.environ.get("PROVISIONER_LAB_SUBNET") or DEFAULT_SUBNET,
            nodes=nodes,
            runtime=slurm_runtime() if slurm else runtime,
            slurm=slurm,
            flavours=flavours,
            data_subnet=data_subnet,
        )

    @property
    def recipe(self) -> LabRecipe:
        """What the lab builds for a node of its runtime (the runtime's lab recipe)."""
        return lab_recipe(self.runtime)

    @property
    def prefix(self) -> str:
        return f"provisioner-{self.name}"

    @property
    def network(self) -> str:
        return self.prefix

    @property
    def data_network(self) -> str:
        """The docker network for Ray's traffic (with `data_subnet`; `_`: no lab's name)."""
        return f"{self.prefix}_data"

    @property
    def gateway(self) -> str:
        return str(ipaddress.ip_network(self.subnet)[1])

    @property
    def state_dir(self) -> Path:
        return state_root() / f"lab-{self.name}"

    @property
    def key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def inventory(self) -> Path:
        return self.state_dir / "inventory.yaml"

    @property
    def shared_dir(self) -> Path:
        """The one folder of this machine every node of the lab has at SHARED_TARGET: a
        stand-in for a site's NFS home (world-writable, sticky: the login user and root in
        a Ray container both write there)."""
        return self.state_dir / "shared"

    def node_storage(self, node: LabNode) -> Path:
        return self.state_dir / "nodes" / node.name / "docker"

    @property
    def storage_target(self) -> str:
        """Where node_storage is mounted in a node: its runtime's image store (Docker's
        root, or the login user's Podman store: a host directory, as native overlay needs
        one that is not itself overlay)."""
        return self.recipe.storage.format(user=LAB_USER)

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def munge_key(self) -> Path:
        return self.state_dir / "munge.key"

    @property
    def node_count(self) -> int:
        """Containers in the lab: a SLURM lab's login node comes on top of --nodes."""
        return self.nodes + 1 if self.slurm else self.nodes

    def node_flavours(self) -> tuple[str, ...]:
        return per_node(self.flavours, self.node_count)

    def lab_nodes(self) -> tuple[LabNode, ...]:
        net = ipaddress.ip_network(self.subnet)
        roles = ("login", "compute") if self.slurm else ("head", "worker")
        data = ipaddress.ip_network(self.data_subnet) if self.data_subnet else None
        return tuple(
            LabNode(
                name=f"{self.prefix}-{i}",
                address=str(net[FIRST_HOST + i]),
                role=roles[0] if i == 0 else roles[1],
                flavour=flavour,
                data_address=str(data[FIRST_HOST + i]) if data else "",
            )
            for i, flavour in enumerate(self.node_flavours())
        )


def validate(cfg: LabConfig) -> None:
    if not _NAME_RE.fullmatch(cfg.name):
        raise InputError(
            f"invalid lab name {cfg.name!r}",
            "use 1-20 characters: lowercase letters, digits and '-', starting with a letter",
        )
    try:
        net = ipaddress.ip_network(cfg.subnet)
    except ValueError as exc:
        raise InputError(
            f"invalid lab subnet {cfg.subnet!r}: {exc}", "use e.g. 10.250.0.0/24"
        ) from exc
    if not isinstance(net, ipaddress.IPv4Network) or not net.is_private:
        raise InputError(
            f"lab subnet {cfg.subnet!r} must be a private IPv4 network", "use e.g. 10.250.0.0/24"
        )
    if cfg.runtime not in runtime_names():
        raise InputError(
            f"--runtime must be one of {', '.join(runtime_names())}, got {cfg.runtime!r}",
            "; ".join(f"{name}: {lab_recipe(name).about}" for name in runtime_names()),
        )
    if not 1 <= cfg.nodes <= MAX_NODES:
        raise InputError(
            f"--nodes must be between 1 and {MAX_NODES}, got {cfg.nodes}",
            f"pass --nodes N with N from 1 to {MAX_NODES}",
        )
    if cfg.slurm and not cfg.recipe.slurm:
        slurm = slurm_runtime()
        raise InputError(
            f"a SLURM lab runs Ray in {slurm} mode",
            f"leave out --runtime (or say --runtime {slurm})",
        )
    _validate_flavours(cfg)
    if net.num_addresses < FIRST_HOST + cfg.nodes + 3:
        raise InputError(f"lab subnet {cfg.subnet} is too small for {cfg.nodes} nodes", "use a /24")
    if cfg.data_subnet is not None:
        _validate_data_subnet(cfg, net)


def _validate_data_subnet(cfg: LabConfig, net: ipaddress.IPv4Network) -> None:
    fix = "use a private /24 apart from --subnet, e.g. 10.251.0.0/24"
    try:
        data = ipaddress.ip_network(str(cfg.data_subnet))
    except ValueError as exc:
        raise InputError(f"invalid --data-subnet {cfg.data_subnet!r}: {exc}", fix) from exc
    if not isinstance(data, ipaddress.IPv4Network) or not data.is_private or data.overlaps(net):
        raise InputError(
            f"--data-subnet {cfg.data_subnet!r} must be a private IPv4 network apart from "
            f"the lab's subnet {cfg.subnet}",
            fix,
        )
    if data.num_addresses < FIRST_HOST + cfg.nodes + 3:
        raise InputError(f"--data-subnet {cfg.data_subnet} is too small for {cfg.nodes} nodes", fix)
    if cfg.slurm:
        raise InputError("a SLURM lab has one network", "leave out --data-subnet")


def _validate_flavours(cfg: LabConfig) -> None:
    unknown = [f for f in cfg.flavours if f not in FLAVOURS]
    if unknown or not cfg.flavours:
        raise InputError(
            f"unknown lab flavour {(unknown or [''])[0]!r}", f"use one of {', '.join(FLAVOURS)}"
        )
    cfg.node_flavours()  # one entry, or one per node
    if cfg.slurm and len(set(cfg.flavours)) > 1:
        # slurmctld talks to slurmd of its own release and the two before it only: 24.11
        # (trixie) is four releases past 22.05 (bookworm)
        raise InputError(
            f"a SLURM lab's nodes are of one Debian release (one Slurm), not "
            f"{','.join(cfg.flavours)}",
            "give one flavour for all nodes (--flavours bookworm: Slurm 22.05, or "
            "--flavours trixie: Slurm 24.11)",
        )
    stores = [f for f in cfg.flavours if FLAVOURS[f].containerd_store]
    if not cfg.recipe.docker_stores and stores:
        raise InputError(
            f"--runtime {cfg.runtime} nodes have no Docker, so no {stores[0]} image store",
            "give bookworm (Podman 4.3) or trixie (Podman 5.4) nodes, e.g. --flavours "
            "bookworm,trixie",
        )


def slurm_runtime() -> str:
    """The runtime a SLURM lab's nodes run Ray with (the one whose lab recipe says so)."""
    return next(name for name in runtime_names() if lab_recipe(name).slurm)


def _ssh_section(cfg: LabConfig) -> dict[str, Any]:
    return {
        "user": LAB_USER,
        "key": cfg.key.name,
        "port": 22,
        "known_hosts": cfg.known_hosts.name,
        "host_key_policy": "strict",
        "connect_timeout": 10,
    }


def inventory_document(cfg: LabConfig, image_lock: Path | None = None) -> dict[str, Any]:
    """The inventory, in provisioner's own format, that describes the lab's nodes."""
    nodes = cfg.lab_nodes()
    if cfg.slurm:
        return slurm_inventory_document(cfg)
    doc: dict[str, Any] = {
        "cluster": cfg.name,
        "ssh": _ssh_section(cfg),
        "head": _inventory_node(nodes[0]),
        "workers": [_inventory_node(n) for n in nodes[1:]],
    }
    if cfg.runtime != DEFAULT_RUNTIME:
        doc["runtime"] = cfg.runtime
    if cfg.recipe.pinned_image and image_lock is not None:
        doc["image"] = {"lock": str(image_lock.resolve())}
    return doc


def _inventory_node(node: LabNode) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": node.name, "address": node.address}
    if node.data_address:
        entry["ray"] = {"address": node.data_address}
    return entry


def data_network_script(node: LabNode, tag: str) -> str:
    """Shell (as root in the node) that keeps SSH on the lab's network and Ray's traffic on
    the data network: new TCP connections to the SSH address other than port 22 are
    dropped, and port 22 on the data address; idempotent (each rule checked first)."""
    comment = f"-m comment --comment {tag}"
    rules = [
        f"INPUT -d {node.address} -p tcp ! --dport 22 -m conntrack --ctstate NEW "
        f"! -i lo {comment} -j DROP",
        f"INPUT -d {node.data_address} -p tcp --dport 22 {comment} -j DROP",
    ]
    return "; ".join(f"{{ iptables -C {r} 2>/dev/null || iptables -I {r}; }}" for r in rules)


SLURM_PARTITION = "lab"
SLURM_CPUS = 2  # per compute node, as slurm.conf says


def slurm_inventory_document(
    cfg: LabConfig, cluster: str | None = None, nodes: int | None = None
) -> dict[str, Any]:
    """An inventory for a cluster allocated on the SLURM lab: its login node, the partition,
    `nodes` nodes (default: all) of SLURM_CPUS CPUs each, host mode."""
    login = cfg.lab_nodes()[0]
    return {
        "cluster": cluster or cfg.name,
        "ssh": _ssh_section(cfg),
        "scheduler": {
            "type": "slurm",
            "login": {"name": login.name, "address": login.address},
            "partition": SLURM_PARTITION,
            "nodes": nodes or cfg.nodes,
            "time": "00:30:00",
            "cpus_per_node": SLURM_CPUS,
        },
        "runtime": slurm_runtime(),
    }


def slurm_conf(cfg: LabConfig) -> str:
    """slurm.conf for the lab: munge, no cgroups (a container), cons_tres by core, and one
    partition where every core may be given to two jobs at once (OverSubscribe=FORCE:2),
    so that two allocations share nodes."""
    login, *compute = cfg.lab_nodes()
    lines = [
        "# Written by `provisioner lab up --slurm`.",
        f"ClusterName={cfg.name}",
        f"SlurmctldHost={login.name}({login.address})",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        "MpiDefault=none",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmUser=slurm",
        "StateSaveLocation=/var/spool/slurmctld",
        "SlurmdSpoolDir=/var/spool/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "SchedulerParameters=sched_interval=2",
        "KillWait=5",
        "InactiveLimit=0",
        "MinJobAge=30",
        *(
            f"NodeName={n.name} NodeAddr={n.address} CPUs={SLURM_CPUS} State=UNKNOWN"
            for n in compute
        ),
        f"PartitionName={SLURM_PARTITION} Nodes={','.join(n.name for n in compute)} "
        "Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2",
    ]
    return "\n".join(lines) + "\n"


def known_hosts_lines(address: str, host_keys: str) -> list[str]:
    """known_hosts lines for one node from the contents of its /etc/ssh/ssh_host_*_key.pub."""
    lines = []
    for raw in host_keys.splitlines():
        parts = raw.split()
        if len(parts) >= 2 and parts[0].startswith(("ssh-", "ecdsa-")):
            lines.append(f"{address} {parts[0]} {parts[1]}")
    return lines


SHARED_TARGET = "/srv/shared"
"""Where every lab node has the lab's shared folder (the same path on each)."""


def node_run_args(cfg: LabConfig, node: LabNode, image: str) -> list[str]:
    """`docker run` arguments for one lab node (the lab recipe's verified flags)."""
    return [
        "run",
        "-d",
        "--init",
        "--name",
        node.container,
        "--hostname",
        node.name,
        "--network",
        cfg.network,
        "--ip",
        node.address,
        "--label",
        f"{LABEL}={cfg.name}",
        "--label",
        f"{LABEL}.role={node.role}",
        # --privileged fails where the bounding set lacks CAP_SYS_RESOURCE: all caps but that.
        "--cap-add",
        "ALL",
        "--cap-drop",
        "SYS_RESOURCE",
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "apparmor=unconfined",
        "--security-opt",
        "systempaths=unconfined",
        "-v",
        "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "-v",
        f"{cfg.node_storage(node)}:{cfg.storage_target}:rw",
        "-v",
        f"{cfg.state_dir / 'authorized_keys'}:/lab/authorized_keys:ro",
        "-v",
        f"{cfg.shared_dir}:{SHARED_TARGET}:rw",
        *_slurm_args(cfg, node, image),
    ]


def _slurm_args(cfg: LabConfig, node: LabNode, image: str) -> list[str]:
    if not cfg.slurm:
        return [image]
    return [
        "-v",
        f"{cfg.slurm_conf}:/lab/slurm.conf:ro",
        "-v",
        f"{cfg.munge_key}:/lab/munge.key:ro",
        image,
        "/usr/local/sbin/lab-slurm-node",
        node.role,
    ]
