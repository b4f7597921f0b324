"""Public-key authentication in OpenSSH's order: the agent's keys, then each key file.

paramiko's own search (`key_filename`, `look_for_keys`) knows other default names than
OpenSSH, and a file it cannot use hides the server's refusal behind "Invalid key". Here
every file is loaded once by its own type, files OpenSSH would not offer either (open
permissions, a passphrase without the agent, a type paramiko cannot sign with) are set
aside with the reason, and a refusal names every key offered.
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko.auth_strategy import (
    AuthFailure,
    AuthResult,
    AuthSource,
    AuthStrategy,
    InMemoryPrivateKey,
    OnDiskPrivateKey,
    SourceResult,
)

from provisioner.inventory.sshconfig import expand_tilde, openssh_default_keys

_LOAD = threading.Lock()  # warnings filters are process-wide: one load at a time changes them
# Each key file read once per process and version of the file (path, device, inode, mtime,
# size): a fan-out's connections all offer the same key, and reading it under _LOAD made
# them wait for each other (a quarter of the doctor's time on 100 nodes).
_LOADED: dict[tuple[Path, int, int, int, int], paramiko.PKey | SetAside] = {}


@dataclass(frozen=True)
class SetAside:
    """A key file that was not offered, why, and what would make it usable."""

    path: Path
    why: str
    fix: str


class KeysRefused(AuthFailure):
    """The server took none of the keys offered (paramiko's AuthFailure, with the files set
    aside)."""

    def __init__(self, result: AuthResult, set_aside: tuple[SetAside, ...]) -> None:
        super().__init__(result)
        self.set_aside = set_aside


def default_key_files() -> tuple[Path, ...]:
    """OpenSSH's default keys (as this machine's `ssh -G` lists them) that exist now."""
    paths = (Path(expand_tilde(f)) for f in openssh_default_keys())
    return tuple(p for p in paths if p.is_file())


def offered_files(key: Path | None, identity_files: tuple[Path, ...] | None) -> tuple[Path, ...]:
    """The key files a connection offers: the resolved ones; for settings not resolved
    through ssh_config, the named key, or else the default keys."""
    if identity_files is not None:
        return identity_files
    return (key,) if key is not None else default_key_files()


def load_key(path: Path) -> paramiko.PKey | SetAside:
    """The private key in `path`, or why OpenSSH would not offer it either."""
    try:
        info = path.stat()
    except OSError as exc:
        return SetAside(path, f"cannot be read ({exc.strerror})", f"check {path}")
    if info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        return SetAside(
            path, f"is open to others ({mode:04o}), so OpenSSH ignores it too", f"chmod 600 {path}"
        )
    version = (path, info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size)
    with _LOAD:
        loaded = _LOADED.get(version)
        if loaded is None:
            loaded = _LOADED[version] = _read_key(path)
    return loaded


def _read_key(path: Path) -> paramiko.PKey | SetAside:
    """The private key in `path`, or why it cannot be used (called under _LOAD)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cryptography's notice on DSA keys
            return paramiko.PKey.from_path(path)
    except TypeError:  # cryptography: "Key is password-protected"
        return SetAside(path, "needs its passphrase", f"add it to your agent: ssh-add {path}")
    except paramiko.pkey.UnknownKeyType as exc:
        kind = getattr(getattr(exc, "key_type", None), "__name__", "unknown")
        return SetAside(
            path,
            f"is of a type paramiko cannot use ({kind})",
            "make an ed25519 key: ssh-keygen -t ed25519",
        )
    except (ValueError, OSError, paramiko.SSHException) as exc:
        return SetAside(path, f"cannot be read as a private key ({exc})", f"check {path}")


class KeyFiles(AuthStrategy):
    """The agent's keys first, then every key file not already in the agent, in order (as
    OpenSSH's pubkey authentication orders them)."""

    def __init__(self, user: str, files: tuple[Path, ...]) -> None:
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.user = user
        self.files = files
        self.set_aside: list[SetAside] = []
        self._agent: paramiko.Agent | None = None

    def get_sources(self) -> Iterator[AuthSource]:
        self._agent = paramiko.Agent()  # no keys without SSH_AUTH_SOCK
        held = self._agent.get_keys()
        for agent_key in held:
            yield InMemoryPrivateKey(self.user, agent_key)
        blobs = {k.asbytes() for k in held}
        for path in self.files:
            loaded = load_key(path)
            if isinstance(loaded, SetAside):
                self.set_aside.append(loaded)
            elif loaded.asbytes() not in blobs:
                yield OnDiskPrivateKey(self.user, "ssh-config", path, loaded)

    def authenticate(self, transport: paramiko.Transport) -> list[SourceResult]:
        try:
            return super().authenticate(transport)
        except AuthFailure as exc:
            raise KeysRefused(exc.result, tuple(self.set_aside)) from None
        finally:
            if self._agent is not None:
                self._agent.close()


def _label(source: object) -> str:
    if isinstance(source, OnDiskPrivateKey):
        return str(source.path)
    if isinstance(source, InMemoryPrivateKey):
        key = source.pkey
        comment = getattr(key, "comment", "")
        return f"the agent's {key.get_name()} key {key.fingerprint}" + (
            f" ({comment})" if comment else ""
        )
    return repr(source)


def refusal(exc: KeysRefused, address: str, port: int, user: str) -> tuple[str, str]:
    """What was offered and refused, and the fix, for `exc` (pure)."""
    tried = [_label(r.source) for r in exc.result]
    aside = "; ".join(f"{s.path} {s.why}" for s in exc.set_aside)
    files = [r.source.path for r in exc.result if isinstance(r.source, OnDiskPrivateKey)]
    if tried:
        message = f"offered {', '.join(tried)}; the server refused each"
    else:
        message = "no key to offer: no agent key, and no key file"
    message += f" (not offered: {aside})" if aside else ""
    if not exc.result and not exc.set_aside:
        names = ", ".join(openssh_default_keys())
        message += f" (looked for the named keys, or OpenSSH's defaults {names})"
    pub = f"{files[0]}.pub" if files else "~/.ssh/id_ed25519.pub"
    fix = (
        f"authorize a key for {user} on {address}: ssh-copy-id -i {pub} -p {port}"
        f" {user}@{address} (or add that .pub line to ~{user}/.ssh/authorized_keys there),"
        " or name the key that is authorized: ssh.key in the inventory, or IdentityFile in"
        " ~/.ssh/config"
    )
    if not files and not exc.set_aside:
        fix = f"make a key (ssh-keygen -t ed25519), then {fix}"
    fix += "".join(f"; {s.fix}" for s in exc.set_aside)
    return message, fix
