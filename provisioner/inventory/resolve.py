"""From what the file says to the model: ssh_config (as `ssh -G` reads it) fills gaps;
ProxyJump chains and ProxyCommand are resolved hop by hop; final checks."""

from __future__ import annotations

import getpass
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from provisioner.errors import InventoryError
from provisioner.inventory.fields import Where, check_address, check_port, check_user
from provisioner.inventory.models import (
    Hop,
    HostKeyPolicy,
    Inventory,
    Node,
    Role,
    SSHSettings,
)
from provisioner.inventory.proxies import expand_proxy_command, split_jump
from provisioner.inventory.raw import RawHost, RawInventory
from provisioner.inventory.sshconfig import (
    Resolved,
    check_ssh_args,
    explicit_keys,
    homes,
    identity_paths,
    lookup,
)
from provisioner.local import state_root

MAX_HOPS = 8
RESOLVERS = 32  # nodes whose ssh_config is looked up at once (`ssh -G` processes)


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


class _Resolver:
    """ssh_config look-ups for one inventory (`ssh -G`, or paramiko without OpenSSH)."""

    def __init__(self, config: Path | None, openssh: bool | None) -> None:
        self.config = config
        self.openssh = openssh
        self.home = Path.home()

    def __call__(self, alias: str, args: list[str], where: Where, field: str) -> Resolved:
        bad = check_ssh_args(args)
        if bad is not None:
            raise where.error(
                field,
                f"ssh option {bad!r} cannot be honoured by provisioner",
                "keep to -o Option=value, -J, -p, -l, -i, -F (and flags such as -C);"
                " or put the setting in ~/.ssh/config",
            )
        try:
            resolved = lookup(alias, args, self.config, home=self.home, openssh=self.openssh)
        except Exception as exc:
            if hasattr(exc, "where") and getattr(exc, "where", None) is None:
                exc.where = str(where)
            raise
        if resolved.refused:
            raise where.error(
                field,
                f"ssh_config sets {', '.join(resolved.refused)} for {alias}, which provisioner"
                " cannot honour",
                "remove it for this host (provisioner checks host keys by address and port)",
            )
        return resolved

    def keys(
        self, resolved: Resolved, where: Where, field: str, alias: str
    ) -> tuple[Path | None, tuple[Path, ...]]:
        """The first named key that exists (None when only OpenSSH's defaults are listed), and
        every key file offered, as OpenSSH offers them: the named ones that exist, or else
        the default keys that exist; `alias` is the host as given (%n)."""
        try:
            named = explicit_keys(resolved, alias)
            offered = named or identity_paths(resolved, alias)
        except InventoryError as exc:
            raise where.error(field, exc.message, exc.fix or "fix the path") from None
        existing = tuple(k for k in offered if k.is_file())
        return (existing[0] if named and existing else None), existing


def _explicit_args(raw: RawInventory, host: RawHost) -> list[str]:
    """The inventory's own settings as ssh options (they win over ssh_config)."""
    args: list[str] = []
    port = host.ssh.port or raw.ssh.port
    if port:
        args += ["-o", f"Port={port}"]
    key = host.ssh.key or raw.ssh.key
    if key:
        args += ["-o", f'IdentityFile="{key}"']
    user = host.ssh.user or raw.ssh.user
    if user:
        args += ["-o", f'User="{user}"']
    jump = host.ssh.jump or raw.ssh.jump
    if jump:
        args += ["-J", jump]
    return args


