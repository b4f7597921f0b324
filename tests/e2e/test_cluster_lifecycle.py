"""The cluster's lifecycle on the lab: up, status, idempotence, repair, token, down, logs.

Needs the pinned image on every lab node: the session fixture `cluster_inventory` builds
the pin (images/image.lock.json, as `provisioner image build` does) and pushes it once.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.cli import run
from provisioner.cluster import read_token, tunnel
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container
from provisioner.runtime import runtime_for
from provisioner.runtime.context import cluster_context


def cli(*args: str) -> tuple[int, str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        code = run(list(args))
    return code, buf.getvalue()


def cli_json(*args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code, text = cli(*args, "--json")
    return code, json.loads(text)


@pytest.fixture(scope="module")
def inventory(cluster_inventory: Path) -> Iterator[str]:
    """The lab's inventory with the pin pushed (session fixture); Ray down at the end."""
    yield str(cluster_inventory)
    cli("down", "-i", str(cluster_inventory), "--no-logs")


LISTENERS = 'pgrep -u "$(id -u)" -f provisioner-doctor-listener'  # the doctor's, on a node


def doctor_listeners(lab: LabInfo) -> dict[str, str]:
    """Node name -> the PIDs of the doctor's temporary listeners running there."""
    from tests.e2e.helpers import ssh

    found = {n.name: ssh(lab, n, LISTENERS).stdout.split() for n in lab.nodes}
    return {name: " ".join(pids) for name, pids in found.items() if pids}


def test_up_from_nothing_then_second_up_changes_nothing(inventory: str, lab: LabInfo) -> None:
    code, first = cli_json("up", "-i", inventory)
    assert code == 0, first
    # the doctor's listeners on Ray's ports ended with each node's start (no round 3)
    assert doctor_listeners(lab) == {}
    assert first["status"]["alive_nodes"] == first["status"]["expected_nodes"] == 3
    assert all(p["ok"] for p in first["placement"]) and len(first["placement"]) == 3
    # every node held the pin (the session pushed it): the doctor's round saw that, and
    # the push asked no node again
    assert [(n["action"], n["via"]) for n in first["push"]["nodes"]] == [("none", "doctor")] * 3
    # a started head: up returned once the Jobs API answered, not merely once nodes joined
    head = load_inventory(Path(inventory)).head.name
    assert ("jobs_api" in first["timings_s"]) == (head in first["started"]), first["timings_s"]
    code, st = cli_json("status", "-i", inventory)
    assert code == 0 and st["alive_nodes"] == 3
    assert all(n["ssh_ok"] and n["image_ok"] and n["ray_alive"] for n in st["nodes"])
    code, second = cli_json("up", "-i", inventory)
    assert code == 0 and second["started"] == [] and second["changed"] is False


def container_started(lab: LabInfo, node: LabNode, container: str) -> tuple[str, str]:
    """The node's Ray container as its Docker tells it: (its ID, when it started)."""
    from tests.e2e.helpers import ssh

    seen = ssh(lab, node, f"docker inspect -f '{{{{.Id}}}} {{{{.State.StartedAt}}}}' {container}")
    assert seen.returncode == 0, (node.name, seen.stderr)
    cid, started = seen.stdout.split()
    return cid, started


def test_dead_worker_is_restarted_alone(inventory: str, lab: LabInfo) -> None:
    from provisioner.cluster import headprobe
    from provisioner.remote import Pool
    from tests.e2e.helpers import ssh

    assert cli_json("up", "-i", inventory)[0] == 0  # idempotent: the cluster up, all of it
    inv = load_inventory(Path(inventory))
    container = ray_container(inv)  # named by the cluster's id, which `up` wrote
    worker, others = lab.nodes[2], lab.nodes[:2]
    before = {n.name: container_started(lab, n, container) for n in lab.nodes}
    gone = ssh(lab, worker, "docker rm -f " + container)
    assert gone.returncode == 0, gone.stderr  # the container was there, and is removed
    code, st = cli_json("status", "-i", inventory)
    assert code == 1
    dead = next(n for n in st["nodes"] if n["host"] == worker.address)
    assert dead["container"] == "absent" and not dead["ray_alive"]
    code, again = cli_json("up", "-i", inventory)
    assert code == 0 and again["started"] == [worker.name]
    # on the worker: a new Ray container, running, with a raylet in it
    new_id, _ = container_started(lab, worker, container)
    assert new_id != before[worker.name][0]
    running = ssh(lab, worker, f"docker inspect -f '{{{{.State.Running}}}}' {container}")
    assert running.stdout.strip() == "true", running.stdout + running.stderr
    raylet = ssh(lab, worker, f"docker exec {container} pgrep -f raylet")
    assert raylet.returncode == 0 and raylet.stdout.split(), raylet.stderr
    # the other nodes' containers are the same ones, never restarted
    for node in others:
        assert container_started(lab, node, container) == before[node.name], node.name
    # the cluster sees the worker: the GCS lists it alive, and a task pinned to it runs there
    # (the removed raylet left without a goodbye: the GCS lists it alive beside the new one
    # until its health checks fail; wait for that, to a deadline)
    with Pool(inv) as pool:
        session = pool.session(inv.head)
        deadline = time.monotonic() + 120
        while True:
            listed = headprobe.gcs_nodes(session, runtime_for(inv))
            alive = [n for n in listed if n.alive and n.ip == worker.address]
            if len(alive) == 1 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert len(alive) == 1, listed
        placed = headprobe.placement(session, runtime_for(inv), [alive[0].node_id])
    assert [(p["ok"], p.get("ran_on")) for p in placed] == [(True, worker.address)], placed


