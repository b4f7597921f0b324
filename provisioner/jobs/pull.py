"""Bring a job's results home from the head's disk over SSH, incrementally and verified.

A job writes into its results directory on the head node's own disk (outside the Ray
container, under the cluster's directory there). `pull` lists that directory in one
command (size and mtime of every file), sends nothing for a file already home with the
same size and mtime (recorded in `.pulled.json` beside the results), asks the head for
the sha256 of the rest in one more command, fetches each over SFTP on the same SSH
connection while hashing it here, and keeps it only when size and sha256 match.
A file that changed while it travelled (a metrics file rewritten mid-run) is left for
the next pull. Names starting with `.tmp` are files a playbook is still writing.

Every file is received through `provisioner.remote.receive` (the one safe way to write
what comes from the cluster) into a fresh staging directory, and moved into the results
only when verified (`landing.place`). No size cap: a job's results are as big as it
makes them.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.cluster import layout
from provisioner.errors import OperationError, RemoteError
from provisioner.jobs import landing
from provisioner.remote.receive import Limits, Receiver
from provisioner.remote.session import Session

MANIFEST = ".pulled.json"
HASH_BATCH = 100  # names per sha256sum command (the command line stays short)
CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the job's results directory, POSIX
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
    found: bool = True  # the head had a results directory for the job

    def to_json(self) -> dict[str, Any]:
        return {
            "results_dir": str(self.directory),
            "files_sent": self.sent,
            "bytes_sent": self.bytes_sent,
            "files_unchanged": self.unchanged,
            "files_pending": self.pending,
            "found_on_head": self.found,
        }


def list_command(cluster: str, job_id: str) -> str:
    """Size, mtime and name of every finished file of the job's results (NUL-separated);
    exit 3 when the head has no results directory for the job."""
    directory = layout.node_results_dir(cluster, job_id)
    return (
        f"cd {directory} 2>/dev/null || exit 3; "
        "find . -type f ! -path '*/.tmp*' -printf '%s %T@ %P\\0'"
    )


def hash_command(cluster: str, job_id: str, paths: list[str]) -> str:
    """sha256 of each of `paths` (relative to the job's results), NUL-terminated lines."""
    directory = layout.node_results_dir(cluster, job_id)
    return f"cd {directory} && sha256sum -z -- " + " ".join(shlex.quote(p) for p in paths)


def safe_relative(name: str) -> str | None:
    """`name` when it is a plain relative path inside the results, else None."""
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


UNBOUNDED = 1 << 62
LIMITS = Limits(
    members=UNBOUNDED, file_bytes=UNBOUNDED, total_bytes=UNBOUNDED, compressed_bytes=UNBOUNDED
)


def pull(session: Session, cluster: str, job_id: str, home: Path) -> Pulled:
    """Bring what is new in the job's results on the head into `home` (results/JOB)."""
    result = Pulled(directory=home)
    listing = session.run(list_command(cluster, job_id), timeout=120)
    if listing.exit_code == 3:
        result.found = False
        return result
    listing.check("check the head's disk and that the job id is right")
    files = parse_listing(listing.stdout)
    landing.ensure_root(home)
    manifest = read_manifest(home)
    todo = needed(files, manifest, home)
    result.unchanged = len(files) - len(todo)
    what, where = f"the results of job {job_id}", f"{session.host} (job {job_id})"
    with Receiver(home / ".incoming", limits=LIMITS, what=what, where=where) as receiver:
        _fetch(session, cluster, job_id, todo, receiver, home, manifest, result)
    landing.write_file(home, MANIFEST, json.dumps(manifest, indent=1).encode())
    return result


def _fetch(
    session: Session,
    cluster: str,
    job_id: str,
    todo: list[RemoteFile],
    receiver: Receiver,
    home: Path,
    manifest: dict[str, dict[str, Any]],
    result: Pulled,
) -> None:
    """Hash on the head, fetch, verify, place: batch by batch."""
    for start in range(0, len(todo), HASH_BATCH):
        batch = todo[start : start + HASH_BATCH]
        hashed = session.run(hash_command(cluster, job_id, [f.path for f in batch]), timeout=600)
        digests = parse_hashes(hashed.stdout)  # a file removed meanwhile has none
        for f in batch:
            expected = digests.get(f.path)
            if expected is None:
                result.pending.append(f.path)
                continue
            remote = layout.node_results_rel(cluster, job_id, f.path)
            try:
                got = receiver.add_file(f.path, _chunks(session, remote), size=f.size)
            except RemoteError as exc:
                if exc.kind != "sftp":
                    raise
                result.pending.append(f.path)  # removed meanwhile (an old checkpoint)
                continue
            if (got.size, got.sha256) != (f.size, expected):  # changed while it travelled
                result.pending.append(f.path)
                continue
            landing.place(receiver.staging, got.name, home)
            manifest[f.path] = {"size": f.size, "mtime": f.mtime, "sha256": got.sha256}
            result.sent.append(f.path)
            result.bytes_sent += got.size


def _chunks(session: Session, remote: str) -> Iterator[bytes]:
    try:
        with session.open_remote(remote) as handle:
            while chunk := handle.read(CHUNK):
                yield chunk
    except OSError as exc:
        raise OperationError(
            f"cannot read {remote} on {session.host}: {exc}", "run `jobs results` again"
        ) from exc


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