def _hops(
    resolve: _Resolver, jump: str, where: Where, name: str, node_key: Path | None
) -> tuple[tuple[Hop, ...], str | None]:
    """The chain of ProxyJump `jump`, first hop first, each resolved through ssh_config as
    OpenSSH does (the last hop is reached through the ones before it, `-J rest`); and a
    ProxyCommand that opens the first hop's connection, if its config has one. A hop with
    no IdentityFile of its own is offered the node's key, then OpenSSH's default keys
    (OpenSSH would offer only the defaults there; provisioner's `ssh.key` has always
    covered jump hosts)."""
    hops: list[Hop] = []
    proxy_command = None
    pending: str | None = jump
    while pending:
        if len(hops) >= MAX_HOPS:
            raise where.error(
                f"{name}.jump",
                f"more than {MAX_HOPS} jump hosts (a ProxyJump loop?)",
                "fix ProxyJump",
            )
        rest, spec = split_jump(pending)
        hop_user, hop_host, hop_port = spec
        field = f"{name}.jump ({hop_host})"
        check_address(hop_host, where, field)
        args = [*(["-l", check_user(hop_user, where, field)] if hop_user else [])]
        args += ["-p", str(check_port(hop_port, where, field))] if hop_port else []
        args += ["-J", rest] if rest else []
        found = resolve(hop_host, args, where, field)
        key, offered = resolve.keys(found, where, field, hop_host)
        if key is None and node_key is not None:  # the node's key first, then the defaults
            offered = (node_key, *(k for k in offered if k != node_key))
        hop = Hop(
            name=hop_host,
            address=check_address(found.hostname, where, f"{field} HostName"),
            user=check_user(found.user or getpass.getuser(), where, f"{field} User"),
            port=check_port(found.port, where, f"{field} Port"),
            key=key or node_key,
            identity_files=offered,
        )
        hops.insert(0, hop)
        # with `-J rest` the hop's ProxyJump is `rest`; the first hop keeps its own config's
        pending = found.proxy_jump
        if not pending and found.proxy_command:
            proxy_command = expand_proxy_command(found.proxy_command, found, hop_host)
    return tuple(hops), proxy_command


def _settings(raw: RawInventory, host: RawHost, resolve: _Resolver) -> tuple[str, SSHSettings]:
    args = [*host.args_before, *_explicit_args(raw, host), *host.args_after]
    field = f"{host.name} (ssh options)"
    found = resolve(host.address, args, host.args_where or host.where, field)
    address = host.address
    if found.hostname != host.address:
        address = check_address(found.hostname, host.where, f"{host.name} (HostName in ssh_config)")
    named, offered = resolve.keys(found, host.where, f"{host.name}.key", host.address)
    key = host.ssh.key or raw.ssh.key or named
    hops: tuple[Hop, ...] = ()
    proxy_command = None
    if found.proxy_jump:
        hops, proxy_command = _hops(resolve, found.proxy_jump, host.where, host.name, key)
    elif found.proxy_command:
        proxy_command = expand_proxy_command(found.proxy_command, found, host.address)
    policy: HostKeyPolicy = "accept-new" if raw.host_key_policy == "accept-new" else "strict"
    known_hosts = raw.known_hosts or (state_root() / "clusters" / raw.cluster / "known_hosts",)
    known_hosts += _config_known_hosts(found, resolve.home, known_hosts)
    settings = SSHSettings(
        user=check_user(found.user or getpass.getuser(), host.where, f"{host.name}.user"),
        port=check_port(found.port, host.where, f"{host.name}.port"),
        key=key,
        identity_files=offered,
        known_hosts=known_hosts,
        host_key_policy=policy,
        jump=found.proxy_jump,
        connect_timeout=raw.connect_timeout,
        hops=hops,
        proxy_command=proxy_command,
    )
    return address, settings


def _config_known_hosts(found: Resolved, home: Path, already: tuple[Path, ...]) -> tuple[Path, ...]:
    """UserKnownHostsFile files named in ssh_config, besides ~/.ssh/known_hosts (always read)."""
    defaults = {h / ".ssh" / name for h in homes(home) for name in ("known_hosts", "known_hosts2")}
    extra = []
    for name in found.known_hosts:
        path = Path(os.path.expanduser(name))
        if path not in defaults and path not in already and path not in extra:
            extra.append(path)
    return tuple(extra)


