"""Write files fetched one by one from the cluster under a local root, safely.

Each name is checked (relative, no `..`), every directory on the way is opened without
following links, the file is created exclusively under a temporary name with mode 0600
and renamed into place only when complete, and what it hashed to is returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from provisioner.errors import OperationError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class UnsafeName(OperationError):
    """A name from the cluster that would leave the results directory."""


def ensure_root(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.is_symlink() or not root.is_dir():
        raise UnsafeName(f"{root} is not a plain directory", f"remove {root} and run again")


def _parts(name: str) -> list[str]:
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeName(f"refused a file named {name!r} from the cluster", "nothing to do")
    return parts


def _open_parent(root: Path, parts: list[str]) -> int:
    """A descriptor of the directory that will hold the last part (made as needed)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        raise UnsafeName(
            f"cannot make the directories of {'/'.join(parts)} under {root} (a link or a file "
            "is in the way)",
            f"remove what is in the way under {root}",
        ) from None
    return fd


def receive_file(
    root: Path, name: str, chunks: Iterable[bytes], expect: tuple[int, str] | None = None
) -> tuple[int, str]:
    """Write `chunks` as root/name (0600); return (size, sha256 hex) of what came. With
    `expect` (size, sha256), a file that does not match is dropped and root/name is left
    as it was."""
    parts = _parts(name)
    parent = _open_parent(root, parts)
    tmp = f".tmp-recv-{secrets.token_hex(4)}"
    digest = hashlib.sha256()
    size = 0
    try:
        fd = os.open(
            tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=parent
        )
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
        except BaseException:
            os.unlink(tmp, dir_fd=parent)
            raise
        if expect is not None and expect != (size, digest.hexdigest()):
            os.unlink(tmp, dir_fd=parent)
        else:
            os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        os.close(parent)
    return size, digest.hexdigest()


def write_file(root: Path, name: str, data: bytes) -> None:
    """Write `data` as root/name, the same safe way."""
    receive_file(root, name, [data])
