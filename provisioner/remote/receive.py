"""Receive files from the cluster: the one way anything a node or a job sends lands here.

A node may be compromised and a job's code may be hostile, so everything that comes
home (collected logs, a job's results, files fetched one by one) goes through this
module, which holds these rules whatever the transport:

- only regular files and directories: links, hard links, devices, FIFOs are refused;
- names are relative, without `..`, control characters or undecodable bytes;
- tar headers that describe the next member (pax, GNU long names) bounded in size, total
  and depth before Python's tar reader parses them, tightly where that reader has
  CVE-2024-6232 (quadratic-time parsing of pax headers before 3.11.10 / 3.12.6);
- bounded: member count, bytes per file, total bytes, and compressed bytes read; a file
  whose sender declared its size is read to that size and no further (one that grows
  past it is refused), and refused before a byte is written when it is over a cap or
  more than the space free here (leaving `Limits.reserve_bytes` free);
- written by this code (never `tarfile.extractall`) into a fresh directory made with
  exclusive creation next to the destination, through directory descriptors with
  `O_NOFOLLOW` and files with `O_CREAT | O_EXCL`, so nothing can redirect a write;
- private modes (directories 0700, files 0600), whatever the archive says;
- moved into place with one rename when complete; on any refusal the fresh directory
  is removed and nothing is left at the destination.

API:

- `Limits(members, file_bytes, total_bytes, compressed_bytes)`: the bounds.
- `receive_tar(source, destination, *, limits, what, where, gzipped=True) -> Received`:
  a tar (gzip by default) given as bytes or a binary stream, unpacked into
  `destination`, which must not exist yet (or be an empty directory).
- `Receiver(destination, *, limits, what, where)`: for transports that fetch file by
  file (SFTP, rsync-like): `add_directory(name)`, `add_file(name, chunks) ->
  ReceivedFile` (size and sha256 computed while writing), then `commit() -> Received`;
  as a context manager it removes everything unless committed.
- `check_name(name) -> tuple[str, ...]`: the safe parts of a relative name, or ReceiveError.
- Into a directory that is kept and filled again (a job's results, brought home
  incrementally by `provisioner.remote.pull`): `ensure_directory(root)`,
  `Receiver.place(name, root)` (one received file moved into root/name, replacing an older
  copy), `write_file(root, name, data)` (a file this tool writes itself: a manifest, a log).
  Each walks root's folders with `open_dir`, the one descriptor walk of this module.

Every refusal is a `ReceiveError` (provisioner/errors.py) naming what, where and a fix.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import io
import os
import secrets
import shutil
import sys
import tarfile
import tempfile
import zlib
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from provisioner.errors import ReceiveError, TooLargeError

MiB = 1024 * 1024
_CHUNK = 1 << 16
_NAME_BYTES = 4096  # longest relative name accepted (Linux PATH_MAX)
_PART_BYTES = 255  # longest single name component (Linux NAME_MAX)
_HEADER_ALLOWANCE = 4 * 512  # tar headers, long-name and pax records, padding, per member
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
HOSTILE_FIX = (
    "nothing was written; find out what on {where} produced it (a hostile job, or a "
    "compromised node) before trusting what it sends"
)
SIZE_FIX = "nothing was written; make {where} send less (fewer or smaller files)"


@dataclass(frozen=True)
class Limits:
    """Bounds on what one transfer may bring home."""

    members: int = 10_000
    file_bytes: int = 256 * MiB
    total_bytes: int = 512 * MiB
    compressed_bytes: int = 256 * MiB
    reserve_bytes: int = 256 * MiB  # left free on the local disk, whatever comes


@dataclass(frozen=True)
class ReceivedFile:
    name: str  # relative, as sent
    size: int
    sha256: str


@dataclass
class Received:
    """What landed: the destination and the files in it (in the order they came)."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    total_bytes: int = 0


