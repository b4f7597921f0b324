"""Host mode on a lab of its own: Ray from each node's virtualenv, no container, no image.

The lab's nodes (`lab up --runtime host`) hold a virtualenv built from the locked wheels,
activated from ~/.profile: `ray` is on a login shell's PATH only, as in the blog post's
setup. The inventory says `runtime: host`. The path is the user's: doctor, up, PPO with
env runners on every node, status, logs, down; then no Ray process of the cluster is left
on any node, and a process that only looks like Ray (another user's) is still there:
`down` never runs `ray stop`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from provisioner.lab.config import LabNode
from provisioner.lab.engine import docker_cli, exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.local import state_root
from provisioner.node import layout
from tests.e2e.faults.lab import _SSHD_BACK as SSHD_BACK
from tests.e2e.helpers import cli, cli_json, ssh, tune_checkpoints_come_home

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
VENV = "/home/lab/ray-venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
LOCKED_RAY = "2.60.0"
OTHER_RAY = "2.59.0"  # a real release: its wheel comes from the package index once


def as_root(node: LabNode, script: str, timeout: float = 180) -> str:
    rc, out = exec_rc(node.container, script, timeout=timeout)
    assert rc == 0, f"{node.name}: {script!r} failed: {out[-2000:]}"
    return out


def cluster_processes(lab: LabInfo, node: LabNode, cluster: str) -> list[str]:
    """Processes on the node whose command line names this cluster's Ray temp dir, plus
    every raylet and GCS (ps as the SSH user sees it: every user's processes)."""
    listing = ssh(lab, node, "ps -e -ww -o pid=,comm=,args=").stdout
    mark = layout.node_short_ray_dir(cluster) + "/"
    return [
        line
        for line in listing.splitlines()
        if mark in line or line.split()[1:2] in (["raylet"], ["gcs_server"])
    ]


@pytest.fixture(scope="module")
def inventory(host_lab: LabInfo) -> str:
    return str(host_lab.inventory)


@pytest.fixture(scope="module")
def other_ray_wheel() -> Path:
    """The wheel of another Ray release, downloaded once into the state dir's cache."""
    cache = state_root() / "cache" / "other-ray"
    found = sorted(cache.glob(f"ray-{OTHER_RAY}-cp311-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary",
             ":all:", "--python-version", "3.11", "--platform", "manylinux2014_x86_64", "-d",
             str(cache), f"ray=={OTHER_RAY}"],
            check=True,
            timeout=600,
        )  # fmt: skip
        found = sorted(cache.glob(f"ray-{OTHER_RAY}-cp311-*.whl"))
    assert found, f"no ray {OTHER_RAY} wheel in {cache}"
    return found[0]


@contextmanager
def other_ray_in_venv(node: LabNode, wheel: Path) -> Iterator[None]:
    """The node's virtualenv gets another Ray release (pip, --no-deps); the locked one is
    kept as hard links beside it and put back afterwards."""
    keep = "/home/lab/ray-locked"
    as_root(
        node,
        f"rm -rf {keep} && mkdir -p {keep} && "
        f"cp -al {SITE}/ray {SITE}/ray-{LOCKED_RAY}.dist-info {keep}/",
    )
    docker_cli(["cp", str(wheel), f"{node.container}:/tmp/{wheel.name}"])
    try:
        as_root(
            node,
            f"su lab -c '{VENV}/bin/python -m pip install --quiet --no-deps --no-index "
            f"/tmp/{wheel.name}'",
            timeout=300,
        )
        yield
    finally:
        as_root(
            node,
            f"rm -rf {SITE}/ray {SITE}/ray-{OTHER_RAY}.dist-info /tmp/{wheel.name} && "
            f"mv {keep}/ray {keep}/ray-{LOCKED_RAY}.dist-info {SITE}/ && rm -rf {keep}",
        )


def test_nodes_have_ray_on_the_login_path_only(host_lab: LabInfo) -> None:
    node = host_lab.nodes[1]
    plain = ssh(host_lab, node, "command -v ray || echo none")
    login = ssh(host_lab, node, "bash --login -c 'ray --version'")
    assert plain.stdout.strip() == "none"
    assert login.returncode == 0 and LOCKED_RAY in login.stdout, login.stderr


def test_doctor_in_host_mode(inventory: str, host_lab: LabInfo) -> None:
    code, doc, err = cli_json("doctor", "-i", inventory)
    assert code == 0, err[-3000:]
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert errors == []
    names = {n.name for n in host_lab.nodes}
    by_check: dict[str, set[str]] = {}
    for f in doc["findings"]:
        if f["severity"] == "ok":
            by_check.setdefault(f["check"], set()).add(f["host"])
    for check in ("ray.python", "python.version", "ray.version", "rllib.version"):
        assert by_check.get(check) == names, (check, by_check.get(check))
    assert by_check.get("ray.control") == {"local"}
    # the blog post's setup: found through a login shell, said once per node as a warning
    login_only = {f["host"] for f in doc["findings"] if f["check"] == "shell.env"}
    assert login_only == names
    assert not any(f["check"].startswith(("docker.", "image.")) for f in doc["findings"])


def test_doctor_names_both_ray_versions(
    inventory: str, host_lab: LabInfo, other_ray_wheel: Path
) -> None:
    odd = host_lab.nodes[2]
    with other_ray_in_venv(odd, other_ray_wheel):
        code, doc, err = cli_json("doctor", "-i", inventory)
    assert code == 1, err[-3000:]
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert {f["host"] for f in errors} == {odd.name}
    (ray,) = [f for f in errors if f["check"] == "ray.version"]
    assert OTHER_RAY in ray["message"] and LOCKED_RAY in ray["message"]
    assert {f["check"] for f in errors} <= {"ray.version", "rllib.version"}
    # undone: the node's virtualenv holds the locked Ray again
    again = ssh(host_lab, odd, "bash --login -c 'ray --version'")
    assert LOCKED_RAY in again.stdout


def test_doctor_names_each_nodes_python_on_a_lab_of_two_debian_releases(
    host_lab_mixed: LabInfo,
) -> None:
    """The lab's trixie node (Debian 13, Python 3.13) holds the same Ray in a virtualenv of
    its own Python, beside bookworm nodes (Python 3.11): the doctor names 3.13 against 3.11
    on that node, with its fix, and `up` stops there before anything starts."""
    inventory = str(host_lab_mixed.inventory)
    odd = {n.name for n in host_lab_mixed.nodes if n.flavour == "trixie"}
    same = {n.name for n in host_lab_mixed.nodes} - odd
    assert odd and same
    code, doc, err = cli_json("doctor", "-i", inventory)
    assert code == 1, err[-3000:]
    pythons = {f["host"]: f for f in doc["findings"] if f["check"] == "python.version"}
    assert {h for h, f in pythons.items() if f["severity"] == "error"} == odd
    assert {h for h, f in pythons.items() if f["severity"] == "ok"} == same  # positive control
    for host in odd:
        found = pythons[host]
        assert "Python 3.13." in found["message"] and "3.11." in found["message"], found
        assert f"{VENV}/bin/python" in found["message"]
        assert "Python 3.11" in found["fix"] and f"ray[default,rllib]=={LOCKED_RAY}" in found["fix"]
    # the same Ray on every node: only the Python (and what depends on it) differs
    rays = {f["host"]: f["severity"] for f in doc["findings"] if f["check"] == "ray.version"}
    assert rays == dict.fromkeys(odd | same, "ok")
    code, up, err = cli_json("up", "-i", inventory)
    assert code != 0 and up.get("stopped_by") == "doctor", (code, err[-2000:])
    for node in host_lab_mixed.nodes:
        assert cluster_processes(host_lab_mixed, node, host_lab_mixed.name) == []


def test_up_train_status_logs_down(inventory: str, host_lab: LabInfo, tmp_path: Path) -> None:
    cluster = host_lab.name
    head = host_lab.nodes[0]
    # Something on the head that merely looks like Ray (as another user's Ray would to
    # `ray stop`, which matches by name): `down` must leave it alone.
    decoy = ssh(
        host_lab, head, "setsid bash -c 'exec -a raylet sleep 600' >/dev/null 2>&1 & echo $!"
    )
    decoy_pid = decoy.stdout.strip()
    assert decoy_pid.isdigit(), decoy.stderr
    try:
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        assert up["runtime"] == "host" and up["push"] is None
        assert up["totals"]["nodes"] == 3
        assert sorted(p["ip"] for p in up["placement"] if p["ok"]) == sorted(
            n.address for n in host_lab.nodes
        )
        # detached: the SSH sessions of `up` are gone, Ray runs on in its own session
        for node in host_lab.nodes:
            own = cluster_processes(host_lab, node, cluster)
            assert any(" raylet " in f" {line} " for line in own), own
        code, again, err = cli_json("up", "-i", inventory)
        assert code == 0 and again["changed"] is False, err[-3000:]

        code, st, err = cli_json("status", "-i", inventory)
        assert code == 0, err[-3000:]
        assert st["runtime"] == "host" and st["alive_nodes"] == 3 and st["healthy"]

        # PPO with the default env runners (the cluster's CPUs minus one): every node
        playbook = str(PLAYBOOKS / "ppo_cartpole.py")
        code, out, err = cli(
            "submit", "-i", inventory, "--results", str(tmp_path), "--json", playbook,
            "--", "--train-batch", "300", "--max-iterations", "2",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = json.loads(out)
        assert job["status"] == "SUCCEEDED"
        runners = json.loads((tmp_path / job["job_id"] / "runners.json").read_text())
        assert {r["node_ip"] for r in runners} == {n.address for n in host_lab.nodes}, runners

        # an unchanged Tune script checkpointing on a worker: the head's store, the same
        # user process as under Docker (issue 44, item 3), its checkpoints home
        tune_checkpoints_come_home(inventory, tmp_path, [n.address for n in host_lab.nodes[1:]])

        code, collected, err = cli_json("logs", "-i", inventory, "-o", str(tmp_path / "logs"))
        assert code == 0 and sorted(collected["nodes"]) == sorted(n.name for n in host_lab.nodes)
        for node in host_lab.nodes:
            got = tmp_path / "logs" / node.name
            assert (got / "ray" / "raylet.out").stat().st_size > 0
            assert "ray start with" in (got / "host.log").read_text()

        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]
        for node in host_lab.nodes:
            assert cluster_processes(host_lab, node, cluster) == []
        alive = ssh(host_lab, head, f"kill -0 {decoy_pid} && echo alive")
        assert alive.stdout.strip() == "alive", "down stopped a process that was not its own"
        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]  # twice is fine
    finally:
        ssh(host_lab, head, f"kill {decoy_pid}")
        cli("down", "-i", inventory, "--no-logs")