def test_a_start_meeting_this_clusters_own_container_replaces_it(
    inventory: str, lab: LabInfo
) -> None:
    """A worker's start (the command `up` sends) when a container of this cluster's id
    already holds the name, as an interrupted `up`'s `docker run` leaves one (created, not
    yet started) after the status round saw none: on the node's real Docker, the start
    replaces it and Ray runs and joins; a container of that name without this cluster's
    id is refused and left alone (the control)."""
    from provisioner.cluster import headprobe
    from provisioner.remote import Pool
    from tests.e2e.helpers import ssh

    assert cli_json("up", "-i", inventory)[0] == 0
    inv = load_inventory(Path(inventory))
    container = ray_container(inv)
    worker = lab.nodes[2]
    node = next(n for n in inv.nodes if n.address == worker.address)
    image = ssh(lab, worker, f"docker inspect -f '{{{{.Image}}}}' {container}").stdout.strip()
    cluster_id = ssh(
        lab,
        worker,
        f"docker inspect -f '{{{{index .Config.Labels \"provisioner.cluster-id\"}}}}' {container}",
    ).stdout.strip()
    assert image and cluster_id
    leftover = (
        f"docker rm -f {container} >/dev/null && docker create --name {container} "
        f"--label provisioner.cluster={inv.cluster} --label provisioner.cluster-id={cluster_id} "
        f"{image} true"
    )
    made = ssh(lab, worker, leftover)
    assert made.returncode == 0, made.stderr
    with Pool(inv) as pool:
        start = cluster_context(inv).runtime.start_command(node)
        started = pool.session(node).run(start, timeout=120)
        assert started.exit_code == 0, started.stderr[-2000:]
        now = ssh(
            lab, worker, f"docker inspect -f '{{{{.Id}}}} {{{{.State.Running}}}}' {container}"
        )
        new_id, running = now.stdout.split()
        assert new_id != made.stdout.strip() and running == "true", now.stdout  # replaced
        session = pool.session(inv.head)
        deadline = time.monotonic() + 120
        while True:  # the new raylet joins (the old one leaves after its health checks)
            listed = headprobe.gcs_nodes(session, runtime_for(inv))
            if any(n.alive and n.ip == worker.address for n in listed):
                break
            assert time.monotonic() < deadline, listed
            time.sleep(2)
        raylet = ssh(lab, worker, f"docker exec {container} pgrep -f raylet")
        assert raylet.returncode == 0 and raylet.stdout.split(), raylet.stderr
        # the control: a container of that name without this cluster's id is not replaced
        stranger = ssh(
            lab,
            worker,
            f"docker rm -f {container} >/dev/null && docker create --name {container} {image} true",
        )
        assert stranger.returncode == 0, stranger.stderr
        refused = pool.session(node).run(start, timeout=120)
        assert refused.exit_code == 3 and "carries no cluster id" in refused.stderr, refused.stderr
        kept = ssh(lab, worker, f"docker inspect -f '{{{{.Id}}}}' {container}")
        assert kept.stdout.strip() == stranger.stdout.strip()  # left alone
    ssh(lab, worker, f"docker rm -f {container}")
    assert cli_json("up", "-i", inventory)[0] == 0  # the worker back for the next tests


# Every executable of the node's usual PATH linked into one directory, minus Python: a
# node with no python3 on the plain PATH (the login shell still finds it, via /etc/profile).
NO_PYTHON_PATH = (
    "np=$(mktemp -d); trap 'rm -rf \"$np\"' EXIT; "
    "for f in /usr/local/sbin/* /usr/local/bin/* /usr/sbin/* /usr/bin/* /sbin/* /bin/*; do "
    "n=${f##*/}; case $n in python*) continue ;; esac; "
    '[ -e "$np/$n" ] || ln -s "$f" "$np/$n"; done; '
)