def check_name(name: str, *, what: str = "a file", where: str = "the cluster") -> tuple[str, ...]:
    """The components of a safe relative name (`.` parts dropped); refuses the rest."""

    def refuse(why: str) -> ReceiveError:
        return ReceiveError(
            f"refused {what}: the name {name!r} {why}",
            HOSTILE_FIX.format(where=where),
            where=where,
        )

    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise refuse("is not valid UTF-8")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise refuse("holds control characters")
    if name.startswith("/"):
        raise refuse("is absolute")
    if len(name.encode()) > _NAME_BYTES:
        raise refuse(f"is longer than {_NAME_BYTES} bytes")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise refuse("climbs out with `..`")
    if any(len(p.encode()) > _PART_BYTES for p in parts):
        raise refuse(f"has a component longer than {_PART_BYTES} bytes")
    return parts


class Receiver:
    """A fresh private directory beside `destination`, filled file by file, then moved
    into place by `commit()`. Without a commit (a refusal, an exception) it is removed."""

    def __init__(
        self, destination: Path, *, limits: Limits, what: str, where: str, size_fix: str = ""
    ) -> None:
        self.destination = Path(os.path.abspath(destination))
        self.size_fix = size_fix  # the fix named when something is over a limit
        self.limits = limits
        self.what = what
        self.where = where
        self.members = 0
        self.total = 0
        self._names: list[tuple[str, ...]] = []
        self.destination.parent.mkdir(parents=True, exist_ok=True)
        self.staging = Path(
            tempfile.mkdtemp(prefix=".receiving-", dir=self.destination.parent)
        )  # mkdtemp: exclusive creation, mode 0700
        self._root: int | None = os.open(self.staging, _DIR_FLAGS)
        os.fchmod(self._root, 0o700)

    # -- errors -------------------------------------------------------------------
    def refuse(self, why: str, *, size: bool = False, fix: str = "") -> ReceiveError:
        fix = fix or (self.size_fix if size else "") or (SIZE_FIX if size else HOSTILE_FIX)
        fix = fix.format(where=self.where)
        kind = TooLargeError if size else ReceiveError
        return kind(f"refused {self.what}: {why}", fix, where=self.where)

    def admit(self, name: str, size: int) -> None:
        """Refuse `name` now (TooLargeError) when a file of `size` bytes could not be
        received: over a limit, or more than the free space; nothing is counted."""
        self._check_size(name, size, 0, declared=size)
        self.check_space(name, size)

    def check_space(self, name: str, size: int) -> None:
        """Refuse `name` (declared `size` bytes) when writing it would leave less than
        `limits.reserve_bytes` free on the local disk."""
        disk = os.statvfs(self.staging)
        free = disk.f_bavail * disk.f_frsize
        if size + self.limits.reserve_bytes > free:
            raise self.refuse(
                f"{name!r} is {size} bytes and only {free} bytes are free under "
                f"{self.destination.parent} (keeping {self.limits.reserve_bytes} free)",
                size=True,
                fix=f"free space under {self.destination.parent} (or bring results home "
                "elsewhere with --results DIR), then run again",
            )

    def _os_error(self, name: str, exc: OSError) -> ReceiveError:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return ReceiveError(
                f"cannot write {self.what} ({name}): {exc.strerror}",
                f"free space under {self.destination.parent}, then run again",
                where=self.where,
            )
        return self.refuse(f"{name!r} cannot be written ({exc.strerror})")

    # -- writing ------------------------------------------------------------------
    def _count(self) -> None:
        self.members += 1
        if self.members > self.limits.members:
            raise self.refuse(f"more than {self.limits.members} files and directories", size=True)

    def _open_dir(self, parts: tuple[str, ...], name: str) -> int:
        """A descriptor of the directory `parts` under the root, made as needed (0700);
        never follows a link."""
        if self._root is None:
            raise self.refuse("the transfer was already finished")
        try:
            return open_dir(self._root, parts, make=True)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                raise self.refuse(f"{name!r} is both a file and a directory") from None
            raise

    def add_directory(self, name: str) -> None:
        """Make directory `name` (relative; 0700)."""
        parts = check_name(name, what=self.what, where=self.where)
        self._count()
        try:
            os.close(self._open_dir(parts, name))
        except OSError as exc:
            raise self._os_error(name, exc) from None

    def add_file(
        self, name: str, chunks: Iterable[bytes], *, size: int | None = None
    ) -> ReceivedFile:
        """Write file `name` (relative; 0600) from `chunks`, within the limits; a name
        already received is refused. `size`, when the sender declared one, is checked
        against the limits and the free space before anything is written, and at most
        that many bytes are read: a file that grows past it is refused."""
        parts = check_name(name, what=self.what, where=self.where)
        if not parts:
            raise self.refuse(f"{name!r} names the top directory, not a file")
        self._count()
        if size is not None:
            self._check_size(name, size, 0, declared=size)
            self.check_space(name, size)
        digest = hashlib.sha256()
        written = 0
        try:
            parent = self._open_dir(parts[:-1], name)
            try:
                fd = os.open(parts[-1], _FILE_FLAGS, 0o600, dir_fd=parent)
            except FileExistsError:
                os.close(parent)
                raise self.refuse(f"{name!r} comes twice") from None
            except OSError as exc:
                os.close(parent)
                if exc.errno == errno.ELOOP:
                    raise self.refuse(f"{name!r} would follow a link") from None
                raise
            try:
                with os.fdopen(fd, "wb") as out:
                    os.fchmod(fd, 0o600)
                    for chunk in chunks:
                        written += len(chunk)
                        if size is not None and written > size:
                            raise self.refuse(
                                f"{name!r} grew past the {size} bytes it was listed with"
                            )
                        self._check_size(name, written, len(chunk))
                        out.write(chunk)
                        digest.update(chunk)
            except BaseException:
                os.unlink(parts[-1], dir_fd=parent)  # no partial file stays behind
                raise
            finally:
                os.close(parent)
        except OSError as exc:
            raise self._os_error(name, exc) from None
        self._names.append(parts)
        return ReceivedFile("/".join(parts), written, digest.hexdigest())

    def _check_size(self, name: str, file_size: int, more: int, *, declared: int = 0) -> None:
        if file_size > self.limits.file_bytes:
            raise self.refuse(
                f"{name!r} is over {self.limits.file_bytes} bytes (the limit per file)", size=True
            )
        self.total += more
        if self.total + declared > self.limits.total_bytes:
            raise self.refuse(
                f"more than {self.limits.total_bytes} bytes in all (the limit)", size=True
            )

    # -- finishing ----------------------------------------------------------------
    def _close_root(self) -> None:
        if self._root is not None:
            os.close(self._root)
            self._root = None

    def place(self, name: str, root: Path) -> None:
        """Move the received file `name` to root/name (a directory kept between transfers,
        made by `ensure_directory`), replacing an older copy; root's folders are walked
        without following a link, so nothing in root can redirect it."""
        parts = check_name(name, what=self.what, where=self.where)
        if self._root is None or not parts:
            raise self.refuse(f"{name!r} cannot be placed: the transfer was already finished")
        try:
            src = open_dir(self._root, parts[:-1], make=False)
        except OSError as exc:
            raise _in_the_way(name, self.staging, exc) from None
        try:
            dst = _open_under(root, parts[:-1], name)
            try:
                os.rename(parts[-1], parts[-1], src_dir_fd=src, dst_dir_fd=dst)
            except OSError as exc:
                raise _in_the_way(name, root, exc) from None
            finally:
                os.close(dst)
        finally:
            os.close(src)

    def commit(self) -> Received:
        """Move the received tree to `destination` (which must be absent or empty)."""
        self._close_root()
        try:
            os.rename(self.staging, self.destination)
        except OSError as exc:
            self.abort()
            raise ReceiveError(
                f"cannot put {self.what} at {self.destination}: {exc.strerror}",
                "choose a directory that does not exist yet (or remove that one), then run again",
                where=self.where,
            ) from None
        files = [self.destination.joinpath(*parts) for parts in self._names]
        return Received(self.destination, files, self.total)

    def abort(self) -> None:
        """Remove everything received so far."""
        self._close_root()
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> Receiver:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.staging.exists():
            self.abort()


