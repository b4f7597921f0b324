"""One SSH connection to one node, reused across the steps of a command."""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import paramiko

from provisioner.errors import ProvisionerError, RemoteError
from provisioner.inventory import Node
from provisioner.remote.auth import KeyFiles, offered_files
from provisioner.remote.forward import serve_forward
from provisioner.remote.hostkeys import VerifyPolicy, host_key_name, jumped_name, load_known_hosts
from provisioner.remote.results import Result
from provisioner.remote.route import hop_targets, open_hop_channel, open_proxy_command
from provisioner.remote.translate import CONNECT_ERRORS, translate

# paramiko logs what ends its transport thread (a banner that never came, a socket closed
# under it when a connect timed out) at ERROR, traceback included, and sets no handler:
# Python's last-resort handler then wrote it on stderr, beside the tool's own error (a hung
# sshd during doctor, status, up). The library never prints: the cause reaches the user as
# the ConnectError/RemoteError `translate` makes of it. An application that configures
# logging still gets paramiko's records (they propagate); the CLI stops them
# (cli/common.py: quiet_background).
logging.getLogger("paramiko").addHandler(logging.NullHandler())


_CHUNK = 1 << 16
_POLL = 1.0  # seconds between checks of a quiet channel; data wakes us at once
# How often a connected transport's thread wakes on a quiet socket (paramiko: every 0.1 s,
# 1,000 wake-ups a second over 100 nodes, each taking the GIL from the work); data and
# close still wake it at once.
_QUIET_WAKE_S = 1.0
# Bytes kept from one command's stdout (and as many from its stderr): a node cannot fill
# this machine's memory. Past the cap the output is drained, its end kept, and a line in
# the middle says how much was left out (Result.dropped counts it).
MAX_OUTPUT = 16 * 1024 * 1024
_KEEP_TAIL = 64 * 1024
# AES-GCM first where both ends have it (OpenSSH since 6.2): one AEAD pass per packet
# instead of AES-CTR and a separate HMAC: about a fifth less of this machine's CPU per
# byte pushed (bench-results/ssh-cpu.json); a server without it gets paramiko's own order.
_GCM_SUFFIX = "-gcm@openssh.com"


def preferred_ciphers(order: tuple[str, ...]) -> tuple[str, ...]:
    """`order` (paramiko's, less what is disabled) with its AES-GCM ciphers moved first,
    in their own order (aes128 before aes256); nothing added, nothing removed."""
    gcm = tuple(c for c in order if c.endswith(_GCM_SUFFIX))
    return gcm + tuple(c for c in order if c not in gcm)


def no_delay(sock: object) -> None:
    """Turn Nagle's algorithm off on a TCP socket (anything else is left as it is).

    paramiko writes each SSH message with a send of its own. With Nagle on, a small
    message waits while an earlier one is unacknowledged, and the peer delays its ACK up
    to 40 ms: opening a channel on a connected session took 44 ms instead of 0.2, and
    every command paid it (scripts/bench_ssh_latency.py)."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Transport(paramiko.Transport):
    """paramiko's transport, answering the server's unsolicited global requests at once.

    OpenSSH's sshd tells its host keys (`hostkeys-00@openssh.com`, no reply wanted) just
    after authentication, then holds its answer to the first channel open (Nagle) until
    that message is acknowledged, and this machine's kernel delays the ACK of a message
    it sends nothing back for: the first command on every new connection waited 40-50 ms.
    An SSH_MSG_IGNORE sent on receipt carries the ACK at once (any server, any OS)."""

    def _parse_global_request(self, m: paramiko.Message) -> None:
        super()._parse_global_request(m)  # type: ignore[misc]
        # Runs on the transport's own thread, the one that starts and ends a key exchange:
        # during one, sending would wait for the exchange this thread must finish, so the
        # ACK is left to the exchange's own messages then.
        if not self.server_mode and self.clear_to_send.is_set():
            with suppress(paramiko.SSHException, OSError, EOFError):
                self.send_ignore(1)


def _transport(sock: object, **kwargs: object) -> paramiko.Transport:
    """SSHClient's transport (its `transport_factory`): Nagle off on its TCP socket before
    the handshake (`no_delay`), unsolicited requests acknowledged at once (`_Transport`),
    AES-GCM preferred."""
    no_delay(sock)
    transport = _Transport(sock, **kwargs)  # type: ignore[arg-type]
    options = transport.get_security_options()
    options.ciphers = preferred_ciphers(tuple(options.ciphers))
    return transport


def _client(
    node: Node, accept_record: Path | None, name: str, alias: tuple[str, str] | None = None
) -> paramiko.SSHClient:
    """A client that knows the trusted keys for `name` (as known_hosts names the host it
    connects to) and verifies by the node's policy."""
    client = paramiko.SSHClient()
    known = load_known_hosts(client, node.ssh.known_hosts, alias=alias, name=name)
    accept = node.ssh.host_key_policy == "accept-new"
    policy = VerifyPolicy(node.name, accept, accept_record, known.revoked)
    client.set_missing_host_key_policy(policy)
    return client