def test_facts_fallbacks_tell_the_same_docker_facts(inventory: str, lab: LabInfo) -> None:
    """The doctor's facts.sh reads Docker through its socket with python3; with DOCKER_HOST
    set, or with no python3 on PATH, the docker CLI answers. On a real node holding the
    cluster's container and the pinned image, all three must tell the same facts."""

    from provisioner.doctor.gather import facts_script
    from provisioner.image.pin import read_pin
    from provisioner.runtime import judges
    from provisioner.runtime.docker.doctor import DockerFacts
    from tests.e2e.helpers import ssh_args

    inv = load_inventory(Path(inventory))
    assert inv.image_lock is not None
    pin = read_pin(inv.image_lock).image_id
    node = lab.nodes[1]
    docker = judges("docker")
    script = facts_script(docker).decode()  # facts.sh with the docker runtime's section
    args = f"bash -s -- {inv.head.address} {node.address} {pin} '' 0"

    def facts(prefix: str) -> NodeFacts:
        run = subprocess.run(
            [*ssh_args(lab, node), prefix + args],
            input=script,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
        return parse_facts(node.name, run.stdout, runtime=docker.parse)

    api = facts("")
    cli_ = facts("DOCKER_HOST=unix:///var/run/docker.sock ")
    no_python = facts(NO_PYTHON_PATH + 'PATH="$np" ')
    assert api.complete and cli_.complete and no_python.complete
    seen = api.runtime
    assert isinstance(seen, DockerFacts)
    assert seen.usable and seen.image.startswith(pin)
    assert seen.holds_cluster(inv.cluster, running=True)
    assert api.plain.python3_version and no_python.plain.python3 is None
    for other in (cli_, no_python):
        o = other.runtime
        assert isinstance(o, DockerFacts)
        assert (o.version, o.usable, o.root, o.image) == (
            seen.version,
            seen.usable,
            seen.root,
            seen.image,
        )
        assert o.containers == seen.containers


def test_up_passes_while_the_gcs_still_lists_a_killed_raylet(inventory: str, lab: LabInfo) -> None:
    """A worker's Ray killed without a goodbye and back at once (its container restarted):
    for a while the GCS lists two alive node IDs at its address. `up` must see the node as
    fine, and its placement probe must not pick the dead ID."""
    from provisioner.cluster import headprobe
    from provisioner.remote import Pool
    from tests.e2e.helpers import ssh

    inv = load_inventory(Path(inventory))
    worker = lab.nodes[1]
    container = ray_container(inv)
    ssh(lab, worker, f"docker kill -s KILL {container} && docker start {container}")
    both: list[headprobe.GcsNode] = []
    with Pool(inv) as pool:
        for _ in range(40):  # until the replacement registered beside the old ID
            listed = headprobe.gcs_nodes(pool.session(inv.head), runtime_for(inv))
            both = [n for n in listed if n.alive and n.ip == worker.address]
            if len(both) == 2:
                break
            time.sleep(0.5)
    assert len(both) == 2, f"the GCS never listed both IDs at {worker.address}: {both}"
    code, result = cli_json("up", "-i", inventory)
    assert code == 0, result
    assert result["started"] == [], result["started"]
    assert len(result["placement"]) == 3 and all(p["ok"] for p in result["placement"])


def test_up_and_status_through_a_jump_host(inventory: str, lab: LabInfo, tmp_path: Path) -> None:
    """A worker that drops SSH from the control machine, reached through the head (`jump`
    in the inventory): `up` restarts its missing Ray container there, `status` sees it."""
    from provisioner.lab.engine import exec_rc
    from tests.e2e.helpers import jumped_inventory, ssh_only_through_a_jump

    worker = lab.nodes[2]
    jumped = jumped_inventory(Path(inventory), tmp_path / "jumped.yaml", lab, worker)
    rc, said = exec_rc(worker.container, f"docker rm -f {ray_container(load_inventory(jumped))}")
    assert rc == 0, said
    with ssh_only_through_a_jump(lab, worker):
        code, up = cli_json("up", "-i", str(jumped))
        st_code, st = cli_json("status", "-i", str(jumped))
    assert code == 0 and up["started"] == [worker.name], up
    assert st_code == 0 and st["alive_nodes"] == 3, st
    assert next(n for n in st["nodes"] if n["name"] == worker.name)["ssh_ok"]


def test_jobs_api_needs_the_token(inventory: str) -> None:
    inv = load_inventory(Path(inventory))
    with tunnel(inv, runtime=cluster_context(inv, with_pin=False).runtime) as url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/api/jobs/", timeout=10)
        assert refused.value.code in (401, 403)
        request = urllib.request.Request(
            f"{url}/api/jobs/", headers={"Authorization": f"Bearer {read_token(inv)}"}
        )
        with urllib.request.urlopen(request, timeout=10) as ok:
            assert ok.status == 200


def test_token_not_in_json_or_ps(inventory: str, lab: LabInfo) -> None:
    from tests.e2e.helpers import ssh

    secret = read_token(load_inventory(Path(inventory)))
    assert cli_json("up", "-i", inventory)[0] == 0  # idempotent: Ray on every node
    code, text = cli("status", "-i", inventory, "--json")
    assert code == 0 and json.loads(text)["alive_nodes"] == 3  # Ray runs on every node
    assert secret not in text
    for node in lab.nodes:
        ps = ssh(lab, node, "ps auxww").stdout
        # positive control: this `ps` shows Ray's own processes and their command lines
        assert "raylet" in ps and "node_manager_port" in ps, (node.name, ps[-2000:])
        if node == lab.nodes[0]:
            assert "gcs_server" in ps, ps[-2000:]
        assert secret not in ps, node.name


LISTENING = "cat /proc/net/tcp /proc/net/tcp6"  # every TCP socket of the node's network


def listening(lab: LabInfo, node: LabNode) -> set[int]:
    """The TCP ports a node listens on, read from its kernel's socket tables (not `ss`,
    which the tool's own check uses): state 0A is LISTEN."""
    from tests.e2e.helpers import ssh

    tables = ssh(lab, node, LISTENING)
    assert tables.returncode == 0, tables.stderr
    ports = set()
    for line in tables.stdout.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and ":" in fields[1]:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_down_collects_logs_and_frees_ports(inventory: str, lab: LabInfo, tmp_path: Path) -> None:
    inv = load_inventory(Path(inventory))
    ray = inv.ports.all_ports()
    code, up = cli_json("up", "-i", inventory)  # idempotent: a cluster to take down
    assert code == 0, up
    # positive control: while the cluster is up, each node listens on Ray's ports there
    held = {n.name: listening(lab, n) & ray for n in lab.nodes}
    head = inv.ports
    assert {head.gcs, head.node_manager, head.object_manager} <= held[lab.nodes[0].name], held
    for node in lab.nodes[1:]:
        assert {head.node_manager, head.object_manager} <= held[node.name], held
    code, result = cli_json("down", "-i", inventory, "-o", str(tmp_path / "logs"))
    assert code == 0 and result["ok"] and result["ports_busy"] == {}
    # on each node, none of Ray's ports (the worker range included) listens any more
    assert {n.name: listening(lab, n) & ray for n in lab.nodes} == {
        n.name: set() for n in lab.nodes
    }
    for member in inv.nodes:
        assert (tmp_path / "logs" / member.name / "ray" / "raylet.out").exists()
    code, st = cli_json("status", "-i", inventory)
    assert code == 1 and st["alive_nodes"] == 0
    assert all(n["container"] == "absent" for n in st["nodes"])
    code, _ = cli_json("down", "-i", inventory, "--no-logs")
    assert code == 0


def test_cut_between_worker_and_head_stops_up_within_seconds(inventory: str, lab: LabInfo) -> None:
    head, worker = lab.nodes[0], lab.nodes[1]
    faults.cut(lab, head, worker)
    try:
        t0 = time.monotonic()
        code, result = cli_json("up", "-i", inventory)
        elapsed = time.monotonic() - t0
    finally:
        faults.uncut(lab, head, worker)
    assert code == 1 and result["stopped_by"] == "doctor", result
    assert elapsed < 30, f"up took {elapsed:.0f}s to stop"
    cut = [f for f in result["doctor"]["blocking"] if f["check"] == "net.reachability"]
    assert cut, result["doctor"]["blocking"]
    named = " ".join(f"{f['host']} {f['message']} {f['evidence']}" for f in cut)
    assert worker.name in named or worker.address in named, named
    code, st = cli_json("status", "-i", inventory)
    assert code == 1 and all(n["container"] == "absent" for n in st["nodes"]), st
    assert doctor_listeners(lab) == {}  # a doctor that stops `up` ends its listeners too


def test_doctor_listeners_left_for_up_end_and_nothing_else_does(
    inventory: str, lab: LabInfo
) -> None:
    """The doctor `up` runs leaves its listeners on Ray's ports for `up`'s start to end
    (keep_listeners); the command that ends one kills only a process that is still that
    listener: a PID given to another process since is left alone."""
    from provisioner.doctor import run_doctor
    from provisioner.doctor.gather import stop_listener_command, stop_listeners
    from provisioner.remote import Pool
    from tests.e2e.helpers import ssh

    inv = load_inventory(Path(inventory))
    head = lab.nodes[0]
    with Pool(inv) as pool:
        report = run_doctor(
            cluster_context(inv, lenient_pin=True), pool, ray_state=True, keep_listeners=True
        )
        try:
            assert report.round_trips == 2
            # positive control: every node still runs the listener the report names
            assert set(report.listeners) == {n.name for n in lab.nodes}, report.listeners
            running = doctor_listeners(lab)
            for name, pid in report.listeners.items():
                assert running.get(name) == str(pid), (name, pid, running)
            # a process of the same user that is not the listener survives its command
            other = ssh(lab, head, "sleep 300 >/dev/null 2>&1 & echo $!").stdout.strip()
            try:
                done = ssh(lab, head, stop_listener_command(int(other)))
                assert done.returncode == 0, done.stderr
                assert ssh(lab, head, f"kill -0 {other}").returncode == 0
            finally:
                ssh(lab, head, f"kill {other}")
            # the listener itself ends by the same command
            pid = report.listeners[head.name]
            assert ssh(lab, head, stop_listener_command(pid)).returncode == 0
            deadline = time.monotonic() + 30  # until the process is gone, or the deadline
            while head.name in doctor_listeners(lab) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert head.name not in doctor_listeners(lab)
        finally:
            stop_listeners(pool, inv, report.listeners)
    assert doctor_listeners(lab) == {}


def test_up_with_a_worker_ssh_cannot_reach_names_it_and_starts_nothing(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """`up` connects to the nodes while it loads (a warm pool): a worker that drops SSH
    from this machine is the doctor's `ssh.connect` error on that worker, no other node
    is blamed, nothing starts, and no doctor listener is left on the nodes it reached."""
    from tests.e2e.faults.lab import edited_inventory

    short = edited_inventory(
        Path(inventory), tmp_path / "inventory.yaml", ssh={"connect_timeout": 3}
    )
    worker = lab.nodes[2]
    faults.isolate(lab, worker)
    try:
        code, result = cli_json("up", "-i", str(short))
    finally:
        faults.unisolate(lab, worker)
    assert code == 1 and result["stopped_by"] == "doctor", result
    blocking = result["doctor"]["blocking"]
    assert {(f["host"], f["check"]) for f in blocking} == {(worker.name, "ssh.connect")}, blocking
    code, st = cli_json("status", "-i", inventory)
    assert all(n["container"] == "absent" for n in st["nodes"]), st
    assert doctor_listeners(lab) == {}


def test_down_of_a_cluster_never_up_names_each_node_once(lab: LabInfo, tmp_path: Path) -> None:
    """`down` of a cluster never started here, one worker refusing SSH (a port where its
    sshd does not listen): the refusing worker's error names it once ("w: connection
    refused", not "w: w: ..."); the logs of the nodes reached are kept and named (the
    positive control of the line a cluster with no node's logs no longer prints)."""
    import yaml

    from tests.e2e.faults.lab import edited_inventory

    path = edited_inventory(lab.inventory, tmp_path / "inventory.yaml", cluster="neverup")
    document = yaml.safe_load(path.read_text())
    refusing = document["workers"][-1]
    refusing["port"] = 1  # nothing listens there on the node: connections refused
    path.write_text(yaml.safe_dump(document))
    logs = tmp_path / "logs"
    code, out = cli("down", "-i", str(path), "-o", str(logs))
    name = refusing["name"]
    assert code == 1, out
    assert f"{name}: connection refused" in out and f"{name}: {name}:" not in out, out
    assert f"logs: {logs}" in out, out
    reached = {document["head"]["name"], *(w["name"] for w in document["workers"][:-1])}
    assert {p.name for p in logs.iterdir()} == reached
    # the same cluster with every node refusing: no logs came, none named, no folder kept
    for node in [document["head"], *document["workers"]]:
        node["port"] = 1
    path.write_text(yaml.safe_dump(document))
    none = tmp_path / "none"
    code, out = cli("down", "-i", str(path), "-o", str(none))
    assert code == 1 and "logs:" not in out and not none.exists(), out
    assert f"{name}: connection refused" in out and f"{name}: {name}:" not in out, out
