"""This machine, the control machine: where provisioner keeps its state, its Docker engine
and the tools it runs. Neutral ground for the library and the lab alike."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, PrerequisiteError

if TYPE_CHECKING:
    import docker


def state_root() -> Path:
    """Where provisioner keeps state: $PROVISIONER_STATE_DIR, else $XDG_STATE_HOME/provisioner,
    else ~/.local/state/provisioner."""
    env = os.environ.get("PROVISIONER_STATE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser().resolve() / "provisioner"


def private_dir(path: Path) -> Path:
    """Make `path` and its missing parents; the folders from the state root down to `path`
    are 0700 (the state holds tokens, accepted host keys and collected logs). Folders
    outside the state root (a user's `-o DIR`) keep their modes. A folder that cannot be
    made (read-only, full, no permission) is an InputError naming it and the fix."""
    root = state_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
        for folder in (path, *path.parents):
            if folder == root or root in folder.parents:
                folder.chmod(0o700)
    except OSError as exc:
        raise path_error(exc, path, "make this folder", state=_in_state(path)) from None
    return path


def _in_state(path: Path) -> bool:
    root = state_root()
    absolute = Path(os.path.abspath(path))
    return absolute == root or root in absolute.parents


def path_error(
    exc: OSError,
    path: Path,
    doing: str,
    *,
    state: bool = False,
    after: str = "nothing was written",
    folder: Path | None = None,
) -> InputError:
    """Pure: what to tell a user whose file or folder `path` could not be written (`doing`:
    "write this file", "make this folder"): what happened, where, and the fix; `state`: the
    path is in provisioner's state directory (the fix is then PROVISIONER_STATE_DIR);
    `after`: what was left; `folder`: where the space or the permission lacks (default: the
    path's own folder)."""
    folder = folder or path.parent
    elsewhere = (
        "set PROVISIONER_STATE_DIR to a folder you can write to"
        if state
        else "name another path, on a filesystem you can write to"
    )
    code = exc.errno
    if code == errno.ENOENT:
        what = f"cannot {doing}: the folder {folder} does not exist"
        fix = f"create it first (`mkdir -p {folder}`), or name a path in a folder that exists"
    elif code in (errno.EACCES, errno.EPERM):
        what = f"cannot {doing}: permission denied in {folder}"
        fix = elsewhere
    elif code == errno.EROFS:
        what = f"cannot {doing}: the filesystem is read-only"
        fix = elsewhere
    elif code in (errno.ENOSPC, errno.EDQUOT):
        what = f"cannot {doing}: no space left on its filesystem"
        fix = f"free space there (`df -h {folder}`), or {elsewhere}"
    elif code == errno.EISDIR:
        what = f"cannot {doing}: it is a folder"
        fix = "name a file, not a folder"
    elif code in (errno.ENOTDIR, errno.EEXIST):
        what = f"cannot {doing}: a part of its path is a file, not a folder"
        fix = "name a path whose folders are folders"
    else:
        what = f"cannot {doing}: {exc.strerror or exc}"
        fix = elsewhere
    return InputError(f"{what}; {after}", fix, where=str(path))


def write_output(path: Path, data: str | bytes, *, mode: int | None = None) -> Path:
    """Write a file the user named (`-o FILE`) whole or not at all: into a temporary file in
    the same folder, flushed to disk, then renamed over `path` (an interrupt, a full disk or
    a crash leaves the old file or none, never half of one). `mode`: the file's mode (default:
    0666 less the umask, as a plain write). Any OSError is an InputError naming the path and
    the fix, with nothing left behind."""
    body = data.encode() if isinstance(data, str) else data
    if mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    temporary: str | None = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(handle, "wb") as f:
            f.write(body)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(temporary, path)
        temporary = None
    except OSError as exc:
        raise path_error(exc, path, "write this file") from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
    return path


@cache
def docker_client() -> docker.DockerClient:
    """A docker SDK client for the local engine, or a PrerequisiteError saying how to start one.
    The SDK is imported here, not with this module: most commands never talk to the local
    engine, and it costs every command's start a fifth of a second."""
    import docker
    from docker.errors import DockerException

    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except DockerException as exc:
        raise engine_error(str(exc), exc.__class__.__name__) from exc
    return c


def engine_error(message: str, kind: str = "DockerException") -> PrerequisiteError:
    """Pure: what to tell a user whose Docker engine did not answer: a socket that refuses
    this user (not in the docker group) is not an engine to install."""
    if "Permission denied" in message:
        return PrerequisiteError(
            "Docker's socket refused this user (permission denied): not in the docker group",
            "add yourself to the docker group (`sudo usermod -aG docker $USER`), then log in "
            "again (or `newgrp docker`)",
        )
    return PrerequisiteError(
        f"no Docker engine answers on this machine ({kind})",
        "install docker.io and start it: `apt-get install -y docker.io` then "
        "`dockerd >/var/log/dockerd.log 2>&1 &` (or `systemctl start docker`)",
    )


def need(tool: str, package: str) -> str:
    """Path of a tool this machine needs, or a PrerequisiteError naming the package."""
    path = shutil.which(tool)
    if path is None:
        raise PrerequisiteError(
            f"`{tool}` is not installed on this machine", f"apt-get install -y {package}"
        )
    return path


_in_process = threading.RLock()  # held by the builder thread, so re-entrant
_depth = 0  # nesting of build_lock() in the thread that holds _in_process


@contextmanager
def build_lock(report: Reporter = quiet) -> Iterator[None]:
    """One image builder at a time on this machine: `image build` and the lab's node
    images share the wheelhouse and the build cache, so two builds started together (two
    terminals, two `lab up`s, two test sessions) wait for each other instead of both
    running debootstrap or writing the same wheel; the waiting one says so. Re-entrant."""
    global _depth
    with _in_process, ExitStack() as stack:
        if _depth == 0:
            path = state_root() / "images.lock"
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = stack.enter_context(path.open("a"))
            try:  # released when the file closes
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                report(f"waiting for another image build on this machine to end ({path})")
                fcntl.flock(handle, fcntl.LOCK_EX)
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