def _open(
    node: Node,
    address: str,
    port: int,
    user: str,
    sock: paramiko.Channel | paramiko.ProxyCommand | None,
    keys: tuple[Path, ...],
    via: str | None = None,
) -> paramiko.SSHClient:
    """Connect to address:port (over `sock` when given). Through jump host `via`, the host
    key is looked up and recorded under `jumped_name`: a key learned that way is never
    trusted for a direct connection; keys trusted for the plain name are still accepted."""
    settings = node.ssh
    record_to = settings.known_hosts[0] if settings.known_hosts else None
    name = jumped_name(address, via) if via else address
    alias = (host_key_name(name, port), host_key_name(address, port)) if via else None
    client = _client(node, record_to, host_key_name(name, port), alias)
    t = settings.connect_timeout
    try:
        client.connect(
            hostname=name,
            port=port,
            username=user,
            auth_strategy=KeyFiles(user, keys),
            look_for_keys=False,
            allow_agent=False,
            timeout=t,
            banner_timeout=t,
            auth_timeout=t,
            channel_timeout=t,
            sock=sock,
            transport_factory=_transport,
        )
    except CONNECT_ERRORS as exc:
        # paramiko's own thread may hold the real cause (e.g. no banner) behind a vaguer one
        transport = client.get_transport()
        inner = getattr(transport, "saved_exception", None) if transport else None
        client.close()
        raise translate(
            inner if isinstance(inner, Exception) else exc,
            host=node.name,
            address=address,
            port=port,
            user=user,
            keys=keys,
            known_hosts=settings.known_hosts,
            timeout=t,
        ) from None
    transport = client.get_transport()
    if transport is not None and isinstance(transport.sock, socket.socket):
        transport.sock.settimeout(_QUIET_WAKE_S)
    return client