# --- another user on the nodes: their processes are never this cluster's

INTRUDER = "intruder"  # a second unix user on every node
SSHD_LAB = "/etc/ssh/sshd_config.d/lab.conf"  # the lab's own sshd settings


def own_raylets(node: LabNode, user: str, cluster: str) -> list[str]:
    """PIDs of `user`'s raylets of the cluster (run as root in the node: every process)."""
    mark = layout.node_short_ray_dir(cluster) + "/"
    out = as_root(node, f"ps -u {user} -ww -o pid=,comm=,args= || true")
    return [
        line.split()[0]
        for line in out.splitlines()
        if line.split()[1:2] == ["raylet"] and mark in line
    ]


@contextmanager
def intruder_decoys(lab: LabInfo, cluster: str) -> Iterator[dict[str, list[str]]]:
    """On every node, processes of another user whose command lines name this cluster's
    temp dir: one called raylet (a copy of bash, as Ray's own raylet would show in `ps`)
    and one that only names the path; node -> their PIDs. Removed afterwards."""
    mark = layout.node_short_ray_dir(cluster)
    script = (
        "cd\n"
        f"setsid ./raylet -c 'sleep 900; :' {mark}/session_latest </dev/null >/dev/null 2>&1 &\n"
        "echo $!\n"
        f"setsid bash -c 'exec -a \"ray::worker {mark}/sockets/raylet\" sleep 900' "
        "</dev/null >/dev/null 2>&1 &\n"
        "echo $!\n"
    )
    pids = {}
    for node in lab.nodes:
        home = f"/home/{INTRUDER}"
        as_root(
            node,
            f"id {INTRUDER} >/dev/null 2>&1 || useradd -m {INTRUDER}; "
            f"cp /bin/bash {home}/raylet && printf %s {shlex.quote(script)} > {home}/decoys && "
            f"chown {INTRUDER} {home}/raylet {home}/decoys",
        )
        out = as_root(node, f"su {INTRUDER} -s /bin/sh -c 'sh {home}/decoys'")
        pids[node.name] = out.split()
        assert len(pids[node.name]) == 2 and all(p.isdigit() for p in pids[node.name]), out
    try:
        yield pids
    finally:
        for node in lab.nodes:
            as_root(node, f"kill -9 {' '.join(pids[node.name])} 2>/dev/null; true")


