"""The way to a node: a ProxyCommand, then ProxyJump hops, each hop's channel to the next."""

from __future__ import annotations

import os
import shlex

import paramiko

from provisioner.errors import ConnectError, RemoteError
from provisioner.inventory import Hop, Node
from provisioner.remote.translate import CONNECT_ERRORS


def hops_of(node: Node) -> tuple[Hop, ...]:
    """The node's jump hosts, first first (a bare `jump` text when no hops were resolved)."""
    if node.ssh.hops or not node.ssh.jump:
        return node.ssh.hops
    user, _, rest = node.ssh.jump.rpartition("@")
    host, _, port = rest.partition(":")
    ssh = node.ssh
    return (
        Hop(node.ssh.jump, host, user or ssh.user, int(port or 22), ssh.key, ssh.identity_files),
    )


def hop_targets(node: Node) -> list[tuple[Hop, tuple[str, int]]]:
    """Each hop with the address it opens a channel to: the next hop, the node at the end."""
    hops = hops_of(node)
    if not hops:
        return []
    nexts = [(h.address, h.port) for h in hops[1:]] + [(node.address, node.ssh.port)]
    return list(zip(hops, nexts, strict=True))


def proxy_command_line(command: str) -> str:
    """The command line paramiko runs for a ProxyCommand: through the user's shell with
    `exec`, as OpenSSH runs it (paramiko itself would split it without a shell)."""
    shell = os.environ.get("SHELL") or "/bin/sh"
    return shlex.join([shell, "-c", f"exec {command}"])


def open_proxy_command(node: Node) -> paramiko.ProxyCommand | None:
    if not node.ssh.proxy_command:
        return None
    try:
        return paramiko.ProxyCommand(proxy_command_line(node.ssh.proxy_command))
    except (OSError, paramiko.SSHException) as exc:
        raise ConnectError(
            node.name,
            f"ProxyCommand {node.ssh.proxy_command!r} could not start: {exc}",
            "run the ProxyCommand by hand to see why (ssh -v NODE)",
            kind="proxy",
        ) from None


def open_hop_channel(
    node: Node, client: paramiko.SSHClient, hop: Hop, address: str, port: int
) -> paramiko.Channel:
    """A direct-tcpip channel from `hop` to address:port (the next hop or the node)."""
    try:
        transport = client.get_transport()
        if transport is None:
            raise EOFError("the jump host's connection closed")
        return transport.open_channel(
            "direct-tcpip", (address, port), ("127.0.0.1", 0), timeout=node.ssh.connect_timeout
        )
    except CONNECT_ERRORS as exc:
        client.close()
        raise RemoteError(
            node.name,
            f"jump host {hop.name} ({hop.user}@{hop.address}:{hop.port}) cannot reach"
            f" {address}:{port}: {exc}",
            f"check the address from the jump host (ssh {hop.name} nc -z {address} {port})",
            kind="jump",
        ) from None
