"""The head's dashboard (and TensorBoard) forwarded to localhost over SSH.

The token goes to whatever listens where the dashboard is expected, so before a tunnel
to the dashboard is handed out, the head is asked (over the same SSH connection, in one
command) which socket listens on that port and which sockets this cluster's own Ray
processes hold. The kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`, readable
by any user) give the listening socket's inode; the runtime names its own sockets' inodes
(`Runtime.sockets_command`: docker, those of the processes inside the container that
carries this cluster's id label, whose PID namespace holds nothing else; podman, the same
processes read from the node's /proc, where rootless Podman's are the SSH user's; host,
those of the SSH user's processes marked with this cluster's id). The listener must be one of
them: another user's process is refused, and so is root's or the SSH user's own when it
is not this cluster's Ray (`NotThisCluster`), before a byte is sent. This proves the
listener without the token: Ray's unauthenticated endpoints (`/api/authentication_mode`,
`/api/healthz`) say only what any server can echo, and Ray has no challenge its
dashboard answers with the token. A port nothing listens on is refused too (another
user could take it between this check and the first request).

TensorBoard (`cluster.board`, started by `tunnel` where Ray runs: root's in docker's
container, the SSH user's under rootless Podman or in host mode) is never sent the token:
a listener on its port must be root's or the SSH user's.

What is left open: the listener may change in the moment between the check and the
request, which needs this cluster's own dashboard to stop in that moment (while it
listens, no other user can bind the port: Linux refuses a second listener on it, and
`SO_REUSEPORT` shares a port only between sockets of one uid).
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError, OperationError
from provisioner.inventory import Inventory, RayPorts
from provisioner.remote import Pool
from provisioner.remote.session import Session
from provisioner.runtime.protocol import Runtime

LISTEN_STATE = "0A"  # TCP_LISTEN in /proc/net/tcp
# Local addresses (as /proc/net/tcp{,6} write them) of listeners that a connection to
# 127.0.0.1:PORT can reach: 127.0.0.1, 0.0.0.0, :: and ::ffff:127.0.0.1.
REACHES_LOOPBACK = frozenset({"0100007F", "00000000", "0" * 32, "0000000000000000FFFF00000100007F"})
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


class NotThisCluster(OperationError):
    """What listens where this cluster's dashboard should is not this cluster's: the token
    was not sent."""


@dataclass(frozen=True)
class Listener:
    address: str  # hex, as /proc/net/tcp writes it
    port: int
    uid: int
    inode: int = 0  # the socket's inode (0: not read)


@dataclass(frozen=True)
class HeadSockets:
    """What `listeners_command` tells: the caller's uid (None when unreadable), the
    listening sockets, and the inodes of the sockets this cluster's Ray holds (None when
    not asked)."""

    uid: int | None
    listeners: list[Listener]
    ours: frozenset[int] | None = None


def tensorboard_port(ports: RayPorts) -> int:
    """The head's TensorBoard port, inside the cluster's own ports whatever their layout:
    the port after the metrics export port (in a block `ray: {port_base: N}`: N+9; with
    Ray's default ports: 8091, beside the ports provisioner fixes there), or the next one
    up that no Ray port of the cluster takes (`ray.ports` may move single ports)."""
    port = ports.metrics_export + 1
    taken = ports.all_ports()
    while port in taken:
        port += 1
    return port


OURS_MARK = "== this cluster's sockets"


def listeners_command(sockets: str | None = None) -> str:
    """Shell: the caller's uid, then the listening lines of the kernel's TCP socket tables
    (readable by any user; no `ss`, no root); with `sockets` (a runtime's
    `sockets_command`), after a mark line, the inodes of this cluster's own sockets."""
    base = f"id -u; grep -h ' {LISTEN_STATE} ' {' '.join(SOCKET_TABLES)} 2>/dev/null"
    if sockets:
        base += f"; echo {shlex.quote(OURS_MARK)}; ( {sockets} )"
    return base + "; exit 0"


def parse_listeners(text: str) -> list[Listener]:
    """The listening sockets in lines of /proc/net/tcp or /proc/net/tcp6 (others skipped)."""
    found = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[3] != LISTEN_STATE or ":" not in cols[1]:
            continue
        address, _, port = cols[1].partition(":")
        try:
            inode = int(cols[9]) if len(cols) > 9 else 0
            found.append(Listener(address.upper(), int(port, 16), int(cols[7]), inode))
        except ValueError:
            continue
    return found


def parse_listeners_output(stdout: str) -> HeadSockets:
    """`listeners_command`'s output."""
    first, _, rest = stdout.partition("\n")
    uid = int(first) if first.strip().isdigit() else None
    tables, mark, socks = rest.partition(OURS_MARK + "\n")
    ours = frozenset(int(x) for x in socks.split() if x.isdigit()) if mark else None
    return HeadSockets(uid, parse_listeners(tables), ours)


def refusal(
    port: int, own_uid: int, listeners: list[Listener], ours: frozenset[int] | None = None
) -> str | None:
    """Pure: why the listener a connection to 127.0.0.1:`port` reaches is not to be sent
    the token, or None when it may be. Nothing listens; or, given `ours` (the inodes of
    the sockets this cluster's Ray processes hold), a listening socket there that none of
    them holds; or, without `ours` (a service the SSH user runs, like TensorBoard), one
    owned by neither root nor `own_uid`."""
    reached = [x for x in listeners if x.port == port and x.address in REACHES_LOOPBACK]
    if not reached:
        return f"nothing listens on 127.0.0.1:{port}"
    if ours is not None:
        strangers = [x for x in reached if x.inode not in ours]
        if strangers:
            uids = ", ".join(str(u) for u in sorted({x.uid for x in strangers}))
            return (
                f"127.0.0.1:{port} is held by a process of uid {uids} that is not this "
                "cluster's Ray (none of its processes holds that socket)"
            )
        return None
    others = sorted({x.uid for x in reached} - {0, own_uid})
    if others:
        uids = ", ".join(str(u) for u in others)
        return f"127.0.0.1:{port} is held by a process of uid {uids}, not root or uid {own_uid}"
    return None


def check_listener(
    session: Session, port: int, *, sockets: str | None = None, required: bool = True
) -> None:
    """Refuse (`NotThisCluster`) when what listens on the head's 127.0.0.1:`port` is not
    this cluster's: with `sockets` (the runtime's `sockets_command`), a socket that none of
    this cluster's Ray processes holds; without, one of another user. Also when nothing
    listens there and `required` (an OperationError: the dashboard is not running)."""
    result = session.run(listeners_command(sockets), timeout=30)
    seen = parse_listeners_output(result.stdout)
    if seen.uid is None:
        raise OperationError(
            f"cannot tell who listens on the head's port {port} (`id -u` said nothing)",
            "check that the head's login shell works (`provisioner doctor`)",
            where=session.host,
        )
    why = refusal(port, seen.uid, seen.listeners, seen.ours if sockets else None)
    if why is None:
        return
    if why.startswith("nothing listens"):
        if required:
            raise OperationError(
                f"cannot reach Ray's dashboard on the head: {why}",
                "check that the cluster is up (`provisioner status`; `provisioner up` starts it)",
                where=session.host,
            )
        return
    raise NotThisCluster(
        f"the token was not sent: {why} (another process where this cluster's "
        "dashboard should listen)",
        "if the cluster is down, `provisioner up` starts it; else find out who runs it on "
        f"the head (as root: `ss -ltnp 'sport = :{port}'`) and stop it, or give this "
        "cluster a port block no one else uses (`ray: {port_base: N}` in the inventory), "
        "then `provisioner up`",
        where=session.host,
    )


def check_local_listener(url: str, tables: tuple[str, ...] = SOCKET_TABLES) -> None:
    """For a dashboard URL on this machine's 127.0.0.1 (`--address`, e.g. behind
    `provisioner tunnel`): refuse one held by another local user, as `check_listener` does
    on the head. Nothing is checked where the tables are missing (not Linux) or for a URL
    on another host (that host is the user's to trust)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost") or parts.port is None:
        return
    text = ""
    for table in tables:
        try:
            text += Path(table).read_text()
        except OSError:
            continue
    if not text:
        return
    why = refusal(parts.port, os.getuid(), parse_listeners(text))
    if why is not None and not why.startswith("nothing listens"):
        raise NotThisCluster(
            f"the token was not sent to {url}: {why} (another user's process)",
            f"find out who runs it (`ss -ltnp 'sport = :{parts.port}'`); open your own "
            "tunnel (`provisioner tunnel`) and give its URL, or leave out --address",
        )


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def tunnel(
    inventory: Inventory,
    *,
    runtime: Runtime | None = None,
    remote_port: int | None = None,
    local_port: int | None = None,
    pool: Pool | None = None,
) -> Iterator[str]:
    """Forward the head's 127.0.0.1:REMOTE_PORT (default: the dashboard) to a local port,
    once the listener there is checked (`check_listener`): for the dashboard one must
    listen; for another port (TensorBoard) none may, but one that does must be ours.

    Yields the local URL, e.g. "http://127.0.0.1:41234". The dashboard binds 127.0.0.1 on
    the head, so this SSH tunnel is the only way in.
    """
    port = remote_port or inventory.ports.dashboard
    local = local_port or free_local_port()
    with ExitStack() as stack:
        if pool is None:
            pool = stack.enter_context(Pool(inventory))
        session = pool.session(inventory.head)
        dashboard = port == inventory.ports.dashboard
        if dashboard and runtime is None:
            raise InputError(
                "the dashboard's tunnel checks its listener is this cluster's Ray: it needs "
                "the cluster's runtime",
                "pass the command's runtime (`runtime.context.cluster_context`)",
            )
        sockets = runtime.sockets_command() if dashboard and runtime is not None else None
        check_listener(session, port, sockets=sockets, required=dashboard)
        stack.enter_context(session.forward(local, "127.0.0.1", port))
        yield f"http://127.0.0.1:{local}"