def open_dir(base: int, parts: tuple[str, ...], *, make: bool) -> int:
    """A new descriptor of the directory base/parts... (`base`: a directory descriptor,
    left open), each part made (0700) first when `make`; a link anywhere is not followed
    (OSError: ELOOP or ENOTDIR)."""
    fd = os.dup(base)
    try:
        for part in parts:
            if make:
                with suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _in_the_way(name: str, root: Path, exc: OSError) -> ReceiveError:
    return ReceiveError(
        f"cannot put {name} under {root}: {exc.strerror} (a link or a file is in the way)",
        f"remove what is in the way under {root}, then run again",
    )


def _open_under(root: Path, parts: tuple[str, ...], name: str) -> int:
    """A descriptor of root/parts... (made as needed, 0700); root itself is opened without
    following a link."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise _in_the_way(name, root, exc) from None
    try:
        return open_dir(top, parts, make=True)
    except OSError as exc:
        raise _in_the_way(name, root, exc) from None
    finally:
        os.close(top)


def ensure_directory(root: Path) -> None:
    """A directory kept between transfers (a job's results at home), made private (0700)
    when new; refused when it is a link or not a directory."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.is_symlink() or not root.is_dir():
        raise ReceiveError(f"{root} is not a plain directory", f"remove {root} and run again")


def write_file(root: Path, name: str, data: bytes) -> None:
    """Write `data` as root/name (0600), a file this tool writes itself into a directory
    it keeps (a manifest, a log): exclusive creation under a temporary name in the same
    folder, then one rename; root's folders are walked without following a link."""
    parts = check_name(name)
    if not parts:
        raise ReceiveError(f"cannot write {name!r}: it names no file", "name a file")
    parent = _open_under(root, parts[:-1], name)
    tmp = f".tmp-write-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, _FILE_FLAGS, 0o600, dir_fd=parent)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        os.close(parent)


class _Bounded(io.RawIOBase):
    """Reads through to `inner`, refusing to go past `limit` bytes."""

    def __init__(self, inner: BinaryIO | gzip.GzipFile, limit: int, refuse: ReceiveError) -> None:
        self.inner = inner
        self.left = limit
        self.error = refuse

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.inner.read(min(len(buffer), self.left + 1))
        if len(data) > self.left:
            raise self.error
        self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


# CVE-2024-6232: before 3.11.10 (3.12.6), Python's tar reader parses a pax header with
# regular expressions that take time quadratic in its length (an 80 KB header of digits
# took 20 s on 3.11.7; 512 KiB would take about half an hour). Headers are therefore
# bounded before Python parses them: on such a Python to a size that parses in
# milliseconds, with a total per archive; on any Python to a size no log needs (the whole
# header is read into memory), and never more than a few in a row (each is a recursion).
_PAX_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)
_META_TYPES = (*_PAX_TYPES, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_META_BYTES = 64 * 1024  # any Python: one pax or GNU long-name header
_SLOW_PAX_BYTES = 1024  # a Python with the CVE: one pax header (a few ms at worst)
_SLOW_PAX_TOTAL = 256 * 1024  # ... and all of one archive's (about a second at worst)
_META_DEPTH = 4  # headers that describe the next one, in a row (each is a recursion)


def pax_bounds(version: tuple[int, ...]) -> tuple[int, int]:
    """Pure: the most bytes of one pax header, and of all of one archive's, that the tar
    reader of Python `version` may parse: tight where CVE-2024-6232 makes parsing slow."""
    slow = version < (3, 11, 10) or (3, 12) <= version < (3, 12, 6)
    return (_SLOW_PAX_BYTES, _SLOW_PAX_TOTAL) if slow else (_META_BYTES, 1 << 62)


class _HeaderRefused(Exception):
    """A tar header refused before Python's tar reader parses it."""


class _GuardedTarInfo(tarfile.TarInfo):
    """Python's TarInfo, with the headers that describe the next member (pax, GNU long
    names) checked by size, total and depth before they are parsed."""

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type not in _META_TYPES:
            return super()._proc_member(tar)  # type: ignore[misc, no-any-return]
        state = tar.__dict__.setdefault("_provisioner_guard", {"depth": 0, "pax": 0})
        one, total = pax_bounds(sys.version_info[:3])
        if self.type in _PAX_TYPES:
            state["pax"] += self.size
            if self.size > one:
                raise _HeaderRefused(
                    f"a pax header of {self.size} bytes is over the {one} this Python "
                    "parses safely (CVE-2024-6232)"
                )
            if state["pax"] > total:
                raise _HeaderRefused(
                    f"pax headers of {state['pax']} bytes in all are over the {total} this "
                    "Python parses safely in one archive (CVE-2024-6232)"
                )
        elif self.size > _META_BYTES:
            raise _HeaderRefused(f"a GNU long-name header of {self.size} bytes")
        if state["depth"] >= _META_DEPTH:
            raise _HeaderRefused(f"more than {_META_DEPTH} extended headers in a row")
        state["depth"] += 1
        try:
            return super()._proc_member(tar)  # type: ignore[misc, no-any-return]
        finally:
            state["depth"] -= 1


def _kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    if member.issparse():
        return "a sparse file"
    return f"of tar type {member.type!r}"


def receive_tar(
    source: bytes | BinaryIO,
    destination: Path,
    *,
    limits: Limits,
    what: str,
    where: str,
    gzipped: bool = True,
) -> Received:
    """Unpack the tar in `source` into `destination` under the rules above."""
    raw: BinaryIO = io.BytesIO(source) if isinstance(source, bytes) else source
    with Receiver(destination, limits=limits, what=what, where=where) as receiver:
        compressed = _Bounded(
            raw,
            limits.compressed_bytes,
            receiver.refuse(f"more than {limits.compressed_bytes} bytes compressed", size=True),
        )
        plain: BinaryIO | gzip.GzipFile = (
            gzip.GzipFile(fileobj=io.BufferedReader(compressed), mode="rb")
            if gzipped
            else io.BufferedReader(compressed)
        )
        bound = limits.total_bytes + limits.members * _HEADER_ALLOWANCE
        stream = io.BufferedReader(
            _Bounded(
                plain,
                bound,
                receiver.refuse(f"more than {bound} bytes once uncompressed", size=True),
            )
        )
        try:
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_GuardedTarInfo) as tar:
                for member in tar:
                    _receive_member(tar, member, receiver)
        except _HeaderRefused as exc:
            raise receiver.refuse(f"{exc}, refused before it was parsed") from None
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as exc:
            raise receiver.refuse(f"not a valid archive ({exc or type(exc).__name__})") from None
        return receiver.commit()


def _receive_member(tar: tarfile.TarFile, member: tarfile.TarInfo, receiver: Receiver) -> None:
    if member.isdir():
        receiver.add_directory(member.name)
    elif member.isreg() and not member.issparse():
        data = tar.extractfile(member)
        assert data is not None  # a regular member always has a reader
        receiver.add_file(member.name, iter(lambda: data.read(_CHUNK), b""), size=member.size)
    else:
        check_name(member.name, what=receiver.what, where=receiver.where)
        raise receiver.refuse(f"{member.name!r} is {_kind(member)}")
