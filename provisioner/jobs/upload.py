"""What `submit` sends to the cluster: the playbook's directory, less obvious secrets.

Ray packs the working_dir itself, honouring `.gitignore`, `.rayignore` and the
runtime_env's `excludes`. Before it does, this module walks the directory with Ray's own
matching (so the list is exactly what Ray will send) and adds to `excludes`:

- files named like secrets (SSH private keys, `.env`, `*.pem`, `.netrc`, cloud
  credentials: SECRET_PATTERNS);
- any other small file that starts like a private key (`-----BEGIN ... PRIVATE KEY`);
- provisioner's state directory (tokens, accepted host keys, lab keys) when it lies
  inside the playbook's directory.

`Upload` says what goes and what was left out; `submit --show-upload` prints it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# gitignore-style patterns, relative to the working_dir (Ray's `excludes` syntax)
SECRET_PATTERNS = (
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ecdsa_sk",
    "id_ed25519",
    "id_ed25519_sk",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    ".env",
    ".env.*",
    ".netrc",
    ".git-credentials",
    ".pgpass",
    ".ssh/",
    ".aws/",
    ".gnupg/",
    ".docker/config.json",
    ".kube/config",
    "auth_token",
)
_KEY_HEAD = b"-----BEGIN "
_SNIFF_BYTES = 64 * 1024  # files larger than this are not read for a key header


@dataclass
class Upload:
    """The working_dir as Ray will send it."""

    directory: Path
    excludes: list[str]  # the runtime_env `excludes` that make it so
    files: list[str] = field(default_factory=list)  # relative paths that go
    size: int = 0  # bytes, before compression
    secrets: list[str] = field(default_factory=list)  # relative paths left out as secrets

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory),
            "files": len(self.files),
            "bytes": self.size,
            "left_out_as_secrets": self.secrets,
            "excludes": self.excludes,
        }


def _sent(directory: Path, excludes: list[str]) -> list[Path]:
    """The files Ray sends for `directory` with `excludes` (its own walk and matching)."""
    from ray._private import ray_constants
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    excludes = [*ray_constants.get_runtime_env_default_excludes(), *excludes]
    found: list[Path] = []

    def handler(path: Path) -> None:
        if path.is_file():
            found.append(path)

    gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    _dir_travel(
        directory,
        [_get_excludes(directory, excludes)],
        handler,
        include_gitignore=gitignore,
        logger=logging.getLogger(__name__),  # Ray's INFO lines about ignore files: not shown
    )
    return sorted(found)


def looks_like_private_key(path: Path) -> bool:
    """A small file whose first line opens a PEM or OpenSSH private key."""
    try:
        if path.is_symlink() or path.stat().st_size > _SNIFF_BYTES:
            return False
        with path.open("rb") as f:
            first = f.readline(200)
    except OSError:
        return False
    return first.startswith(_KEY_HEAD) and b"PRIVATE KEY" in first


def _inside(path: Path, directory: Path) -> str | None:
    try:
        return path.resolve().relative_to(directory.resolve()).as_posix()
    except ValueError:
        return None


def plan_upload(directory: Path, base_excludes: list[str], state_dir: Path) -> Upload:
    """What Ray will send from `directory`: `base_excludes` plus the secrets found."""
    excludes = [*base_excludes, *SECRET_PATTERNS]
    state = _inside(state_dir, directory)
    if state is not None and state != ".":
        excludes.append(f"/{state}/")
    everything = _sent(directory, list(base_excludes))
    kept = _sent(directory, list(excludes))
    keys = [p for p in kept if looks_like_private_key(p)]
    excludes += [f"/{p.relative_to(directory).as_posix()}" for p in keys]
    sent = [p for p in kept if p not in keys]
    upload = Upload(directory, excludes)
    upload.files = [p.relative_to(directory).as_posix() for p in sent]
    upload.size = sum(p.stat().st_size for p in sent)
    going = set(sent)
    upload.secrets = [p.relative_to(directory).as_posix() for p in everything if p not in going]
    return upload


def sendable_files(directory: Path) -> tuple[list[Path], list[str]]:
    """The files under `directory` that may be sent to the cluster as they are (a
    checkpoint for `--resume`), with the same secrets filter as the working_dir, and the
    relative names left out: secrets, and links (never followed: a file is sent only
    when its real path is its path under `directory`)."""
    root = directory.resolve()
    kept = _sent(directory, list(SECRET_PATTERNS))
    going: list[Path] = []
    for path in kept:
        rel = path.relative_to(directory)
        if path.resolve() == root / rel and not looks_like_private_key(path):
            going.append(path)
    every = _sent(directory, [])
    names = {p.relative_to(directory).as_posix() for p in going}
    left = sorted({p.relative_to(directory).as_posix() for p in every} - names)
    return going, left
