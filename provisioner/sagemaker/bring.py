"""Bring home what a local-mode job's containers wrote, through `provisioner.remote.receive`.

A job's code runs as root in its containers, over the folders they mount (the checkpoint
channel, /opt/ml/model, /opt/ml/output), so what it leaves there may be hostile: links to
this machine's files (`failure -> ~/.bashrc`, `model -> ~/.ssh`), FIFOs, devices. Nothing
this machine's code writes is ever in a folder a container can reach: the containers get
private staging folders under the run's state folder, and `Sync` copies what they hold
into the results folder (RESULTS/JOB, which no container mounts), so that:

- the staging folder is walked through directory descriptors (`receive.open_dir`: no link
  followed), and only regular files and directories are listed; links, FIFOs, devices and
  names `receive.check_name` refuses are left where they are (named in `Sync.skipped`);
- each file is opened relative to its folder's descriptor with `O_NOFOLLOW | O_NONBLOCK`,
  checked to be a regular file by its descriptor, and read to the size it was listed with
  at most; one that changed while it was read waits for the next sync;
- it is written by `receive.Receiver` (exclusive creation, private modes, bounded by
  `remote.pull`'s limits and the free space) and moved into place with `Receiver.place`,
  which walks the results folder without following a link.

While the job runs, `Sync.once` is called every `SYNC_S` seconds (checkpoints and metrics
come home as they are written, as with a cluster job); once more after the containers are
gone. `read_bounded` reads one small file (a container's failure reason) the same way.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from provisioner.errors import ReceiveError, TooLargeError
from provisioner.remote.pull import limits, pull_limit
from provisioner.remote.receive import Receiver, check_name, ensure_directory, open_dir

SYNC_S = 3.0
CHUNK = 1 << 20
MAX_DEPTH = 32  # folders below the staging folder that are walked
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Found:
    name: str  # relative, POSIX
    size: int
    mtime_ns: int


class _Changed(Exception):
    """The file is no longer the regular file it was listed as."""


def listing(top: int, skip: Callable[[tuple[str, ...]], bool]) -> tuple[list[Found], list[str]]:
    """Pure of links: the regular files under the directory descriptor `top`, and the names
    left out (a link, a FIFO, a device, a refused name). `skip(parts)`: names not wanted."""
    found: list[Found] = []
    left: list[str] = []

    def walk(fd: int, prefix: tuple[str, ...]) -> None:
        with os.scandir(fd) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                parts = (*prefix, entry.name)
                name = "/".join(parts)
                if skip(parts):
                    continue
                try:
                    check_name(name)
                    st = entry.stat(follow_symlinks=False)
                except (ReceiveError, OSError):
                    left.append(name)
                    continue
                if stat.S_ISDIR(st.st_mode) and len(parts) < MAX_DEPTH:
                    try:
                        child = open_dir(fd, (entry.name,), make=False)
                    except OSError:
                        left.append(name)
                        continue
                    try:
                        walk(child, parts)
                    finally:
                        os.close(child)
                elif stat.S_ISREG(st.st_mode):
                    found.append(Found(name, st.st_size, st.st_mtime_ns))
                else:
                    left.append(name)

    walk(top, ())
    return found, left


def _chunks(top: int, f: Found) -> Iterator[bytes]:
    """The bytes of `f` (at most its listed size), read without following a link; _Changed
    when it is not that regular file any more."""
    parts = tuple(f.name.split("/"))
    try:
        parent = open_dir(top, parts[:-1], make=False)
    except OSError:
        raise _Changed from None
    try:
        fd = os.open(parts[-1], _READ_FLAGS, dir_fd=parent)
    except OSError:
        raise _Changed from None
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb", buffering=0) as src:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            raise _Changed
        left = f.size
        while left > 0:
            data = src.read(min(CHUNK, left))
            if not data:
                raise _Changed  # shrank
            left -= len(data)
            yield data
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
            raise _Changed


@dataclass
class Sync:
    """Copies `source` (a folder a container writes) into `home` (one it never sees), file
    by file, a file again only when its size or mtime changed."""

    source: Path
    home: Path
    what: str
    where: str
    skip: Callable[[tuple[str, ...]], bool] = lambda parts: False
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    skipped: set[str] = field(default_factory=set)  # links, FIFOs, refused names
    refused: list[str] = field(default_factory=list)  # over the limits, or this disk's space
    pending: set[str] = field(default_factory=set)  # changed while read: the next sync

    def once(self) -> list[str]:
        """Bring what is new; the names brought."""
        try:
            top = os.open(self.source, _DIR_FLAGS)
        except OSError:
            return []  # not made (yet), or a link: nothing of it comes
        try:
            files, left = listing(top, self.skip)
            self.skipped.update(left)
            todo = [f for f in files if self.seen.get(f.name) != (f.size, f.mtime_ns)]
            if not todo:
                return []
            ensure_directory(self.home)
            return self._bring(top, todo)
        finally:
            os.close(top)

    def _bring(self, top: int, todo: list[Found]) -> list[str]:
        brought: list[str] = []
        self.pending.clear()
        with Receiver(
            self.home / ".incoming",
            limits=limits(pull_limit()),
            what=self.what,
            where=self.where,
        ) as receiver:
            for f in todo:
                try:
                    receiver.admit(f.name, f.size)
                    got = receiver.add_file(f.name, _chunks(top, f), size=f.size)
                except TooLargeError as exc:
                    self.refused.append(f"{f.name}: {exc.message} (fix: {exc.fix})")
                    self.seen[f.name] = (f.size, f.mtime_ns)
                    continue
                except _Changed:
                    self.pending.add(f.name)
                    continue
                receiver.place(got.name, self.home)
                self.seen[f.name] = (f.size, f.mtime_ns)
                brought.append(f.name)
        return brought


class Background:
    """`sync.once()` every `every` seconds in a thread, until `stop()`; a failure of one
    sync is kept (`error`) and left for the final sync to meet again."""

    def __init__(self, syncs: list[Sync], every: float = SYNC_S) -> None:
        self.syncs = syncs
        self.every = every
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sagemaker-sync", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            for sync in self.syncs:
                try:
                    sync.once()
                except (ReceiveError, OSError) as exc:
                    self.error = exc

    def __enter__(self) -> Background:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def read_bounded(path: Path, limit: int) -> str | None:
    """The first `limit` bytes of the regular file at `path` as text; None when it is absent
    or not a regular file (a link is not followed, a FIFO or a device not read)."""
    try:
        parent = os.open(path.parent, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(path.name, _READ_FLAGS, dir_fd=parent)
    except OSError:
        return None
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb", buffering=0) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(limit).decode(errors="replace")