@contextmanager
def root_login(lab: LabInfo) -> Iterator[None]:
    """The lab's key accepted for root too: the lab's sshd says `PermitRootLogin no`,
    changed for the test to sshd's default (root by key only); root's authorized_keys
    and sshd's setting put back as they were."""
    for node in lab.nodes:
        as_root(
            node,
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh && "
            "{ [ -e /root/.ssh/authorized_keys ] && cp -p /root/.ssh/authorized_keys "
            "/root/.ssh/authorized_keys.e2e-keep; true; } && "
            "cat /home/lab/.ssh/authorized_keys >> /root/.ssh/authorized_keys && "
            "chmod 600 /root/.ssh/authorized_keys && "
            f"sed -i 's/^PermitRootLogin no$/PermitRootLogin prohibit-password/' {SSHD_LAB} && "
            "kill -HUP $(cat /run/sshd.pid) && " + SSHD_BACK,
        )
    try:
        yield
    finally:
        for node in lab.nodes:
            as_root(
                node,
                "if [ -e /root/.ssh/authorized_keys.e2e-keep ]; then mv -f "
                "/root/.ssh/authorized_keys.e2e-keep /root/.ssh/authorized_keys; "
                "else rm -f /root/.ssh/authorized_keys; fi; "
                f"sed -i 's/^PermitRootLogin prohibit-password$/PermitRootLogin no/' {SSHD_LAB} "
                "&& kill -HUP $(cat /run/sshd.pid) && " + SSHD_BACK,
            )


