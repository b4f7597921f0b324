"""The head's dashboard (and TensorBoard) forwarded to localhost over SSH."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from provisioner.inventory import Inventory
from provisioner.remote import Pool

TENSORBOARD_PORT = 6006


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
    """Forward the head's 127.0.0.1:REMOTE_PORT (default: the dashboard) to a local port.

    Yields the local URL, e.g. "http://127.0.0.1:41234". The dashboard binds 127.0.0.1 on
    the head, so this SSH tunnel is the only way in.
    """
    port = remote_port or inventory.ports.dashboard
    local = local_port or free_local_port()
    with ExitStack() as stack:
        if pool is None:
            pool = stack.enter_context(Pool(inventory))
        session = pool.session(inventory.head)
        stack.enter_context(session.forward(local, "127.0.0.1", port))
        yield f"http://127.0.0.1:{local}"