class Session:
    """A live SSH connection to `node`. Use Pool to get one; close() when done."""

    def __init__(
        self,
        node: Node,
        client: paramiko.SSHClient,
        hops: list[paramiko.SSHClient] | None = None,
    ) -> None:
        self.node = node
        self._client = client
        self._hops = hops or []
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    @classmethod
    def connect(cls, node: Node) -> Session:
        """Connect through the node's route (ProxyCommand, then each ProxyJump hop), verifying
        the host key of every hop and of the node."""
        hops: list[paramiko.SSHClient] = []
        try:
            sock: paramiko.Channel | paramiko.ProxyCommand | None = open_proxy_command(node)
            route: list[str] = []  # the jump hops passed so far: keys learned behind them
            for hop, (address, port) in hop_targets(node):  # are recorded as such
                via = ",".join(route) or None
                keys = offered_files(hop.key, hop.identity_files)
                client = _open(node, hop.address, hop.port, hop.user, sock, keys, via)
                hops.append(client)
                route.append(f"{hop.user}@{hop.address}:{hop.port}")
                sock = open_hop_channel(node, client, hop, address, port)
            client = _open(
                node,
                node.address,
                node.ssh.port,
                node.ssh.user,
                sock,
                offered_files(node.ssh.key, node.ssh.identity_files),
                ",".join(route) or None,
            )
        except ProvisionerError:
            for hop_client in reversed(hops):
                hop_client.close()
            raise
        return cls(node, client, hops)

    @property
    def host(self) -> str:
        return self.node.name

    def _transport(self) -> paramiko.Transport:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise RemoteError(
                self.host,
                "the SSH connection was closed",
                "run the command again",
                kind="connection-lost",
            )
        return transport

    def run(
        self,
        command: str,
        *,
        timeout: float,
        stdin: bytes | None = None,
        max_output: int = MAX_OUTPUT,
    ) -> Result:
        """Run `command` through the login user's shell; never raises for a non-zero exit.
        At most `max_output` bytes of stdout (and of stderr) are kept."""
        chunks = [stdin] if stdin is not None else None
        return self._execute(command, chunks, None, timeout, max_output)

    def run_streaming_stdin(
        self,
        command: str,
        chunks: Iterable[bytes],
        *,
        on_bytes: Callable[[int], None] | None = None,
        timeout: float,
    ) -> Result:
        """Run `command` feeding `chunks` to its stdin; `on_bytes(total_sent)` after each chunk."""
        return self._execute(command, chunks, on_bytes, timeout, MAX_OUTPUT)

    def _execute(
        self,
        command: str,
        chunks: Iterable[bytes] | None,
        on_bytes: Callable[[int], None] | None,
        timeout: float,
        max_output: int,
    ) -> Result:
        started = time.time()
        deadline = time.monotonic() + timeout
        try:
            channel = self._transport().open_session(timeout=timeout)
            channel.exec_command(command)
        except CONNECT_ERRORS as exc:
            raise self._lost(exc) from None
        sender = _Sender(channel, chunks, on_bytes) if chunks is not None else None
        if sender is None:
            channel.shutdown_write()
        try:
            out, err = _Capped(max_output), _Capped(max_output)
            first = _collect(channel, deadline, out, err)
            if sender is not None:
                sender.join(max(0.0, deadline - time.monotonic()))
                if sender.error is not None and not channel.exit_status_ready():
                    raise self._lost(sender.error)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError
        except TimeoutError:
            channel.close()
            shown = command.splitlines()[0][:100] if command else ""
            raise RemoteError(
                self.host,
                f"command did not finish within {timeout:g}s: {shown}",
                "check the node's load, or retry with a longer timeout",
                kind="command-timeout",
            ) from None
        except CONNECT_ERRORS as exc:
            raise self._lost(exc) from None
        finally:
            channel.close()
        return Result(
            host=self.host,
            command=command,
            stdout=out.value().decode("utf-8", "replace"),
            stderr=err.value().decode("utf-8", "replace"),
            exit_code=channel.exit_status,
            started=started,
            first_byte=first,
            finished=time.time(),
            dropped=out.dropped + err.dropped,
        )

    def stream(self, command: str, *, idle_timeout: float) -> Iterator[bytes]:
        """Run `command` and yield its stdout as it comes; a read that waits more than
        `idle_timeout` seconds, or a non-zero exit, is a RemoteError (kind "read")."""
        try:
            channel = self._transport().open_session(timeout=idle_timeout)
            channel.settimeout(idle_timeout)
            channel.exec_command(command)
            channel.shutdown_write()
        except CONNECT_ERRORS as exc:
            raise self._lost(exc) from None
        shown = command.splitlines()[0][:100] if command else ""
        try:
            while data := channel.recv(1 << 20):
                yield data
            if not channel.status_event.wait(idle_timeout):
                raise TimeoutError
        except TimeoutError:
            raise RemoteError(
                self.host,
                f"no data for {idle_timeout:g}s from: {shown}",
                "check the node's load and network, then run again",
                kind="read",
            ) from None
        except CONNECT_ERRORS as exc:
            raise self._lost(exc) from None
        finally:
            channel.close()
        if channel.exit_status != 0:
            raise RemoteError(
                self.host,
                f"exit {channel.exit_status} from: {shown}",
                "run again (the file may have changed or gone meanwhile)",
                kind="read",
            )

    def _lost(self, exc: BaseException) -> RemoteError:
        return RemoteError(
            self.host,
            f"the SSH connection broke: {exc or type(exc).__name__}",
            "check the node is still up and reachable, then run again",
            kind="connection-lost",
        )

    @contextmanager
    def forward(self, local_port: int, remote_host: str, remote_port: int) -> Iterator[int]:
        """Forward 127.0.0.1:local_port (0: any free port) to remote_host:remote_port as seen
        from the node; yields the local port actually bound."""
        with serve_forward(self._transport(), local_port, remote_host, remote_port) as port:
            yield port

    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is None:
                try:
                    self._sftp = self._client.open_sftp()
                except CONNECT_ERRORS as exc:
                    raise self._lost(exc) from None
            return self._sftp

    def sftp_put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a file to the node (optionally setting its mode, e.g. 0o600 for secrets)."""
        try:
            sftp = self._sftp_client()
            sftp.put(str(local), remote)
            if mode is not None:
                sftp.chmod(remote, mode)
        except CONNECT_ERRORS as exc:
            raise RemoteError(
                self.host,
                f"cannot write {remote}: {exc}",
                "check the node's disk space and sshd (`provisioner doctor -i INVENTORY`), then "
                "run the command again",
                kind="sftp",
            ) from None

    def close(self) -> None:
        with suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self._client.close()
        for hop in reversed(self._hops):
            hop.close()


class _Capped:
    """Output kept up to a cap: the first `limit` bytes and the last 64 KiB."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * _KEEP_TAIL:
                self.dropped += len(self.tail) - _KEEP_TAIL
                del self.tail[:-_KEEP_TAIL]

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        note = f"\n[provisioner: {self.dropped} bytes of output left out (cap {self.limit})]\n"
        return bytes(self.head) + note.encode() + bytes(self.tail)


