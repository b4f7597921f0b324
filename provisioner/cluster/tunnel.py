"""The head's dashboard (and TensorBoard) forwarded to localhost over SSH.

The token goes to whatever listens where the dashboard is expected, so before a tunnel
to the dashboard is handed out, the head is asked (over the same SSH connection) who owns
the socket listening on that port: the kernel's socket tables (`/proc/net/tcp`,
`/proc/net/tcp6`) give every listening socket's owner uid to any user. The listener must
be owned by root or by the SSH user: the only parties that can already read the cluster's
token on the head (its file there is the SSH user's, mode 0600; the Ray container runs as
root). Another user's process on that port is refused by uid before a byte is sent
(`NotThisCluster`), and so is a port nothing listens on (another user could take it
between this check and the first request). Ray's unauthenticated endpoints
(`/api/authentication_mode`, `/api/healthz`) say only what any server can echo, and Ray
has no challenge its dashboard answers with the token, so neither proves the listener.

What is left open: the listener may change in the moment between the check and the
request, which needs this cluster's own dashboard to stop in that moment (while it
listens, no other user can bind the port: Linux refuses a second listener on it, and
`SO_REUSEPORT` shares a port only between sockets of one uid).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import OperationError
from provisioner.inventory import Inventory, RayPorts
from provisioner.remote import Pool
from provisioner.remote.session import Session

TENSORBOARD_PORT = 6006  # TensorBoard's own default: the port for Ray's default layout
TENSORBOARD_OFFSET = 9  # in a port block: after the metrics export port (+8), before workers
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


def tensorboard_port(ports: RayPorts) -> int:
    """The head's TensorBoard port: inside the cluster's block when the inventory gives one
    (`ray: {port_base: N}`: N+9), TensorBoard's own 6006 with Ray's default ports."""
    try:
        block = RayPorts.from_base(ports.gcs)
    except ValueError:
        return TENSORBOARD_PORT
    return ports.gcs + TENSORBOARD_OFFSET if block == ports else TENSORBOARD_PORT


def listeners_command() -> str:
    """Shell: the caller's uid, then the listening lines of the kernel's TCP socket tables
    (readable by any user; no `ss`, no root)."""
    return f"id -u; grep -h ' {LISTEN_STATE} ' {' '.join(SOCKET_TABLES)} 2>/dev/null; exit 0"


def parse_listeners(text: str) -> list[Listener]:
    """The listening sockets in lines of /proc/net/tcp or /proc/net/tcp6 (others skipped)."""
    found = []
    for line in text.splitlines():
        cols = line.split()
        if len(cols) < 8 or cols[3] != LISTEN_STATE or ":" not in cols[1]:
            continue
        address, _, port = cols[1].partition(":")
        try:
            found.append(Listener(address.upper(), int(port, 16), int(cols[7])))
        except ValueError:
            continue
    return found


def parse_listeners_output(stdout: str) -> tuple[int | None, list[Listener]]:
    """`listeners_command`'s output: the caller's uid (None when unreadable) and listeners."""
    first, _, rest = stdout.partition("\n")
    uid = int(first) if first.strip().isdigit() else None
    return uid, parse_listeners(rest)


def refusal(port: int, own_uid: int, listeners: list[Listener]) -> str | None:
    """Pure: why the listener a connection to 127.0.0.1:`port` reaches is not to be sent
    the token (nothing listens, or a socket there is owned by neither root nor `own_uid`),
    or None when it may be."""
    reached = [x for x in listeners if x.port == port and x.address in REACHES_LOOPBACK]
    if not reached:
        return f"nothing listens on 127.0.0.1:{port}"
    strangers = sorted({x.uid for x in reached} - {0, own_uid})
    if strangers:
        uids = ", ".join(str(u) for u in strangers)
        return f"127.0.0.1:{port} is held by a process of uid {uids}, not root or uid {own_uid}"
    return None


def check_listener(session: Session, port: int, *, required: bool = True) -> None:
    """Refuse (`NotThisCluster`) when the head's 127.0.0.1:`port` is held by another user's
    process; also when nothing listens there and `required` (an OperationError: the
    dashboard is not running)."""
    result = session.run(listeners_command(), timeout=30)
    own_uid, listeners = parse_listeners_output(result.stdout)
    if own_uid is None:
        raise OperationError(
            f"cannot tell who listens on the head's port {port} (`id -u` said nothing)",
            "check that the head's login shell works (`provisioner doctor`)",
            where=session.host,
        )
    why = refusal(port, own_uid, listeners)
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
        f"the token was not sent: {why} (another user's process where this cluster's "
        "dashboard should listen)",
        f"find out who runs it on the head (as root: `ss -ltnp 'sport = :{port}'`) and stop "
        "it, or give this cluster a port block no one else uses (`ray: {port_base: N}` in the "
        "inventory), then `provisioner up`",
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
        check_listener(session, port, required=port == inventory.ports.dashboard)
        stack.enter_context(session.forward(local, "127.0.0.1", port))
        yield f"http://127.0.0.1:{local}"
