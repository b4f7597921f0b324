"""The host runtime's commands (pure strings, some run here in bash) and state parsing."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from provisioner.cluster import render
from provisioner.node import layout
from provisioner.runtime import names, runtime_for
from provisioner.runtime.host import runtime as host
from provisioner.runtime.protocol import RayState
from tests.unit.inventories import make_inventory

# Several tests here start processes named as the cluster "demo"'s and run its stop command,
# which ends every such process on this machine: on two xdist workers at once, one test's stop
# ended the other's processes (CI: "assert 0 >= 4"). They share one worker.
pytestmark = pytest.mark.xdist_group("host-processes")


def test_runtimes_are_found_by_module() -> None:
    assert names() == ("docker", "host", "podman")


def test_start_is_detached_with_its_own_temp_dir_and_no_token_value(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="host")
    cmd = host.start_command(inv, inv.workers[0], None)
    assert cmd.startswith("bash --login -i -c ")
    assert "setsid -w $PY -m ray.scripts.scripts start --address=10.250.9.10:6379 " in cmd
    assert "--temp-dir=/tmp/prov-demo " in cmd
    assert layout.link_short_ray_dir_command("demo") in cmd
    assert "RAY_AUTH_TOKEN_PATH=" in cmd and "RAY_AUTH_MODE=token" in cmd
    assert "--block" not in cmd and "ray stop" not in cmd
    assert "command -v ray" in cmd  # the login shell's ray names the interpreter


def test_named_interpreter_is_quoted_and_leads_the_path(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="host", ray_python="/opt/venv/bin/python")
    cmd = runtime_for(inv).start_command(inv.head)
    assert "PY=/opt/venv/bin/python" in cmd and "PATH=" in cmd
    assert "command -v ray" not in cmd
    assert "--head" in cmd and "--dashboard-host=127.0.0.1" in cmd


def test_parse_state() -> None:
    assert host.parse_state("") == RayState()
    running = host.parse_state(
        "raylet=812\ngcs=790\ndir=yes\nsession=session_2026-12-01_02-50-01_1\n"
        "python=/home/lab/ray-venv/bin/python3\n"
    )
    assert running.running and running.runs == "/home/lab/ray-venv/bin/python3"
    assert host.parse_state("dir=yes\nsession=session_x\n").status == "absent"


def _spawn(argv0: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["bash", "-c", f'exec -a "{argv0}" sleep 60'], start_new_session=True)


def _session(leader: int) -> list[str]:
    """Live (not zombie) processes of the session `leader` leads."""
    out = subprocess.run(
        ["ps", "-o", "pid=,stat=", "-s", str(leader)], capture_output=True, text=True, check=False
    ).stdout
    return [line for line in out.splitlines() if line.strip() and "Z" not in line.split()[-1]]


def test_stop_ends_only_this_clusters_processes_and_their_children(tmp_path: Path) -> None:
    """The stop command run here: a process naming this cluster's temp dir, its child and
    a process of its session naming no path (as Ray's client server) end; a process of
    another cluster and one merely called raylet stay; the stop's own shell (whose text
    names the cluster) is not taken for Ray."""
    ours_dir = "/tmp/prov-demo"
    raylet = f'exec -a "raylet --session_dir={ours_dir}/session_1" bash -c "sleep 60 & wait"'
    leader = subprocess.Popen(
        ["bash", "-c", f"( exec -a client-server sleep 60 ) & ( {raylet} ) & wait"],
        start_new_session=True,
    )
    other = _spawn("raylet --session_dir=/tmp/prov-demo2/s")
    decoy = _spawn("raylet")
    deadline = time.monotonic() + 10
    while len(_session(leader.pid)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_session(leader.pid)) >= 4  # the shell, the client server, the raylet, its child
    try:
        done = subprocess.run(["bash", "-c", host.stop_command("demo")], timeout=30, check=False)
        assert done.returncode == 0
        leader.wait(timeout=5)
        assert _session(leader.pid) == []
        assert other.poll() is None and decoy.poll() is None
        state = subprocess.run(["bash", "-c", host.running_test("demo")], check=False)
        assert state.returncode == 1
    finally:
        for p in (leader, other, decoy):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_running_test_sees_a_raylet_of_this_cluster(tmp_path: Path) -> None:
    exe = tmp_path / "raylet"
    exe.symlink_to("/bin/bash")  # comm "raylet", the marker on its command line
    marker = "/tmp/prov-demo/x"
    (tmp_path / ".provisioner/clusters/demo/ray").mkdir(parents=True)
    proc = subprocess.Popen([str(exe), "-c", "sleep 60; :", marker])
    try:
        time.sleep(0.2)
        assert subprocess.run(["bash", "-c", host.running_test("demo")]).returncode == 0
        out = subprocess.run(
            ["bash", "-c", host.state_command("demo")],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "HOME": str(tmp_path)},
        ).stdout
        assert host.parse_state(out).running, out
    finally:
        proc.kill()
        proc.wait()


def test_render_for_host_mode_stops_only_this_cluster(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="host")
    config = render.build_config(inv, tmp_path / "token", runtime_for(inv))
    assert "docker" not in config
    head = config["head_start_ray_commands"]
    assert not any("ray stop" in c for c in head + config["worker_start_ray_commands"])
    assert head[0] == host.stop_command("demo")
    assert head[1] == layout.link_short_ray_dir_command("demo")
    assert "--temp-dir=/tmp/prov-demo" in head[-1] and "RAY_AUTH_MODE=token" in head[-1]
    assert list(config["file_mounts"]) == ["~/.provisioner/clusters/demo/auth_token"]
    render.validate(config, where="test")


# A socket path Ray binds under its temp dir, with the longest session name it makes
# (a 7-digit PID) and the longest socket name of its dashboard modules.
LONGEST_UNDER_TEMP = "/session_2026-12-01_06-02-11_144460_4194304/sockets/dash_PlatformEventsHead"


def test_the_short_temp_dir_keeps_every_socket_path_within_107_bytes() -> None:
    for cluster in ("demo", "a" * 20, "b" * 21, "c-" * 40):
        short = layout.node_short_ray_dir(cluster)
        assert short.startswith("/tmp/prov-")
        assert len(short + LONGEST_UNDER_TEMP) <= 107, (cluster, short)
    assert layout.node_short_ray_dir("demo") == "/tmp/prov-demo"
    # cut names stay apart by their hash
    assert layout.node_short_ray_dir("x" * 30 + "1") != layout.node_short_ray_dir("x" * 30 + "2")


def test_the_link_is_made_remade_and_refused_when_not_ours(tmp_path: Path) -> None:
    cluster = f"unit-{os.getpid()}"
    short = Path(layout.node_short_ray_dir(cluster))
    env = {**os.environ, "HOME": str(tmp_path)}

    def link() -> subprocess.CompletedProcess[str]:
        command = layout.link_short_ray_dir_command(cluster)
        return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True)

    try:
        assert link().returncode == 0
        target = tmp_path / ".provisioner/clusters" / cluster / "ray"
        assert short.is_symlink() and short.resolve() == target.resolve()
        assert link().returncode == 0 and short.resolve() == target.resolve()  # again: same
        short.unlink()
        short.mkdir()  # something that is not a link: refused, left alone
        refused = link()
        assert refused.returncode == 2 and "not a link" in refused.stderr
        assert short.is_dir() and not short.is_symlink()
    finally:
        if short.is_symlink():
            short.unlink()
        elif short.is_dir():
            short.rmdir()


def test_stop_also_ends_a_ray_an_older_provisioner_started_in_the_node_directory(
    tmp_path: Path,
) -> None:
    legacy = _spawn(f"raylet --session_dir={tmp_path}/.provisioner/clusters/demo/ray/session_0")
    other = _spawn(f"raylet --session_dir={tmp_path}/.provisioner/clusters/demo2/ray/session_0")
    time.sleep(0.3)
    try:
        done = subprocess.run(["bash", "-c", host.stop_command("demo")], timeout=30, check=False)
        assert done.returncode == 0
        legacy.wait(timeout=5)
        assert other.poll() is None
    finally:
        for p in (legacy, other):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_host_mode_draws_every_port_from_the_block(tmp_path: Path) -> None:
    from provisioner.inventory import RayPorts

    inv = make_inventory(tmp_path, runtime="host", ports=RayPorts.from_base(24000))
    head, worker = (host.start_command(inv, n, None) for n in (inv.head, inv.workers[0]))
    assert "--head" in head and "--port=24000 " in head and "--dashboard-port=24001 " in head
    assert "--address=10.250.9.10:24000 " in worker
    for cmd in (head, worker):
        assert "--node-manager-port=24003 " in cmd and "--object-manager-port=24004 " in cmd
        assert "--min-worker-port=24100 " in cmd and "--max-worker-port=24999 " in cmd
        assert "6379" not in cmd and "10002" not in cmd


def test_a_name_read_from_a_short_temp_dir_is_this_clusters() -> None:
    long = "a-cluster-with-a-long-name"
    assert layout.is_named(long, long) and layout.is_named(layout.short_name(long), long)
    assert layout.short_name("demo") == "demo" and layout.is_named("demo", "demo")
    assert not layout.is_named("demo2", "demo") and not layout.is_named("", "demo")
    assert not layout.is_named(layout.short_name(long), long + "x")


CID = "0123456789abcdef"


def _spawn_env(argv0: str, cluster_id: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != host.ID_ENV}
    if cluster_id is not None:
        env[host.ID_ENV] = cluster_id
    return subprocess.Popen(
        ["bash", "-c", f'exec -a "{argv0}" sleep 60'], start_new_session=True, env=env
    )


def test_stop_goes_by_the_clusters_id_in_the_environment_not_by_a_path_in_argv() -> None:
    """Ours: a process with this cluster's id in its environment, whatever its command
    line says. Not ours: one naming our temp dir whose environment holds another id (a
    cluster of the same name from another state folder)."""
    marked = _spawn_env("python worker-without-a-path", CID)
    namesake = _spawn_env("raylet --session_dir=/tmp/prov-demo/session_1", "fedcba9876543210")
    for proc in (marked, namesake):  # reaped at once, as a node's init does (no zombie)
        threading.Thread(target=proc.wait, daemon=True).start()
    time.sleep(0.3)
    try:
        done = subprocess.run(
            ["bash", "-c", host.stop_command("demo", CID)], timeout=60, check=False
        )
        assert done.returncode == 0
        marked.wait(timeout=5)
        assert namesake.poll() is None
        # positive control: its own cluster's stop does end it
        theirs = host.stop_command("demo", "fedcba9876543210")
        assert subprocess.run(["bash", "-c", theirs], timeout=60).returncode == 0
        namesake.wait(timeout=5)
    finally:
        for p in (marked, namesake):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def test_host_commands_list_the_ssh_users_own_processes_only(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="host")
    runtime = runtime_for(inv)
    for command in (
        host.stop_command("demo", CID),
        host.state_command("demo", CID),
        host.running_test("demo", CID),
        runtime.stop_command(inv.head),
        runtime.state_command(),
        runtime.running_test(),
    ):
        assert "ps -e" not in command and 'ps -u "$(id -u)"' in command
    assert "export PROVISIONER_CLUSTER_ID=0123456789abcdef; " in host.start_command(
        inv, inv.head, None, cluster_id=CID
    )
    assert "PROVISIONER_CLUSTER_ID" not in host.start_command(inv, inv.head, None)


def test_the_link_is_made_under_a_fresh_name_and_renamed_into_place() -> None:
    """No check-then-create: `ln -s` to a fresh name, then rename(2) (`mv -T`), which
    /tmp's sticky bit refuses over another user's name and which never descends into a
    directory made there meanwhile; then the result is checked."""
    command = layout.link_short_ray_dir_command("demo")
    assert "ln -sfn" not in command
    assert 'n=$(mktemp -u "$t.XXXXXXXX") && ln -s "$d" "$n" && { mv -T "$n" "$t"' in command
    assert command.endswith(
        '[ -L "$t" ] && [ "$(stat -c %u "$t")" = "$(id -u)" ] && [ "$(readlink "$t")" = "$d" ] '
        '|| { echo "$t exists and is not a link of this user (a cluster of the same name of '
        'another user, or something left behind): remove it or rename the cluster" >&2; '
        "exit 2; }"
    )


LISTEN = (
    "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "print(s.getsockname()[1], flush=True); time.sleep(60)"
)


def _listener(cluster_id: str | None) -> tuple[subprocess.Popen[str], int]:
    """A process of this user listening on 127.0.0.1, marked with `cluster_id` (None:
    unmarked, a stranger of the same user); it and its port."""
    env = {k: v for k, v in os.environ.items() if k != host.ID_ENV}
    if cluster_id is not None:
        env[host.ID_ENV] = cluster_id
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTEN],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_this_clusters_sockets_are_those_of_its_marked_processes() -> None:
    """The inode of a socket this cluster's Ray process listens on is listed; a listener
    of the same user without the cluster's id (another of its services) is not."""
    from provisioner.cluster.tunnel import parse_listeners

    ours, our_port = _listener(CID)
    stranger, their_port = _listener(None)
    try:
        table = Path("/proc/net/tcp").read_text()
        inode = {x.port: x.inode for x in parse_listeners(table)}
        # (seen once under load, not alone: the listener's port not among the listening)
        missing = {our_port, their_port} - set(inode)
        assert not missing, (missing, sorted(inode), table.count("\n"), ours.poll())
        listed = subprocess.run(
            ["bash", "-c", host.sockets_command("demo", CID)],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        assert str(inode[our_port]) in listed  # positive control
        assert str(inode[their_port]) not in listed
    finally:
        for p in (ours, stranger):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