def as_user_inventory(lab: LabInfo, tmp_path: Path, user: str, cluster: str) -> Path:
    """The host lab's inventory for another SSH user and cluster name (Ray from the lab
    user's virtualenv, named, since root's login shell does not activate it)."""
    document = yaml.safe_load(lab.inventory.read_text())
    document["cluster"] = cluster
    document["ssh"].update(user=user, key=str(lab.key), known_hosts=str(lab.known_hosts))
    document["ray"] = {**(document.get("ray") or {}), "python": f"{VENV}/bin/python"}
    path = tmp_path / f"{user}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_another_users_processes_naming_the_clusters_temp_dir_survive_up_and_down(
    host_lab: LabInfo, tmp_path: Path
) -> None:
    """A second unix user runs, on every node, a `raylet` and a Ray-looking worker whose
    command lines name this cluster's /tmp/prov-NAME/. `up` and `down` as the lab user
    and as root (who could kill them) take only the SSH user's own processes."""
    from tests.e2e.faults.record import scenario

    runs: dict[str, float] = {}
    with (
        scenario(
            "another user's processes naming the cluster's temp dir (host mode), SSH user and root",
            "`up` and `down` succeed and take only the SSH user's own Ray processes, marked "
            "by the cluster's id; the other user's processes live on",
            kind="security",
        ) as s,
        root_login(host_lab),
    ):
        # a cluster name for each SSH user: /tmp/prov-NAME is one user's (the other's up
        # is refused there, as it should be)
        for user, cluster in (("lab", f"{host_lab.name}-x"), ("root", f"{host_lab.name}-r")):
            with intruder_decoys(host_lab, cluster) as decoys:
                for node in host_lab.nodes:  # they do name the temp dir: `ps -e` shows it
                    listing = as_root(node, "ps -e -ww -o pid=,args=")
                    named = [
                        ln.split()[0]
                        for ln in listing.splitlines()
                        if f"/tmp/prov-{cluster}/" in ln
                    ]
                    assert set(decoys[node.name]) <= set(named), (named, decoys)
                    s.saw(named=True)
                inventory = str(as_user_inventory(host_lab, tmp_path, user, cluster))
                t0 = time.monotonic()
                try:
                    code, up, err = cli_json("up", "-i", inventory)
                    s.expect("up", code, 0, err[-2000:] + json.dumps(up)[-3000:])
                    s.expect("alive", up["status"]["alive_nodes"], 3, str(up["status"]))
                    ours = sum(bool(own_raylets(n, user, cluster)) for n in host_lab.nodes)
                    s.expect("ours", ours, len(host_lab.nodes), user)  # positive control
                    code, down, err = cli_json("down", "-i", inventory, "--no-logs")
                    assert code == 0 and down["ok"], err[-3000:]
                    s.saw(down=code)
                finally:
                    cli("down", "-i", inventory, "--no-logs")
                runs[user] = time.monotonic() - t0
                left, survived = 0, 0
                for node in host_lab.nodes:
                    assert own_raylets(node, user, cluster) == [], (user, node.name)
                    left += len(own_raylets(node, user, cluster))
                    pids = " ".join(decoys[node.name])
                    alive = as_root(node, f"kill -0 {pids} && echo alive")
                    assert alive.strip() == "alive", f"{user}'s down stopped another user's process"
                    survived += alive.strip() == "alive"
                s.saw(left=left, survived=survived)
        s.saw(users=list(runs))
        s.observed = (
            "the other user's raylet and Ray-looking worker, on every node, named the "
            "cluster's temp dir in `ps -e`: {named}; as each of {users}: `up` exit {up} with "
            "{alive} nodes alive and the SSH user's own raylet on {ours}, `down` exit {down} "
            "with {left} left; the other user's processes alive after both on {survived} nodes"
        )
        s.measure(runs=[f"up+down as {u}: {t:.0f} s" for u, t in runs.items()])
        s.measured = "{runs}"
