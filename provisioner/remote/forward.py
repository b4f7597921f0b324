"""Local port forwarding over an SSH transport (like `ssh -L`)."""

from __future__ import annotations

import select
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import paramiko

from provisioner.errors import RemoteError

_CHUNK = 1 << 16


def _pump(client: socket.socket, channel: paramiko.Channel) -> None:
    try:
        while True:
            waitables: list[socket.socket | paramiko.Channel] = [client, channel]
            readable, _, _ = select.select(waitables, [], [], 1.0)
            if client in readable:
                data = client.recv(_CHUNK)
                if not data:
                    break
                channel.sendall(data)
            if channel in readable:
                data = channel.recv(_CHUNK)
                if not data:
                    break
                client.sendall(data)
    except (OSError, EOFError, paramiko.SSHException):
        pass
    finally:
        channel.close()
        client.close()


def _accept(
    listener: socket.socket,
    transport: paramiko.Transport,
    target: tuple[str, int],
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        try:
            client, peer = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        try:
            channel = transport.open_channel("direct-tcpip", target, peer, timeout=10)
        except (OSError, EOFError, paramiko.SSHException):
            client.close()
            continue
        threading.Thread(target=_pump, args=(client, channel), daemon=True).start()


@contextmanager
def serve_forward(
    transport: paramiko.Transport, local_port: int, remote_host: str, remote_port: int
) -> Iterator[int]:
    """Listen on 127.0.0.1:local_port and forward each connection; yields the bound port."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", local_port))
    except OSError as exc:
        listener.close()
        raise RemoteError(
            "localhost",
            f"cannot listen on 127.0.0.1:{local_port}: {exc.strerror}",
            "choose another local port, or stop what holds it",
            kind="forward",
        ) from None
    listener.listen(16)
    listener.settimeout(0.5)
    stop = threading.Event()
    thread = threading.Thread(
        target=_accept, args=(listener, transport, (remote_host, remote_port), stop), daemon=True
    )
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        with suppress(OSError):
            listener.close()
        thread.join(2)
