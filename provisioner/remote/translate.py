"""Socket and paramiko errors -> ConnectError with a diagnosis and a fix."""

from __future__ import annotations

import errno
import shlex
import socket
from pathlib import Path

import paramiko

from provisioner.errors import ConnectError, ProvisionerError, RemoteError
from provisioner.remote.auth import KeysRefused, refusal
from provisioner.remote.hostkeys import file_holding, host_key_name

# Exceptions the connection step can raise, for `except` clauses.
CONNECT_ERRORS = (OSError, EOFError, paramiko.SSHException, ValueError)


def _target(address: str, port: int, user: str) -> str:
    return f"{user}@{address}:{port}"


def _auth_fix(address: str, port: int, user: str, keys: tuple[Path, ...]) -> str:
    tried = f"the agent's keys and {', '.join(map(str, keys))}" if keys else "the agent's keys"
    keyarg = f"-i {keys[0]}.pub " if keys else ""
    return (
        f"tried {tried} for user {user}; check the user name, and that the public key is in "
        f"~{user}/.ssh/authorized_keys on {address}"
        f" (ssh-copy-id {keyarg}-p {port} {user}@{address})"
    )


def interrupted(exc: KeysRefused) -> str | None:
    """Why authentication stopped, when it was not the server refusing the keys: paramiko
    records each key's outcome, and a timeout or a dropped transport is not a refusal (pure)."""
    for outcome in exc.result:
        reason = outcome.result
        if not isinstance(reason, Exception):
            continue
        text = str(reason) or type(reason).__name__
        # paramiko's words when no answer came or the transport went away mid-way
        cut = any(w in text.lower() for w in ("timeout", "transport shut down", "eof"))
        if cut or not isinstance(reason, paramiko.AuthenticationException):
            return text
    return None


def translate(
    exc: BaseException,
    *,
    host: str,
    address: str,
    port: int,
    user: str,
    keys: tuple[Path, ...],
    known_hosts: tuple[Path, ...],
    timeout: float,
) -> ProvisionerError:
    """The domain error for a low-level one raised while connecting to `host`."""
    target = _target(address, port, user)
    if isinstance(exc, ProvisionerError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        names = [str(getattr(exc, "hostname", "")), host_key_name(address, port)]
        name = next((n for n in names if n and file_holding(n, known_hosts, strict=True)), names[1])
        path = file_holding(name, known_hosts)
        return ConnectError(
            host,
            f"host key of {name} has CHANGED (now {exc.key.get_name()} {exc.key.fingerprint}); "
            "this can be a reinstalled machine or a man in the middle; nothing was run",
            "ask the machine's owner whether its keys were regenerated; if so: "
            f"ssh-keygen -f {shlex.quote(str(path))} -R {shlex.quote(name)} and connect again",
            kind="hostkey-changed",
        )
    if isinstance(exc, KeysRefused) and (lost := interrupted(exc)) is not None:
        return ConnectError(
            host,
            f"{target} did not finish authenticating within {timeout:g}s: {lost}",
            "sshd on that machine is overloaded or the link dropped; try again, or raise"
            " ssh.connect_timeout for slow machines",
            kind="auth-timeout",
        )
    if isinstance(exc, KeysRefused):
        said, fix = refusal(exc, address, port, user)
        return ConnectError(host, f"authentication failed for {target}: {said}", fix, kind="auth")
    if isinstance(exc, paramiko.AuthenticationException):
        return ConnectError(
            host,
            f"authentication failed for {target}",
            _auth_fix(address, port, user, keys),
            kind="auth",
        )
    if isinstance(exc, socket.gaierror):
        return ConnectError(
            host,
            f"cannot resolve the name {address!r} ({exc.strerror})",
            "check the spelling, your DNS, or write the IP address in the inventory",
            kind="dns",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        codes = {e.errno for e in exc.errors.values() if isinstance(e, OSError)}
        if codes <= {errno.ECONNREFUSED}:
            return _refused(host, target, port)
        return _unreachable(host, target)
    if isinstance(exc, ConnectionRefusedError):
        return _refused(host, target, port)
    if isinstance(exc, TimeoutError | socket.timeout):
        return ConnectError(
            host,
            f"timed out after {timeout:g}s connecting to {target}",
            "check the machine is on and the address is right, and that no firewall drops port "
            f"{port}; raise ssh.connect_timeout for slow links",
            kind="timeout",
        )
    if isinstance(exc, OSError) and exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return _unreachable(host, target)
    text = str(exc)
    if "banner" in text.lower() or "no existing session" in text.lower():
        return ConnectError(
            host,
            f"{target} accepted the connection but its SSH banner and handshake did not come"
            f" within {timeout:g}s",
            "sshd on that machine is hung or overloaded (or the port is not SSH):"
            " check it on the console",
            kind="banner-timeout",
        )
    if isinstance(exc, EOFError | paramiko.SSHException | OSError):
        return ConnectError(
            host,
            f"SSH to {target} failed: {text or type(exc).__name__}",
            "run `ssh -v` to that host to see where it stops",
            kind="ssh",
        )
    return RemoteError(
        host, f"unexpected {type(exc).__name__}: {exc}", "please report this", kind="internal"
    )


def _refused(host: str, target: str, port: int) -> ConnectError:
    return ConnectError(
        host,
        f"connection refused by {target}",
        f"sshd is not running or listens on another port than {port}; start it or fix ssh.port",
        kind="refused",
    )


def _unreachable(host: str, target: str) -> ConnectError:
    return ConnectError(
        host,
        f"no route to {target}",
        "check the address, the network between here and the machine, and its firewall",
        kind="unreachable",
    )