def _collect(
    channel: paramiko.Channel, deadline: float, out: _Capped, err: _Capped
) -> float | None:
    """Read stdout and stderr until the remote side closes them, or raise TimeoutError;
    return when the first byte came."""
    first: float | None = None
    while True:
        while channel.recv_ready():
            data = channel.recv(_CHUNK)
            if data and first is None:
                first = time.time()
            out.add(data)
        while channel.recv_stderr_ready():
            err.add(channel.recv_stderr(_CHUNK))
        if (
            (channel.eof_received or channel.closed)
            and not channel.recv_ready()
            and not channel.recv_stderr_ready()
        ):
            return first
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        select.select([channel], [], [], min(remaining, _POLL))


class _Sender(threading.Thread):
    """Feeds stdin in the background so output is drained while we send."""

    def __init__(
        self,
        channel: paramiko.Channel,
        chunks: Iterable[bytes],
        on_bytes: Callable[[int], None] | None,
    ) -> None:
        super().__init__(daemon=True)
        self.channel = channel
        self.chunks = chunks
        self.on_bytes = on_bytes
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        sent = 0
        try:
            for chunk in self.chunks:
                # a view: paramiko's sendall slices what is left after each packet of at
                # most 32 KiB, so a bytes chunk would be copied again per packet (1 MiB: 16
                # MiB copied); a view is sliced without copying (paramiko's stubs say bytes;
                # its Message writes any buffer: tests/e2e/test_ssh_cipher.py streams through it)
                self.channel.sendall(memoryview(chunk))  # type: ignore[arg-type]
                sent += len(chunk)
                if self.on_bytes is not None:
                    self.on_bytes(sent)
            self.channel.shutdown_write()
        except (TimeoutError, OSError, EOFError, paramiko.SSHException) as exc:
            self.error = exc
