"""Bring a directory home from a node over SSH, incrementally, verified and bounded.

The directory is `ROOT/REL` on the node: ROOT a shell word for a folder the pull never
leaves (`"$HOME"/...`), REL a relative path under it. `pull` lists it in one command (size
and mtime of every file), sends nothing for a file already home with the same size and
mtime (recorded in `.pulled.json` beside what came), asks the node for the sha256 of the
rest in one more command (`HASH_BATCH` names at a time), fetches each on the same SSH
connection while hashing it here, and keeps it only when size and sha256 match. A file
that changed while it travelled (a metrics file rewritten mid-run) is left for the next
pull (`Pulled.pending`). Names starting with `.tmp` are files still being written.

Every file is received through `provisioner.remote.receive` (the one safe way anything
lands here) into a fresh staging directory, and moved into `home` only when verified
(`Receiver.place`).

What is on the node may be hostile (in docker mode a job runs as root over its
directory), so:

- nothing on the node follows a link: the directory (and a file's folder) is entered with
  `cd -P` and refused (exit `LINK_EXIT`) unless its physical path is ROOT/REL; `find -P`
  lists only regular files; each file is read by `dd` with `iflag=nofollow`, and at most
  the size it was listed with (a file that grew is fetched again by the next pull);
- bounded: a file over `PULL_MAX_ENV` bytes (default `PULL_MAX_BYTES`), or one that would
  leave less than `RESERVE_BYTES` free here, is refused by name (in `Pulled.refused`)
  before anything of it is hashed or read, and the rest comes home; the bytes of one
  pull are capped by the same figure;
- every read from the node has an idle timeout (`READ_TIMEOUT`).
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import InputError, ReceiveError, RemoteError, TooLargeError
from provisioner.remote.receive import Limits, MiB, Receiver, ensure_directory, write_file
from provisioner.remote.session import Session

MANIFEST = ".pulled.json"
HASH_BATCH = 100  # names per sha256sum command (the command line stays short)
CHUNK = 1 << 20
PULL_MAX_ENV = "PROVISIONER_PULL_MAX_BYTES"
PULL_MAX_BYTES = 64 * 1024 * MiB  # 64 GiB: per file and per pull
RESERVE_BYTES = 1024 * MiB  # left free on this machine's disk, whatever the node sent
READ_TIMEOUT = 120.0  # seconds a read from the node may wait for data
ABSENT_EXIT = 3  # the node has no such directory
LINK_EXIT = 4  # the directory is a link, or under one
UNBOUNDED = 1 << 62


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the directory pulled, POSIX
    size: int
    mtime: str


@dataclass
class Pulled:
    """What one pull did."""

    directory: Path
    sent: list[str] = field(default_factory=list)  # files fetched and verified now
    bytes_sent: int = 0
    unchanged: int = 0  # files already home, not sent again
    pending: list[str] = field(default_factory=list)  # changed while travelling: next pull
    refused: list[str] = field(default_factory=list)  # too big for the caps or this disk
    found: bool = True  # the node had the directory

    def to_json(self) -> dict[str, Any]:
        return {
            "results_dir": str(self.directory),
            "files_sent": self.sent,
            "bytes_sent": self.bytes_sent,
            "files_unchanged": self.unchanged,
            "files_pending": self.pending,
            "files_refused": self.refused,
            "found_on_head": self.found,
        }


@dataclass(frozen=True)
class Source:
    """The directory on the node: `rel` under `root` (a shell word, never left), with the
    words that name it in refusals."""

    root: str
    rel: str
    what: str  # e.g. "the results of job J"
    where: str  # e.g. "head (job J)"
    again: str = ""  # how to bring a file refused as too big home: the command to run again


def enter_command(root: str, rel: str) -> str:
    """Shell: `cd` into ROOT/rel without following a link anywhere in `rel`: exit 3 when
    it is absent, exit 4 when its physical path is not ROOT/rel (a link on the way)."""
    target = shlex.quote(rel)
    return (
        f"root=$(cd -P {root} 2>/dev/null && pwd -P) || exit {ABSENT_EXIT}; "
        f"cd -P {root}/{target} 2>/dev/null || exit {ABSENT_EXIT}; "
        f'[ "$(pwd -P)" = "$root"/{target} ] || exit {LINK_EXIT}'
    )


def list_command(root: str, rel: str) -> str:
    """Size, mtime and name of every finished regular file under ROOT/rel (NUL-separated),
    never through a link; exit 3 when it is absent, 4 when it is a link."""
    return f"{enter_command(root, rel)}; find -P . -type f ! -path '*/.tmp*' -printf '%s %T@ %P\\0'"


def hash_command(root: str, rel: str, paths: list[str]) -> str:
    """sha256 of each of `paths` (relative to ROOT/rel), NUL-terminated lines."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    return f"{enter_command(root, rel)}; exec sha256sum -z -- {quoted}"


def read_command(root: str, rel: str, path: str, size: int) -> str:
    """Shell: at most `size` bytes of ROOT/rel/path on stdout, opened without following a
    link (its folder entered as `enter_command` does)."""
    folder, name = posixpath.split(path)
    where = f"{rel}/{folder}" if folder else rel
    return (
        f"{enter_command(root, where)}; exec dd if={shlex.quote('./' + name)} "
        f"iflag=nofollow,count_bytes bs={CHUNK} count={size} status=none"
    )


def pull_limit(environ: dict[str, str] | None = None) -> int:
    """The most bytes one file, and one pull, may bring home ($PROVISIONER_PULL_MAX_BYTES)."""
    value = (os.environ if environ is None else environ).get(PULL_MAX_ENV, "")
    if not value:
        return PULL_MAX_BYTES
    if not value.isdigit() or int(value) <= 0:
        raise InputError(
            f"{PULL_MAX_ENV}={value!r} is not a number of bytes",
            f"set {PULL_MAX_ENV} to a positive whole number of bytes, e.g. 68719476736, "
            "or unset it for the default (64 GiB)",
        )
    return int(value)


