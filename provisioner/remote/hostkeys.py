"""Host key verification: ~/.ssh/known_hosts plus the project's; never silently accepted."""

from __future__ import annotations

import threading
from pathlib import Path

import paramiko

from provisioner.errors import ConnectError

_record_lock = threading.Lock()


def host_key_name(address: str, port: int) -> str:
    """How known_hosts names a host: `addr`, or `[addr]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def user_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def load_known_hosts(client: paramiko.SSHClient, files: tuple[Path, ...]) -> None:
    """Teach the client every key in ~/.ssh/known_hosts and the project files."""
    for path in (user_known_hosts(), *files):
        if path.is_file():
            try:
                client.load_system_host_keys(str(path))
            except (OSError, paramiko.SSHException) as exc:
                raise ConnectError(
                    str(path),
                    f"cannot read known_hosts: {exc}",
                    f"fix or remove {path}",
                    kind="hostkey-file",
                ) from None


def file_holding(name: str, files: tuple[Path, ...]) -> Path:
    """The known_hosts file that holds a key for `name` (for the ssh-keygen -R fix)."""
    for path in (user_known_hosts(), *files):
        if path.is_file():
            try:
                keys = paramiko.HostKeys(str(path))
            except (OSError, paramiko.SSHException):
                continue
            if keys.lookup(name) is not None:
                return path
    return files[0] if files else user_known_hosts()


def record(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append an accepted key to the project's known_hosts (trust on first use)."""
    with _record_lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="ascii") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown keys: refused (strict) or recorded (accept-new)."""

    def __init__(self, host: str, accept_new: bool, record_to: Path | None) -> None:
        self.host = host
        self.accept_new = accept_new
        self.record_to = record_to

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if self.accept_new and self.record_to is not None:
            record(self.record_to, hostname, key)
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        fingerprint = key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()[:32]
        raise ConnectError(
            self.host,
            f"host key of {hostname} is unknown ({key.get_name()} {fingerprint});"
            " refusing to connect",
            "check the fingerprint with the machine's owner, then add it: "
            f"ssh-keyscan -p {_port(hostname)} {_address(hostname)}"
            f" >> {self.record_to or user_known_hosts()}"
            " (or set ssh.host_key_policy: accept-new to trust on first use)",
            kind="hostkey-unknown",
        )


def _address(name: str) -> str:
    return name[1:].split("]")[0] if name.startswith("[") else name


def _port(name: str) -> str:
    return name.rsplit(":", 1)[1] if name.startswith("[") else "22"