def _node(raw: RawInventory, host: RawHost, role: Role, resolve: _Resolver) -> Node:
    address, settings = _settings(raw, host, resolve)
    if settings.key is not None and (host.ssh.key or raw.ssh.key):
        given = host.ssh if host.ssh.key else raw.ssh  # the line and field that name it
        check_key_file(
            settings.key, given.key_at or host.where, given.key_field or f"{host.name}.key"
        )
    data_address = host.data_address if host.data_address != address else None
    return Node(
        host.name,
        address,
        role,
        settings,
        dict(host.resources),
        dict(host.labels),
        host.gpus,
        data_address,
    )


def _check_unique(nodes: list[tuple[Node, Where]]) -> None:
    head, head_where = nodes[0]
    seen_names: dict[str, Where] = {}
    seen_endpoints: dict[tuple[str, int, tuple[Hop, ...]], Where] = {}
    # Ray addresses a `ray.address` names (nodes without one may share a machine's address)
    seen_rays: dict[str, tuple[str, Where, bool]] = {}
    for node, where in nodes:
        other, other_where, named = seen_rays.get(node.ray_address, ("", where, False))
        if other and (named or node.data_address is not None):
            raise where.error(
                f"{node.name}.ray.address",
                f"{node.ray_address} is also {other}'s Ray address (at {other_where})",
                "give each node the address it has on the network that carries Ray's traffic",
            )
        if node.role == "worker" and (
            (
                node.address == head.address
                and node.ssh.port == head.ssh.port
                and node.ssh.hops == head.ssh.hops
            )
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
        endpoint = (node.address, node.ssh.port, node.ssh.hops)
        if endpoint in seen_endpoints:
            raise where.error(
                node.name,
                f"duplicate host {node.address}:{node.ssh.port}"
                f" (also at {seen_endpoints[endpoint]})",
                "list each machine once",
            )
        seen_names[node.name] = where
        seen_endpoints[endpoint] = where
        seen_rays.setdefault(node.ray_address, (node.name, where, node.data_address is not None))


def build(raw: RawInventory, config: Path | None, *, openssh: bool | None = None) -> Inventory:
    """The validated Inventory."""
    resolve = _Resolver(config, openssh)
    if raw.slurm is not None:
        login = _node(raw, raw.head, "login", resolve)
        return Inventory(
            path=raw.path,
            cluster=raw.cluster,
            head=login,
            workers=(),
            ports=raw.ports,
            shm_size=raw.shm_size,
            object_store_memory=raw.object_store_memory,
            runtime=raw.runtime,
            runtime_where=raw.runtime_where,
            runtime_field=raw.runtime_field,
            ray_python=raw.ray_python,
            tls=raw.tls,
            price_per_node_hour=raw.price_per_node_hour,
            storage=raw.storage,
            storage_path=raw.storage_path,
            ray_subnet=raw.ray_subnet,
            ray_subnet_where=raw.ray_subnet_where,
            slurm=raw.slurm,
            login=login,
            allocated=False,
        )
    hosts: list[tuple[RawHost, Role]] = [(raw.head, "head"), *((w, "worker") for w in raw.workers)]
    if len(hosts) <= 2:
        built = [_node(raw, host, role, resolve) for host, role in hosts]
    else:  # each node's `ssh -G` is a process of its own: asked side by side (the first
        # node's error in the file's order is the one raised, as one by one)
        with ThreadPoolExecutor(min(RESOLVERS, len(hosts))) as pool:
            built = list(pool.map(lambda hr: _node(raw, hr[0], hr[1], resolve), hosts))
    nodes = [(node, host.where) for node, (host, _) in zip(built, hosts, strict=True)]
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
        runtime_where=raw.runtime_where,
        runtime_field=raw.runtime_field,
        ray_python=raw.ray_python,
        tls=raw.tls,
        price_per_node_hour=raw.price_per_node_hour,
        ray_subnet=raw.ray_subnet,
        ray_subnet_where=raw.ray_subnet_where,
        storage=raw.storage,
        storage_path=raw.storage_path,
    )
