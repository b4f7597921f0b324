"""Host key verification: ~/.ssh/known_hosts plus the project's; never silently accepted.

known_hosts is read here, not by paramiko: `@revoked` keys are refused (even under
accept-new), `@cert-authority` lines and lines paramiko cannot parse are passed over,
and keys learned through a jump host are recorded under a name of their own.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hmac
import threading
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from provisioner.errors import ConnectError
from provisioner.local import private_dir

_record_lock = threading.Lock()
# Each known_hosts file parsed once per process and version of the file (path, device,
# inode, mtime, size; a key recorded under accept-new changes it): a fan-out's
# connections all read the same files, and parsing every line into a key for every
# connection cost O(nodes²) on a large cluster.
_parsed: dict[tuple[Path, int, int, int, int], KnownHosts] = {}
_parsed_lock = threading.Lock()


def host_key_name(address: str, port: int) -> str:
    """How known_hosts names a host: `addr`, or `[addr]:port` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def user_known_hosts() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


@dataclass
class KnownHosts:
    """What known_hosts files say: the trusted entries, and the keys marked @revoked."""

    entries: list[HostKeyEntry] = field(default_factory=list)
    revoked: set[tuple[str, str]] = field(default_factory=set)  # (key type, base64)

    def trusted(self) -> list[HostKeyEntry]:
        """The entries whose key is not revoked (a revoked key is never trusted)."""
        if not self.revoked:
            return [e for e in self.entries if e.key is not None]
        return [
            e
            for e in self.entries
            if e.key is not None and (e.key.get_name(), e.key.get_base64()) not in self.revoked
        ]

    def lookup(self, name: str) -> list[paramiko.PKey]:
        """The trusted keys for `name` (plain or hashed entries)."""
        return [e.key for e in self.trusted() if any(_matches(p, name) for p in e.hostnames)]


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        salted = _hashed(pattern)
        return salted is not None and hmac.digest(salted[0], name.encode(), "sha1") == salted[1]
    return pattern == name


@functools.lru_cache(maxsize=65536)
def _hashed(pattern: str) -> tuple[bytes, bytes] | None:
    """A hashed name's salt and HMAC-SHA1 (`|1|SALT|HASH`, as `ssh-keygen -H` writes it),
    decoded once: each connection tests its name against every hashed line, and paramiko's
    `hash_host` decodes and hashes in Python each time (100 connections against 100 hashed
    lines: 52 ms of CPU, now 21). None for a malformed one (it matches nothing)."""
    parts = pattern.split("|")
    if len(parts) != 4 or parts[0] or parts[1] != "1":
        return None
    try:
        salt = base64.b64decode(parts[2], validate=True)
        digest = base64.b64decode(parts[3], validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(salt) != 20 or len(digest) != 20:  # SHA-1's size, OpenSSH's salt
        return None
    return salt, digest


def read_known_hosts(path: Path, into: KnownHosts | None = None) -> KnownHosts:
    """Parse one known_hosts file as OpenSSH reads it: `@revoked` lines revoke their key;
    `@cert-authority` lines are passed over (certificates are not checked here, so such a
    host is unknown and handled by the host key policy); a line paramiko cannot read is
    passed over instead of failing every connection."""
    known = into if into is not None else KnownHosts()
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            fields = line.split()
            if fields[0] == "@revoked" and len(fields) >= 4:
                known.revoked.add((fields[2], fields[3]))
            continue
        try:
            entry = HostKeyEntry.from_line(line)
        except (paramiko.SSHException, InvalidHostKey, ValueError, TypeError):
            continue
        if entry is not None and entry.key is not None:
            known.entries.append(entry)
    return known


def _read_once(path: Path) -> KnownHosts:
    """One file's entries and revocations, parsed once per version of the file."""
    info = path.stat()
    version = (path, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    with _parsed_lock:
        found = _parsed.get(version)
    if found is None:
        found = read_known_hosts(path)
        with _parsed_lock:
            _parsed[version] = found
    return found


def read_all(files: tuple[Path, ...]) -> KnownHosts:
    """~/.ssh/known_hosts and the project's files, together."""
    known = KnownHosts()
    for path in (user_known_hosts(), *files):
        if path.is_file():
            try:
                one = _read_once(path)
                known.entries += one.entries
                known.revoked |= one.revoked
            except OSError as exc:
                raise ConnectError(
                    str(path),
                    f"cannot read known_hosts: {exc}",
                    f"fix or remove {path}",
                    kind="hostkey-file",
                ) from None
    return known


def load_known_hosts(
    client: paramiko.SSHClient,
    files: tuple[Path, ...],
    *,
    alias: tuple[str, str] | None = None,
    name: str | None = None,
) -> KnownHosts:
    """Teach the client every trusted key in ~/.ssh/known_hosts and the project files;
    with `name` (the host key name the client connects to: `host_key_name`), only the
    entries for that name, the only ones paramiko looks up (a connection then costs the
    same however many hosts the files list). `alias` (jumped name, plain name): the keys
    trusted for the plain name are trusted under the jumped name too (see `jumped_name`)."""
    known = read_all(files)
    keys = client.get_host_keys()
    for entry in known.trusted():
        for pattern in entry.hostnames:
            if name is None or _matches(pattern, name):
                keys.add(pattern, entry.key.get_name(), entry.key)
    if alias is not None:
        for key in known.lookup(alias[1]):
            keys.add(alias[0], key.get_name(), key)
    return known


def jumped_name(address: str, jump: str) -> str:
    """The name a host key learned through jump host `jump` is recorded under, so that a
    later direct connection to `address` (which may be another machine) never trusts it."""
    return f"{address}+via+{jump}"


def file_holding(name: str, files: tuple[Path, ...], *, strict: bool = False) -> Path | None:
    """The known_hosts file that holds a key for `name` (for the ssh-keygen -R fix); when
    none does, the project's file (or None if `strict`)."""
    for path in (user_known_hosts(), *files):
        if path.is_file():
            try:
                if read_known_hosts(path).lookup(name):
                    return path
            except OSError:
                continue
    if strict:
        return None
    return files[0] if files else user_known_hosts()


def record(path: Path, name: str, key: paramiko.PKey) -> None:
    """Append an accepted key to the project's known_hosts (trust on first use)."""
    with _record_lock:
        private_dir(path.parent)
        with path.open("a", encoding="ascii") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


class VerifyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown keys: refused (strict) or recorded (accept-new)."""

    def __init__(
        self,
        host: str,
        accept_new: bool,
        record_to: Path | None,
        revoked: set[tuple[str, str]] | None = None,
    ) -> None:
        self.host = host
        self.accept_new = accept_new
        self.record_to = record_to
        self.revoked = revoked or set()

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        if (key.get_name(), key.get_base64()) in self.revoked:
            raise ConnectError(
                self.host,
                f"host key of {hostname} ({key.get_name()}) is marked @revoked in known_hosts;"
                " refusing to connect",
                "the machine's owner revoked that key: ask them for the machine's new key, "
                "and find out why this machine still presents the old one",
                kind="hostkey-revoked",
            )
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
