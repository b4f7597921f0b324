"""Put files that `provisioner.remote.receive` received into a job's results at home.

Results come home incrementally: each pull receives the new files through a
`receive.Receiver` (the one safe way anything from the cluster lands here: checked
names, no links followed, exclusive creation, 0600, sizes and sha256 computed while
writing) into a fresh staging directory inside the results directory, then moves each
verified file into its place with `rename`, through directory descriptors opened with
`O_NOFOLLOW`, so nothing in the results directory can redirect it. Files this tool writes
itself (the manifest, job.log, attempts.json) go in the same way.
"""

from __future__ import annotations

import os
import secrets
from contextlib import suppress
from pathlib import Path

from provisioner.errors import ReceiveError
from provisioner.remote.receive import check_name

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FIX = "remove what is in the way under the results directory, then run again"


def ensure_root(root: Path) -> None:
    """The results directory, made private if new; refused when it is a link."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.is_symlink() or not root.is_dir():
        raise ReceiveError(f"{root} is not a plain directory", f"remove {root} and run again")


def _open_dirs(root: Path, parts: tuple[str, ...], *, make: bool) -> int:
    """A descriptor of root/parts..., made (0700) as needed; never follows a link."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            if make:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as exc:
        os.close(fd)
        raise ReceiveError(
            f"cannot open {'/'.join(parts)} under {root}: {exc.strerror} (a link or a file "
            "is in the way)",
            _FIX,
        ) from None
    return fd


def place(staging: Path, name: str, root: Path) -> None:
    """Move staging/name (received there) to root/name, replacing an older copy."""
    parts = check_name(name)
    src = _open_dirs(staging, parts[:-1], make=False)
    try:
        dst = _open_dirs(root, parts[:-1], make=True)
        try:
            os.rename(parts[-1], parts[-1], src_dir_fd=src, dst_dir_fd=dst)
        except OSError as exc:
            raise ReceiveError(f"cannot put {name} in {root}: {exc.strerror}", _FIX) from None
        finally:
            os.close(dst)
    finally:
        os.close(src)


def write_file(root: Path, name: str, data: bytes) -> None:
    """Write `data` as root/name (0600): exclusive creation under a temporary name in the
    same directory, then one rename."""
    parts = check_name(name)
    parent = _open_dirs(root, parts[:-1], make=True)
    tmp = f".tmp-write-{secrets.token_hex(4)}"
    try:
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=parent,
        )
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        os.close(parent)
