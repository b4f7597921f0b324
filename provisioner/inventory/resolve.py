"""From what the file says to the model: ~/.ssh/config and defaults fill gaps; final checks."""

from __future__ import annotations

import getpass
import os
import stat
from pathlib import Path

import paramiko

from provisioner.errors import InventoryError
from provisioner.inventory.fields import Where, check_address, check_jump, check_port, check_user
from provisioner.inventory.models import (
    HostKeyPolicy,
    Inventory,
    Node,
    Role,
    SSHSettings,
)
from provisioner.inventory.raw import RawHost, RawInventory
from provisioner.local import state_root


def read_ssh_config(path: Path | None) -> paramiko.SSHConfig | None:
    """The user's ~/.ssh/config (or `path`), or None when there is none."""
    path = path or Path.home() / ".ssh" / "config"
    if not path.is_file():
        return None
    try:
        return paramiko.SSHConfig.from_path(str(path))
    except (OSError, ValueError, paramiko.ssh_exception.ConfigParseError) as exc:
        raise InventoryError(
            f"cannot read SSH config: {exc}", "fix or move the file", where=str(path)
        ) from None


def check_key_file(key: Path, where: Where, field: str) -> None:
    """A private key must exist, be readable, and be closed to others (as OpenSSH insists)."""
    if not key.is_file():
        raise where.error(
            field,
            f"key file {key} does not exist",
            f"create it (ssh-keygen -t ed25519 -f {key}) or fix the path",
        )
    if not os.access(key, os.R_OK):
        raise where.error(
            field,
            f"key file {key} is not readable by this user",
            f"chmod 600 {key} (and check its owner)",
        )
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        raise where.error(
            field, f"key file {key} has permissions {mode:04o}, open to others", f"chmod 600 {key}"
        )


def _settings(
    raw: RawInventory, host: RawHost, config: paramiko.SSHConfig | None
) -> tuple[str, SSHSettings]:
    found = config.lookup(host.address) if config else paramiko.SSHConfigDict()
    address = host.address
    if "hostname" in found and found["hostname"] != host.address:
        address = check_address(
            found["hostname"], host.where, f"{host.name} (HostName in ~/.ssh/config)"
        )
    user = host.ssh.user or raw.ssh.user or found.get("user") or getpass.getuser()
    port = host.ssh.port or raw.ssh.port or found.get("port") or 22
    key = host.ssh.key or raw.ssh.key
    if key is None:
        existing = [
            Path(p).expanduser()
            for p in found.get("identityfile", [])
            if Path(p).expanduser().is_file()
        ]
        key = existing[0] if existing else None
    jump = host.ssh.jump or raw.ssh.jump or found.get("proxyjump")
    policy: HostKeyPolicy = "accept-new" if raw.host_key_policy == "accept-new" else "strict"
    known_hosts = raw.known_hosts or (state_root() / "clusters" / raw.cluster / "known_hosts",)
    settings = SSHSettings(
        user=check_user(user, host.where, f"{host.name}.user"),
        port=check_port(port, host.where, f"{host.name}.port"),
        key=key,
        known_hosts=known_hosts,
        host_key_policy=policy,
        jump=check_jump(jump, host.where, f"{host.name}.jump") if jump and jump != "none" else None,
        connect_timeout=raw.connect_timeout,
    )
    return address, settings


def _node(raw: RawInventory, host: RawHost, role: Role, config: paramiko.SSHConfig | None) -> Node:
    address, settings = _settings(raw, host, config)
    if settings.key is not None:
        check_key_file(settings.key, host.where, f"{host.name}.key")
    return Node(host.name, address, role, settings, dict(host.resources), dict(host.labels))


def _check_unique(nodes: list[tuple[Node, Where]]) -> None:
    head, head_where = nodes[0]
    seen_names: dict[str, Where] = {}
    seen_endpoints: dict[tuple[str, int], Where] = {}
    for node, where in nodes:
        if node.role == "worker" and (
            (node.address == head.address and node.ssh.port == head.ssh.port)
            or node.name == head.name
        ):
            raise where.error(
                node.name,
                f"the head ({head.name}, {head_where}) is also listed as a worker",
                "remove it from the workers: the head runs work too",
            )
        if node.name in seen_names:
            raise where.error(
                node.name,
                f"duplicate node name (also at {seen_names[node.name]})",
                "give each node its own name, or remove the duplicate",
            )
        endpoint = (node.address, node.ssh.port)
        if endpoint in seen_endpoints:
            raise where.error(
                node.name,
                f"duplicate host {node.address}:{node.ssh.port}"
                f" (also at {seen_endpoints[endpoint]})",
                "list each machine once",
            )
        seen_names[node.name] = where
        seen_endpoints[endpoint] = where


def build(raw: RawInventory, config: paramiko.SSHConfig | None) -> Inventory:
    """The validated Inventory."""
    nodes = [(_node(raw, raw.head, "head", config), raw.head.where)]
    nodes += [(_node(raw, w, "worker", config), w.where) for w in raw.workers]
    _check_unique(nodes)
    return Inventory(
        path=raw.path,
        cluster=raw.cluster,
        head=nodes[0][0],
        workers=tuple(n for n, _ in nodes[1:]),
        ports=raw.ports,
        image_lock=raw.image_lock,
        shm_size=raw.shm_size,
        object_store_memory=raw.object_store_memory,
        runtime=raw.runtime,
        ray_python=raw.ray_python,
    )
