"""Bring the lab's nodes up and down: network, containers, keys, inventory."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from docker.errors import NotFound

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, LabError
from provisioner.inventory.models import DEFAULT_RUNTIME
from provisioner.lab.config import (
    LABEL,
    SHARED_TARGET,
    LabConfig,
    LabNode,
    data_network_script,
    inventory_document,
    known_hosts_lines,
    node_run_args,
    slurm_conf,
)
from provisioner.lab.engine import client, docker_cli, exec_rc
from provisioner.lab.flavours import DEFAULT_FLAVOUR
from provisioner.lab.images import (
    HOST_DOCKERFILE,
    PODMAN_RECIPE,
    ensure_host_node_image,
    ensure_node_image,
    ensure_podman_node_image,
    ensure_slurm_node_image,
)
from provisioner.lab.keys import ensure_keypair
from provisioner.local import private_dir

READY_TIMEOUT = 90.0


@dataclass(frozen=True)
class LabInfo:
    """A running lab: where its inventory, key and known_hosts are, and its nodes."""

    name: str
    state_dir: Path
    inventory: Path
    key: Path
    known_hosts: Path
    nodes: tuple[LabNode, ...]
    shared_dir: str = SHARED_TARGET

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "inventory": str(self.inventory),
            "key": str(self.key),
            "known_hosts": str(self.known_hosts),
            "shared_dir": self.shared_dir,
            "nodes": [n.to_json() for n in self.nodes],
        }

    def ssh_command(self, node: LabNode, *extra: str) -> list[str]:
        """OpenSSH client arguments for a node, host keys checked STRICTLY against the lab's."""
        return [
            "ssh",
            "-i", str(self.key),
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes",
            "-o", "ConnectTimeout=5",
            *extra,
            f"{node.user}@{node.address}",
        ]  # fmt: skip

    def node(self, ref: str) -> LabNode:
        """A node by name, index (0 = head) or address."""
        for i, n in enumerate(self.nodes):
            if ref in (n.name, n.address, str(i)):
                return n
        names = ", ".join(n.name for n in self.nodes)
        raise InputError(f"no lab node {ref!r}", f"use one of: {names} (or an index 0..)")


def info(cfg: LabConfig) -> LabInfo:
    return LabInfo(
        name=cfg.name,
        state_dir=cfg.state_dir,
        inventory=cfg.inventory,
        key=cfg.key,
        known_hosts=cfg.known_hosts,
        nodes=cfg.lab_nodes(),
    )


def load_config(name: str | None = None) -> LabConfig:
    """The configuration of the lab that `lab up` made under this name (reads lab.json)."""
    probe = LabConfig.from_env(name=name)
    record = probe.state_dir / "lab.json"
    if not record.exists():
        raise InputError(f"no lab named {probe.name!r} is up", "run `provisioner lab up`")
    data = json.loads(record.read_text())
    return LabConfig(
        name=data["name"],
        subnet=data["subnet"],
        nodes=data["nodes"],
        runtime=data.get("runtime", DEFAULT_RUNTIME),
        slurm=data.get("slurm", False),
        flavours=tuple(data.get("flavours", [DEFAULT_FLAVOUR])),
        data_subnet=data.get("data_subnet"),
    )


def load_lab(name: str | None = None) -> LabInfo:
    """The lab that `lab up` made under this name."""
    return info(load_config(name))


def lab_up(
    cfg: LabConfig,
    report: Reporter = quiet,
    image_lock: Path | None = None,
    images_dir: Path = Path("images"),
) -> LabInfo:
    """Create or repair the lab; a running, healthy lab is left as it is.

    `image_lock`: the pin (from `provisioner image build`) the lab's inventory refers to.
    `images_dir`: host runtime: the requirements lock and wheelhouse of the nodes' virtualenv.
    """
    _check_not_resized(cfg)
    image_lock = image_lock or _previous_image_lock(cfg)
    images = _node_images(cfg, images_dir, report)
    private_dir(cfg.state_dir)
    cfg.state_dir.chmod(0o700)
    pub = ensure_keypair(cfg.key, f"provisioner-{cfg.name}")
    (cfg.state_dir / "authorized_keys").write_text(pub + "\n")
    cfg.shared_dir.mkdir(exist_ok=True)
    cfg.shared_dir.chmod(0o1777)
    if cfg.slurm:
        _write_slurm_files(cfg)
    _ensure_network(cfg, cfg.network, cfg.subnet)
    if cfg.data_subnet:
        _ensure_network(cfg, cfg.data_network, cfg.data_subnet)
    nodes = cfg.lab_nodes()
    for node in nodes:
        _ensure_node(cfg, node, images[node.flavour], report)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        list(pool.map(lambda n: wait_ready(n, report), nodes))
    for node in nodes:
        if node.data_address:
            split_networks(node)
    if cfg.slurm:
        wait_slurm_idle(cfg, report)
    _write_known_hosts(cfg, nodes)
    cfg.inventory.write_text(
        "# Written by `provisioner lab up`: the lab's nodes in provisioner's inventory format.\n"
        + yaml.safe_dump(inventory_document(cfg, image_lock), sort_keys=False)
    )
    (cfg.state_dir / "lab.json").write_text(
        json.dumps(
            {
                "name": cfg.name,
                "subnet": cfg.subnet,
                "nodes": cfg.nodes,
                "runtime": cfg.runtime,
                "slurm": cfg.slurm,
                "flavours": list(cfg.flavours),
                **({"data_subnet": cfg.data_subnet} if cfg.data_subnet else {}),
            }
        )
        + "\n"
    )
    return info(cfg)