def limits(max_bytes: int) -> Limits:
    """A pull's bounds: `max_bytes` per file and in all, any number of files."""
    return Limits(
        members=UNBOUNDED,
        file_bytes=max_bytes,
        total_bytes=max_bytes,
        compressed_bytes=max_bytes,
        reserve_bytes=RESERVE_BYTES,
    )


def safe_relative(name: str) -> str | None:
    """`name` when it is a plain relative path inside the directory, else None."""
    if not name or name.startswith("/") or "\\" in name:
        return None
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 for c in name):
        return None
    return name


def parse_listing(stdout: str) -> list[RemoteFile]:
    """The `find -printf '%s %T@ %P\\0'` listing; odd names are skipped (never fetched)."""
    found: list[RemoteFile] = []
    for entry in stdout.split("\0"):
        size, _, rest = entry.partition(" ")
        mtime, _, name = rest.partition(" ")
        path = safe_relative(name)
        if size.isdigit() and path is not None:
            found.append(RemoteFile(path, int(size), mtime))
    return found


def parse_hashes(stdout: str) -> dict[str, str]:
    """`sha256sum -z` output: name -> hex digest."""
    digests: dict[str, str] = {}
    for entry in stdout.split("\0"):
        digest, sep, name = entry.partition("  ")
        if sep and len(digest) == 64:
            digests[name] = digest
    return digests


def read_manifest(directory: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def needed(
    files: list[RemoteFile], manifest: dict[str, dict[str, Any]], home: Path
) -> list[RemoteFile]:
    """The files not already home with the same size and mtime."""
    out = []
    for f in files:
        seen = manifest.get(f.path)
        local = home / f.path
        if (
            seen
            and seen.get("size") == f.size
            and seen.get("mtime") == f.mtime
            and local.is_file()
            and not local.is_symlink()
            and local.stat().st_size == f.size
        ):
            continue
        out.append(f)
    return out


def pull(session: Session, source: Source, home: Path) -> Pulled:
    """Bring what is new in the node's ROOT/REL into `home`."""
    result = Pulled(directory=home)
    listing = session.run(list_command(source.root, source.rel), timeout=120)
    if listing.exit_code == ABSENT_EXIT:
        result.found = False
        return result
    if listing.exit_code == LINK_EXIT:
        raise ReceiveError(
            f"refused {source.what}: its directory on {session.host} is a link (or under one)",
            "nothing was fetched; find out what on that node planted it (a hostile job) "
            "before trusting what it sends",
            where=source.where,
        )
    listing.check(f"check {session.host}'s disk and that {source.rel!r} is right")
    files = parse_listing(listing.stdout)
    ensure_directory(home)
    manifest = read_manifest(home)
    todo = needed(files, manifest, home)
    result.unchanged = len(files) - len(todo)
    bounds = limits(pull_limit())
    again = f" and run `{source.again}` again" if source.again else ""
    fix = (
        f"that file stays on {session.host}; to bring it home, set {PULL_MAX_ENV} to more "
        f"bytes (now {bounds.file_bytes}){again}"
    )
    with Receiver(
        home / ".incoming", limits=bounds, what=source.what, where=source.where, size_fix=fix
    ) as receiver:
        _fetch(session, source, _admitted(todo, receiver, result), receiver, manifest, result)
    write_file(home, MANIFEST, json.dumps(manifest, indent=1).encode())
    return result


def _admitted(todo: list[RemoteFile], receiver: Receiver, result: Pulled) -> list[RemoteFile]:
    """The files within the bounds; the rest refused by name before anything is hashed
    (a 4 TiB sparse file is never read)."""
    admitted = []
    for f in todo:
        try:
            receiver.admit(f.path, f.size)
        except TooLargeError as exc:
            result.refused.append(f"{f.path}: {exc.message} (fix: {exc.fix})")
        else:
            admitted.append(f)
    return admitted


def _fetch(
    session: Session,
    source: Source,
    admitted: list[RemoteFile],
    receiver: Receiver,
    manifest: dict[str, dict[str, Any]],
    result: Pulled,
) -> None:
    """Hash on the node, fetch, verify, place: batch by batch."""
    for start in range(0, len(admitted), HASH_BATCH):
        batch = admitted[start : start + HASH_BATCH]
        hashed = session.run(
            hash_command(source.root, source.rel, [f.path for f in batch]), timeout=600
        )
        digests = parse_hashes(hashed.stdout)  # a file removed meanwhile has none
        for f in batch:
            expected = digests.get(f.path)
            if expected is None:
                result.pending.append(f.path)
                continue
            command = read_command(source.root, source.rel, f.path, f.size)
            try:
                got = receiver.add_file(f.path, _chunks(session, command), size=f.size)
            except TooLargeError as exc:
                result.refused.append(f"{f.path}: {exc.message} (fix: {exc.fix})")
                continue
            except RemoteError as exc:
                if exc.kind != "read":
                    raise
                result.pending.append(f.path)  # removed or made a link meanwhile
                continue
            if (got.size, got.sha256) != (f.size, expected):  # changed while it travelled
                result.pending.append(f.path)
                continue
            receiver.place(got.name, result.directory)
            manifest[f.path] = {"size": f.size, "mtime": f.mtime, "sha256": got.sha256}
            result.sent.append(f.path)
            result.bytes_sent += got.size


def _chunks(session: Session, command: str) -> Iterator[bytes]:
    yield from session.stream(command, idle_timeout=READ_TIMEOUT)
