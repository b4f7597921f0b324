from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from provisioner.cluster import down, status, up
from provisioner.cluster.headprobe import GcsNode
from provisioner.errors import InputError
from provisioner.node import commands, layout, token
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.protocol import RayState
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin


def test_worker_ray_start(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    args = commands.ray_start_args(inv, inv.workers[0])
    assert args[:4] == [
        "ray",
        "start",
        "--address=10.250.9.10:6379",
        "--node-ip-address=10.250.9.11",
    ]
    assert args[-2:] == ["--disable-usage-stats", "--block"]
    assert "--dashboard-host=127.0.0.1" not in args


def test_head_docker_run_is_quoted_and_carries_no_token(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, shm_size=2**30)
    cmd = docker.docker_run_command(inv, inv.head, "sha256:abc")
    assert cmd == (
        'mkdir -p "$HOME"/.provisioner/clusters/demo/ray '
        '"$HOME"/.provisioner/clusters/demo/results '
        "&& docker run -d --name ray-demo "
        "--net=host --restart=unless-stopped --shm-size=1073741824 "
        '-v "$HOME"/.provisioner/clusters/demo/ray:/tmp/ray '
        '--mount type=bind,source="$HOME"/.provisioner/clusters/demo/auth_token,'
        "target=/run/provisioner/auth_token,readonly "
        '-v "$HOME"/.provisioner/clusters/demo/results:/provisioner/results '
        "-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/provisioner/auth_token "
        "-e RAY_USAGE_STATS_ENABLED=0 -e PROVISIONER_RESULTS_ROOT=/provisioner/results "
        '--mount type=bind,source="$HOME"/.provisioner/clusters/demo/tls,'
        "target=/run/provisioner/tls,readonly "
        "-e RAY_USE_TLS=1 -e RAY_TLS_SERVER_CERT=/run/provisioner/tls/node.crt "
        "-e RAY_TLS_SERVER_KEY=/run/provisioner/tls/node.key "
        "-e RAY_TLS_CA_CERT=/run/provisioner/tls/ca.crt "
        "--label provisioner.cluster=demo "
        "--label provisioner.role=head sha256:abc ray start --head "
        "--node-ip-address=10.250.9.10 --port=6379 --dashboard-host=127.0.0.1 "
        "--dashboard-port=8265 --ray-client-server-port=10001 --node-manager-port=8077 "
        "--object-manager-port=8076 --runtime-env-agent-port=8079 "
        "--dashboard-agent-grpc-port=8078 --dashboard-agent-listen-port=52365 "
        "--metrics-export-port=8090 --min-worker-port=10002 --max-worker-port=19999 "
        "'--resources={\"accel\": 1.0}' --labels=zone=a --disable-usage-stats --block"
    )


def test_default_shm_is_computed_on_the_node_like_rays_launcher(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    assert "MemAvailable" in docker.shm_size(inv)
    assert "0.3*1.1" in docker.shm_size(inv)


def test_token_file_is_private_and_stable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path)
    path = token.ensure_token(inv)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    value = path.read_text()
    assert len(value) == 64
    assert token.ensure_token(inv) == path and path.read_text() == value
    os.chmod(path, 0o644)
    with pytest.raises(InputError, match="others can read"):
        token.read_token(inv)


def test_token_install_reads_stdin_never_argv() -> None:
    cmd = token.install_command("demo")
    assert cmd.startswith("umask 077 && mkdir -p ")
    assert "cat > " in cmd and "chmod 600" in cmd


def test_parse_container_facts() -> None:
    assert docker.parse_container_facts("null\n").status == "absent"
    f = docker.parse_container_facts(
        '{"running": true, "status": "running", "image": "sha256:x", "started_at": "t",'
        f' "restarts": 2, "exit_code": 0, "oom_killed": false, "cluster_id": "{CID}"}}',
        CID,
    )
    assert f.running and f.runs == "sha256:x" and f.restarts == 2


def test_assemble_counts_only_nodes_alive_at_their_inventory_address(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    run = RayState(status="running", runs="sha256:x")
    facts = {n.name: run for n in inv.nodes}
    gcs = [
        GcsNode("a", "10.250.9.10", True, {"CPU": 2.0}),
        GcsNode("b", "10.250.9.11", False),
        GcsNode("c", "127.0.1.1", True),  # wrong address: does not count
    ]
    runtime = docker.DockerRuntime(inv, make_pin(image_id="sha256:x"))
    st = status.assemble(inv, runtime, facts, {}, gcs)
    assert (st.alive_nodes, st.expected_nodes, st.healthy) == (1, 3, False)
    doc = st.to_json()
    assert doc["nodes"][0]["ray_alive"] is True and doc["nodes"][0]["image_ok"] is True
    assert {"host", "role", "ssh_ok", "container", "image_ok", "ray_alive"} <= set(doc["nodes"][1])


def test_needs_start() -> None:
    ok = RayState(status="running", runs="sha256:x")
    assert not up.needs_start(ok, True, True, head_restarted=False)
    assert not up.needs_start(ok, None, True, head_restarted=False)  # host: nothing pinned
    assert up.needs_start(ok, True, True, head_restarted=True)
    assert up.needs_start(ok, False, True, head_restarted=False)  # another image
    assert up.needs_start(ok, True, False, head_restarted=False)
    assert up.needs_start(None, None, True, head_restarted=False)


def test_down_checks_role_ports(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    assert 6379 in down.ray_ports(inv, inv.head)
    assert 6379 not in down.ray_ports(inv, inv.workers[0])
    assert down.parse_ports("6379\n8265\n") == [6379, 8265]


def test_wait_for_port_command_runs_in_bash() -> None:
    """The command `up` runs on the head, run here: 0 once the port listens, 3 when the
    cluster's container is not running (none exists here), 1 after the timeout."""
    import socket
    import subprocess

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        running = docker.container_running_test("nosuch")
        wait = commands.wait_for_port_command("127.0.0.1", port, 5, running)
        assert subprocess.run(["bash", "-c", wait], timeout=30).returncode == 0
    wait = commands.wait_for_port_command("127.0.0.1", port, 5, running)
    assert subprocess.run(["bash", "-c", wait], timeout=30).returncode == 3
    wait = commands.wait_for_port_command("127.0.0.1", port, 0.3, running)
    assert subprocess.run(["bash", "-c", wait], timeout=30).returncode == 1
    assert f"""bash -c 'exec 3<>"/dev/tcp/$1/$2"' probe 127.0.0.1 {port} """ in wait
    assert "ray-nosuch" in wait


HOSTILE_HOSTS = [
    "fe80::1%$(touch${IFS}MARK)",
    "fe80::1%`touch${IFS}MARK`",
    "fe80::1%x;touch${IFS}MARK",
    "fe80::1%x|touch${IFS}MARK",
    "x/1;touch MARK;#",
    "x'; touch MARK; '",
    'x"; touch MARK; "',
    "x\ntouch MARK",
]


@pytest.mark.parametrize("hostile", HOSTILE_HOSTS)
def test_wait_for_port_command_never_runs_its_host(hostile: str, tmp_path: Path) -> None:
    """Whatever the host is (the builder's defence in depth: addresses are checked when
    read), it reaches the probe's bash as an argument, quoted once: by string, and run in
    bash, where the same text as code does run (positive control)."""
    import shlex

    mark = tmp_path / "PWNED"
    host = hostile.replace("MARK", str(mark))
    wait = commands.wait_for_port_command(host, 9, 0.1, "true")
    assert f"probe {shlex.quote(host)} 9 " in wait
    assert shlex.split(wait.split("bash -c ", 1)[1])[:4] == [
        'exec 3<>"/dev/tcp/$1/$2"',
        "probe",
        host,
        "9",
    ]
    assert subprocess.run(["bash", "-c", wait], timeout=30).returncode == 1
    assert not mark.exists()
    if "$(" in hostile:  # positive control: the same host as the text of a script runs
        subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/{host}/9"], timeout=30, check=False)
        assert mark.exists()


def test_port_block_reaches_ray_start_on_head_and_workers(tmp_path: Path) -> None:
    from provisioner.inventory import RayPorts

    inv = make_inventory(tmp_path, ports=RayPorts.from_base(23000))
    head = commands.ray_start_args(inv, inv.head)
    worker = commands.ray_start_args(inv, inv.workers[0])
    assert "--port=23000" in head and "--dashboard-port=23001" in head
    assert "--ray-client-server-port=23002" in head
    assert "--address=10.250.9.10:23000" in worker
    for args in (head, worker):
        assert "--min-worker-port=23100" in args and "--max-worker-port=23999" in args
        numbers = [
            int(a.split("=")[1])
            for a in args
            if a.startswith("--") and a.endswith(tuple("0123456789")) and "port" in a
        ]
        assert numbers and all(23000 <= n <= 23999 for n in numbers)
    assert commands.head_address(inv) == "10.250.9.10:23000"


CID = "0123456789abcdef"
OTHER = "fedcba9876543210"


def test_the_container_is_named_and_labelled_by_the_clusters_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path)
    assert layout.container_name("demo", CID) == "ray-demo-01234567"
    assert layout.container_name("demo") == "ray-demo"  # an older provisioner's name
    assert token.ray_container(inv) == "ray-demo"  # no id yet in this state folder
    made = token.ensure_cluster_id(inv)
    assert token.ray_container(inv) == f"ray-demo-{made[:8]}"
    assert docker.DockerRuntime(inv, None).render_section(tmp_path / "t").config["docker"][
        "container_name"
    ] == token.ray_container(inv)
    run = docker.docker_run_command(inv, inv.head, "sha256:abc", cluster_id=CID)
    assert " --name ray-demo-01234567 " in run
    assert f" --label provisioner.cluster-id={CID} " in run
    assert "provisioner.cluster-id=" not in docker.docker_run_command(inv, inv.head, "x")
    assert f"--label provisioner.cluster-id={CID}" in docker.run_options(inv, CID)


def _fake_docker(work: Path, containers: dict[str, str]) -> dict[str, str]:
    """A `docker` run by a real shell, on a node holding `containers` (name -> its
    cluster id label, "" for none, all of cluster `demo`): `inspect` answers a container's
    label, `ps` lists them, `rm` and `run` are logged, `exec` runs the command here; `run`
    refuses a name in use (exit 125, as Docker does), else adds it (a file `broken` in
    `work`: every run fails, exit 125)."""
    bin_ = work / "bin"
    bin_.mkdir(parents=True)
    table = work / "containers"
    table.write_text("".join(f"{n} {label or '-'}\n" for n, label in containers.items()))
    (bin_ / "docker").write_text(
        "#!/bin/sh\n"
        f"t={table}\n"
        'for a; do n="$a"; done\n'  # the last word: the container's name
        'case "$1" in\n'
        'inspect) l=$(awk -v n="$n" \'$1 == n {print $2}\' "$t"); [ -n "$l" ] || exit 1;'
        ' case "$*" in *State.Running*) echo true;; *) echo "$l";; esac;;\n'
        # `docker ps -a` as start_guard's format prints it: name, cluster label, id label
        # ("-" for none); every container here carries this cluster's name (demo)
        'ps) awk \'{print $1, "demo", $2}\' "$t";;\n'
        f'rm) echo "$n" >> {work}/rm.log; grep -v "^$n " "$t" > "$t.new"; mv "$t.new" "$t";;\n'
        f"run) [ -e {work}/broken ] && exit 125;"
        ' m=$(echo "$*" | sed "s/.*--name \\([^ ]*\\).*/\\1/");'
        ' if awk -v n="$m" \'$1 == n {f=1} END {exit !f}\' "$t"; then'
        ' echo "Conflict. The container name /$m is already in use" >&2; exit 125; fi;'
        f' echo "$@" >> {work}/run.log; echo "$m {CID}" >> "$t";;\n'
        'exec) shift; shift; exec "$@";;\n'
        "esac\n"
    )
    (bin_ / "docker").chmod(0o755)
    return {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(work)}


def _sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=False
    )


OURS = "ray-demo-01234567"


def test_up_never_runs_into_a_container_that_is_not_provably_this_clusters(
    tmp_path: Path,
) -> None:
    inv = make_inventory(tmp_path)
    run = docker.docker_run_command(inv, inv.head, "sha256:abc", cluster_id=CID)
    cases = {
        "empty": ({}, 0, ""),
        "ours-unlabelled": ({OURS: ""}, 3, f"the container {OURS} on this node carries no"),
        "namesake": ({"ray-demo-fedcba98": OTHER}, 3, "another cluster of the same name"),
        "legacy-ours": ({"ray-demo": CID}, 0, ""),  # ours: `up` removes it before
        "legacy-none": ({"ray-demo": ""}, 3, "cluster id none"),
    }
    for case, (containers, code, said) in cases.items():
        work = tmp_path / case
        done = _sh(run, _fake_docker(work, containers))
        assert done.returncode == code, (case, done.stderr)
        assert said in done.stderr, (case, done.stderr)
        assert (work / "run.log").exists() == (code == 0), case  # positive control: runs
        assert not (work / "rm.log").exists(), case  # nothing removed, ever
    assert OTHER in _sh(run, _fake_docker(tmp_path / "again", {"x": OTHER})).stderr
    # one Docker call guards the start (no inspect of the name, then a ps of the label)
    guard = run[: run.index("docker run ")]
    assert guard.startswith("docker ps -a --format ") and guard.count("docker ps") == 1, guard
    assert "docker inspect" not in guard and "docker image" not in guard, guard


def test_a_start_meeting_this_clusters_own_container_replaces_it_and_nothing_else(
    tmp_path: Path,
) -> None:
    """`up` starts a node where it saw none of this cluster's containers, while an `up`
    interrupted a moment before may still be creating one there: the run that meets it
    (Docker: "Conflict") removes that one, ours by its id, and runs again."""
    inv = make_inventory(tmp_path)
    run = docker.docker_run_command(inv, inv.head, "sha256:abc", cluster_id=CID)
    work = tmp_path / "ours"
    done = _sh(run, _fake_docker(work, {OURS: CID}))
    assert done.returncode == 0, done.stderr
    assert (work / "rm.log").read_text().split() == [OURS]
    assert len((work / "run.log").read_text().splitlines()) == 1  # the second try ran
    # a run failing for another reason: its status, nothing removed, no second try
    broken = tmp_path / "broken"
    env = _fake_docker(broken, {})
    (broken / "broken").touch()
    done = _sh(run, env)
    assert done.returncode == 125 and not (broken / "rm.log").exists()
    # another cluster's container of our name is never replaced (the guard refuses first)
    other = tmp_path / "other"
    done = _sh(run, _fake_docker(other, {OURS: OTHER}))
    assert done.returncode == 3 and not (other / "rm.log").exists()


def test_down_removes_only_containers_carrying_this_clusters_id(tmp_path: Path) -> None:
    remove = docker.remove_container_command("demo", CID)
    cases = {
        "ours": ({OURS: CID}, [OURS], ""),
        "legacy-ours": ({"ray-demo": CID, OURS: CID}, [OURS, "ray-demo"], ""),
        "ours-unlabelled": ({OURS: ""}, [], f"{OURS} on this node carries no cluster id"),
        "namesake": ({"ray-demo": OTHER}, [], f"belongs to another cluster (cluster id {OTHER})"),
        "legacy-none": ({"ray-demo": ""}, [], "ray-demo on this node carries no cluster id"),
        "nothing": ({}, [], ""),
    }
    for case, (containers, removed, said) in cases.items():
        work = tmp_path / case
        done = _sh(remove, _fake_docker(work, containers))
        assert done.returncode == 0, (case, done.stderr)
        log = work / "rm.log"
        assert (log.read_text().split() if log.exists() else []) == removed, case
        assert said in done.stderr and ("left alone" in done.stderr) == bool(said), case
    # before the first `up` (no id): nothing is this cluster's, even a bare `ray-demo`
    done = _sh(
        docker.remove_container_command("demo"), _fake_docker(tmp_path / "x", {"ray-demo": ""})
    )
    assert done.returncode == 0 and not (tmp_path / "x" / "rm.log").exists()
    assert "left alone" in done.stderr


def test_this_clusters_sockets_are_those_of_its_labelled_container(tmp_path: Path) -> None:
    """The fake `exec` lists this machine's processes: a socket this test holds is among
    them when the container carries this cluster's id, and nothing is listed otherwise."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        inode = os.fstat(held.fileno()).st_ino
        command = docker.container_sockets_command("demo", CID)
        ours = _sh(command, _fake_docker(tmp_path / "ours", {OURS: CID}))
        assert str(inode) in ours.stdout.split(), ours  # positive control
        for case, containers in (("none", {OURS: ""}), ("other", {OURS: OTHER}), ("gone", {})):
            theirs = _sh(command, _fake_docker(tmp_path / case, containers))
            assert theirs.returncode == 0 and theirs.stdout == "", (case, theirs)
    assert docker.DockerRuntime(make_inventory(tmp_path), None).sockets_command() == (
        docker.container_sockets_command("demo", token.read_cluster_id(make_inventory(tmp_path)))
    )


def test_a_container_without_this_clusters_id_is_not_this_clusters_state() -> None:
    line = '{"running": true, "status": "running", "image": "sha256:x", "cluster_id": "%s"}'
    assert docker.parse_container_facts(line % OTHER, CID).status == "absent"
    assert docker.parse_container_facts(line % CID, CID).running  # positive control
    assert docker.parse_container_facts(line.replace('"%s"', "null"), CID).status == "absent"
    assert docker.parse_container_facts(line % CID).status == "absent"  # no id here yet


def test_the_cluster_id_is_made_once_private_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.node import token

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path)
    assert token.read_cluster_id(inv) == ""
    made = token.ensure_cluster_id(inv)
    path = tmp_path / "state" / "clusters" / "demo" / "cluster_id"
    assert len(made) == 16 and int(made, 16) >= 0 and path.stat().st_mode & 0o777 == 0o600
    assert token.ensure_cluster_id(inv) == made == token.read_cluster_id(inv)
    assert docker.DockerRuntime(inv, None).cluster_id == made
    path.write_text("x; rm -rf ~\n")  # anything but 16 hex digits is no id
    assert token.read_cluster_id(inv) == ""