def _node_images(cfg: LabConfig, images_dir: Path, report: Reporter) -> dict[str, str]:
    """The node image of each flavour the lab has (each built once, then reused)."""
    if cfg.slurm:
        flavours = dict.fromkeys(cfg.node_flavours())
        return {f: ensure_slurm_node_image(images_dir, report, f) for f in flavours}
    # the node image the runtime's lab recipe names, by its Dockerfile (lab/recipe/)
    builds: dict[str, Callable[[str], str]] = {
        "node.Dockerfile": lambda f: ensure_node_image(report, f),
        HOST_DOCKERFILE: lambda f: ensure_host_node_image(images_dir, report, f),
        PODMAN_RECIPE[0]: lambda f: ensure_podman_node_image(report, f),
    }
    build = builds[cfg.recipe.dockerfile]
    return {f: build(f) for f in dict.fromkeys(cfg.node_flavours())}


def _write_slurm_files(cfg: LabConfig) -> None:
    """slurm.conf (rewritten: it follows the lab's nodes) and the munge key every node
    shares (made once; 1 KiB of random bytes, 0600 here, 0400 for munge on the nodes)."""
    cfg.slurm_conf.write_text(slurm_conf(cfg))
    if not cfg.munge_key.exists():
        with open(cfg.munge_key, "xb", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            f.write(os.urandom(1024))


def wait_slurm_idle(cfg: LabConfig, report: Reporter = quiet, timeout: float = 90.0) -> None:
    """Wait until slurmctld lists every compute node as idle (or mixed/allocated: in use)."""
    login = cfg.lab_nodes()[0]
    deadline = time.monotonic() + timeout
    out = ""
    while time.monotonic() < deadline:
        rc, out = exec_rc(login.container, "sinfo -h -N -o '%N %t'")
        states = [line.split()[-1] for line in out.splitlines() if line.strip()]
        if (
            rc == 0
            and len(states) == cfg.nodes
            and all(s.rstrip("*") in ("idle", "mix", "alloc") for s in states)
        ):
            return
        time.sleep(1)
    raise LabError(
        f"SLURM lab {cfg.name}: compute nodes not idle after {timeout:.0f}s: {out[-400:]}",
        f"look at /var/log/slurm/ on the nodes (docker exec {login.container} sinfo -R)",
    )


def _previous_image_lock(cfg: LabConfig) -> Path | None:
    """The pin an earlier `lab up` wrote into the inventory (kept when none is given now)."""
    try:
        doc = yaml.safe_load(cfg.inventory.read_text())
        lock = doc["image"]["lock"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return Path(lock) if isinstance(lock, str) else None


def _check_not_resized(cfg: LabConfig) -> None:
    record = cfg.state_dir / "lab.json"
    if record.exists():
        data = json.loads(record.read_text())
        if data.get("subnet") != cfg.subnet:
            raise InputError(
                f"lab {cfg.name!r} already runs on {data.get('subnet')}, not {cfg.subnet}",
                "run `provisioner lab down` first, or use another --name",
            )
        if data.get("data_subnet") != cfg.data_subnet:
            raise InputError(
                f"lab {cfg.name!r} already runs with data subnet "
                f"{data.get('data_subnet') or 'none'}, not {cfg.data_subnet or 'none'}",
                "run `provisioner lab down` first, or use another --name",
            )


def _ensure_network(cfg: LabConfig, name: str, subnet: str) -> None:
    c = client()
    try:
        net = c.networks.get(name)
    except NotFound:
        gateway = str(ipaddress.ip_network(subnet)[1])
        ipam = {"Driver": "default", "Config": [{"Subnet": subnet, "Gateway": gateway}]}
        c.api.create_network(
            name, driver="bridge", ipam=ipam, labels={LABEL: cfg.name}, check_duplicate=True
        )
        return
    configs = net.attrs.get("IPAM", {}).get("Config") or [{}]
    if configs[0].get("Subnet") != subnet:
        raise LabError(
            f"docker network {name} exists with subnet {configs[0].get('Subnet')}",
            f"remove it (`docker network rm {name}`) or choose another lab --name",
        )


SPLIT_TAG = "provisioner-lab-split"


def split_networks(node: LabNode) -> None:
    """SSH only on the lab's network, Ray's traffic only on the data network (iptables in
    the node; again after a restart: the rules live in the node's network namespace)."""
    rc, out = exec_rc(node.container, data_network_script(node, SPLIT_TAG))
    if rc != 0:
        raise LabError(
            f"{node.name}: cannot split its networks: {out.strip()[-300:]}",
            "make the lab again (`provisioner lab down`, then `provisioner lab up`)",
        )


def _ensure_node(cfg: LabConfig, node: LabNode, image: str, report: Reporter) -> None:
    c = client()
    try:
        existing = c.containers.get(node.container)
    except NotFound:
        existing = None
    if existing is not None:
        if (
            existing.image is not None
            and image in existing.image.tags
            and _mounts(existing, SHARED_TARGET)
        ):
            if existing.status != "running":
                report(f"{node.name}: starting")
                existing.start()
            return
        report(f"{node.name}: recipe changed, recreating")
        existing.remove(force=True)
    storage = cfg.node_storage(node)
    if storage.exists():
        # a store left by a node that is gone (a run killed before `lab down`): its
        # containers restart by their policy (a cluster's Ray, answering on its ports) and
        # its engine's files may be another release's; a new node starts empty
        report(f"{node.name}: clearing the store a removed node left")
        shutil.rmtree(storage)
    storage.mkdir(parents=True, exist_ok=True)
    report(f"{node.name}: creating at {node.address}")
    docker_cli(node_run_args(cfg, node, image), timeout=120)
    if node.data_address:  # the data network: a second interface
        docker_cli(
            ["network", "connect", "--ip", node.data_address, cfg.data_network, node.container],
            timeout=60,
        )


def _mounts(container: Any, target: str) -> bool:
    """The container has a bind mount at `target` (a node made before the lab had its
    shared folder has none: it is made again, once)."""
    mounts = container.attrs.get("Mounts") or []
    return any(m.get("Destination") == target for m in mounts)


def wait_ready(node: LabNode, report: Reporter = quiet, timeout: float = READY_TIMEOUT) -> None:
    """Wait until the node's sshd answers with a banner and its dockerd (if it has one:
    a podman node has none) answers."""
    deadline = time.monotonic() + timeout
    dockerd = "! command -v dockerd >/dev/null || docker info >/dev/null"
    while time.monotonic() < deadline:
        if _sshd_answers(node) and exec_rc(node.container, dockerd)[0] == 0:
            return
        time.sleep(0.5)
    _, log = exec_rc(node.container, "tail -n 5 /var/log/dockerd.log /var/log/sshd.log")
    raise LabError(
        f"{node.name}: sshd or dockerd not ready after {timeout:.0f}s; last log lines: "
        f"{log[-600:]}",
        f"inspect with `docker logs {node.container}`; `provisioner lab down` then `lab up`",
    )


def _sshd_answers(node: LabNode) -> bool:
    """The node's sshd sends its banner: to this machine, or for a SLURM compute node
    (which refuses SSH from here) to the node itself."""
    if node.role != "compute":
        return _ssh_banner(node.address)
    probe = "exec 3<>/dev/tcp/127.0.0.1/22 && timeout 2 head -c 4 <&3"
    rc, out = exec_rc(node.container, probe, timeout=10)
    return rc == 0 and out.startswith("SSH-")


def _ssh_banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=2) as s:
            s.settimeout(2)
            return s.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def _write_known_hosts(cfg: LabConfig, nodes: tuple[LabNode, ...]) -> None:
    lines: list[str] = []
    for node in nodes:
        rc, keys = exec_rc(node.container, "cat /etc/ssh/ssh_host_*_key.pub")
        if rc != 0:
            raise LabError(
                f"{node.name}: cannot read its host keys: {keys[-200:]}",
                "make the lab again (`provisioner lab down`, then `provisioner lab up`)",
            )
        lines += known_hosts_lines(node.address, keys)
    cfg.known_hosts.write_text("\n".join(lines) + "\n")


def lab_down(cfg: LabConfig, report: Reporter = quiet) -> list[str]:
    """Remove every container, network and directory this lab made; return what was removed."""
    c = client()
    removed: list[str] = []
    for container in c.containers.list(all=True, filters={"label": f"{LABEL}={cfg.name}"}):
        report(f"removing container {container.name}")
        container.remove(force=True)
        removed.append(f"container {container.name}")
    for name in (cfg.network, cfg.data_network):
        for net in c.networks.list(names=[name]):
            if net.name == name and net.attrs.get("Labels", {}).get(LABEL) == cfg.name:
                net.remove()
                removed.append(f"network {net.name}")
    if cfg.state_dir.exists():
        shutil.rmtree(cfg.state_dir)
        removed.append(f"directory {cfg.state_dir}")
    return removed


def lab_status(cfg: LabConfig) -> list[dict[str, Any]]:
    """Per node: container state, sshd banner, dockerd answering."""
    c = client()
    rows = []
    for node in cfg.lab_nodes():
        try:
            state = c.containers.get(node.container).status
        except NotFound:
            state = "absent"
        running = state == "running"
        rows.append(
            {
                **node.to_json(),
                "container": state,
                "sshd": running and _sshd_answers(node),
                "dockerd": running and exec_rc(node.container, "docker info >/dev/null")[0] == 0,
            }
        )
    return rows
