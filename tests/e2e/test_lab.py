"""The lab's promises, end to end: real sshd, real dockerd, strict host keys, faults and undo."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import time

import pytest

from provisioner.image.base_image import ensure_base_image
from provisioner.lab import faults
from provisioner.lab.config import LABEL, LabConfig
from provisioner.lab.engine import client, exec_rc
from provisioner.lab.nodes import LabInfo, lab_down, lab_up
from tests.cli import cli
from tests.e2e.helpers import ssh, ssh_args


def _nodes(lab: LabInfo) -> list[str]:
    return [n.name for n in lab.nodes]


def test_each_node_takes_key_login_with_strict_host_keys_and_runs_docker_without_sudo(
    lab: LabInfo,
) -> None:
    for node in lab.nodes:
        r = ssh(lab, node, "id -un; hostname; docker info --format '{{.ServerVersion}}'")
        assert r.returncode == 0, r.stderr
        user, hostname, server = r.stdout.split()
        assert (user, hostname) == ("lab", node.name)
        assert server  # dockerd answered the non-root user
        assert ssh(lab, node, "sudo -n true").returncode == 0


def test_root_login_and_unknown_host_keys_are_refused(lab: LabInfo, tmp_path: object) -> None:
    node = lab.nodes[0]
    root = subprocess.run(
        [*ssh_args(lab, node)[:-1], f"root@{node.address}", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert root.returncode == 255 and "Permission denied" in root.stderr
    empty = subprocess.run(
        [
            "ssh",
            "-i",
            str(lab.key),
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            f"lab@{node.address}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert empty.returncode == 255 and "Host key verification failed" in empty.stderr


def test_nodes_have_distinct_host_keys(lab: LabInfo) -> None:
    lines = lab.known_hosts.read_text().split("\n")
    ed25519 = {ln.split()[0]: ln.split()[2] for ln in lines if " ssh-ed25519 " in ln}
    assert set(ed25519) == {n.address for n in lab.nodes}
    assert len(set(ed25519.values())) == len(lab.nodes)
    assert (lab.key.stat().st_mode & 0o777) == 0o600


def test_host_network_container_inside_a_node_sees_the_node_address(lab: LabInfo) -> None:
    base = ensure_base_image()
    node = lab.nodes[1]
    save = subprocess.Popen(["docker", "save", base], stdout=subprocess.PIPE)
    load = subprocess.run(
        [*ssh_args(lab, node), "docker load -q"],
        stdin=save.stdout,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    save.wait()
    assert load.returncode == 0, load.stderr
    r = ssh(lab, node, f"docker run --rm --net=host {base} ip -4 -o addr show")
    assert r.returncode == 0, r.stderr
    assert f"inet {node.address}/" in r.stdout


def test_every_node_reaches_every_other_nodes_sshd(lab: LabInfo) -> None:
    for src in lab.nodes:
        probes = "; ".join(
            f"nc -z -w 3 {dst.address} 22 && echo ok {dst.address}"
            for dst in lab.nodes
            if dst != src
        )
        r = ssh(lab, src, probes)
        assert sorted(r.stdout.split()[1::2]) == sorted(d.address for d in lab.nodes if d != src), (
            src.name,
            r.stdout,
            r.stderr,
        )


def test_lab_up_twice_changes_nothing(lab: LabInfo, lab_config: LabConfig) -> None:
    before = {
        c.name: (c.id, c.attrs["State"]["StartedAt"])
        for c in client().containers.list(filters={"label": f"{LABEL}={lab.name}"})
    }
    known = lab.known_hosts.read_text()
    again = lab_up(lab_config)
    after = {
        c.name: (c.id, c.attrs["State"]["StartedAt"])
        for c in client().containers.list(filters={"label": f"{LABEL}={lab.name}"})
    }
    assert before == after and len(after) == 3
    assert again.known_hosts.read_text() == known


def test_a_node_recreated_over_a_left_store_starts_empty(
    lab: LabInfo, lab_config: LabConfig
) -> None:
    """A run killed before `lab down` leaves a node's engine store behind, with a cluster's
    containers that would restart by their policy; the node `lab up` makes anew starts empty."""
    node = lab.nodes[1]
    store = lab_config.node_storage(node)
    marker = store / "left-by-a-killed-run"
    marker.write_text("x")
    client().containers.get(node.container).remove(force=True)
    assert marker.exists()  # the store outlives its node
    lab_up(lab_config)
    assert not marker.exists()
    rc, out = exec_rc(node.container, "docker ps -aq | wc -l")
    assert rc == 0 and out.strip() == "0", out
    assert ssh(lab, node, "docker info --format '{{.ServerVersion}}'").returncode == 0


def test_lab_status_json(lab: LabInfo) -> None:
    r = cli("lab", "status", "--name", lab.name, "--json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert [row["container"] for row in doc["status"]] == ["running"] * 3
    assert all(row["sshd"] and row["dockerd"] for row in doc["status"])


# --- faults: each shows its effect, and its undo restores the node ---------------------


def test_fault_stop_and_start_keeps_host_keys(lab: LabInfo) -> None:
    node = lab.nodes[2]
    r = cli("lab", "fault", "stop", node.name, "--name", lab.name)
    assert r.exit_code == 0, r.stderr
    try:
        assert ssh(lab, node, "true", timeout=30).returncode == 255
        assert cli("lab", "status", "--name", lab.name).exit_code == 1
    finally:
        assert cli("lab", "fault", "start", node.name, "--name", lab.name).exit_code == 0
    r = ssh(lab, node, "docker info --format ok")  # strict host key check still passes
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_fault_cut_blocks_only_that_pair(lab: LabInfo) -> None:
    head, a, b = lab.nodes
    faults.cut(lab, a, b)
    try:
        assert ssh(lab, a, f"nc -z -w 2 {b.address} 22").returncode != 0
        assert ssh(lab, b, f"nc -z -w 2 {a.address} 22").returncode != 0
        assert ssh(lab, a, f"nc -z -w 2 {head.address} 22").returncode == 0
    finally:
        faults.uncut(lab, a, b)
    assert ssh(lab, a, f"nc -z -w 2 {b.address} 22").returncode == 0
    assert faults.active(lab) == []


def test_fault_occupy_holds_a_port_until_released(lab: LabInfo) -> None:
    head, worker, _ = lab.nodes
    faults.occupy(lab, head, 6379)
    try:
        assert ssh(lab, worker, f"nc -z -w 2 {head.address} 6379").returncode == 0
        assert "python3" in ssh(lab, head, "sudo ss -ltnp 'sport = :6379'").stdout
    finally:
        faults.release(lab, head, 6379)
    assert ssh(lab, worker, f"nc -z -w 2 {head.address} 6379").returncode != 0


def _ssh_seconds(lab: LabInfo, node_index: int) -> float:
    t0 = time.monotonic()
    assert ssh(lab, lab.nodes[node_index], "true").returncode == 0
    return time.monotonic() - t0


def test_fault_delay_adds_latency_and_undelay_removes_it(lab: LabInfo) -> None:
    node = lab.nodes[1]
    faults.delay(lab, node, 300)
    try:
        # An SSH login takes several round trips; each now costs at least 300 ms.
        assert _ssh_seconds(lab, 1) >= 0.9
    finally:
        faults.undelay(lab, node)
    assert [f for f in faults.active(lab) if f.kind == "delay"] == []
    assert ssh(lab, node, "sudo iptables -t nat -S PREROUTING").stdout.count("provisioner") == 0


def test_fault_hang_accepts_tcp_but_never_answers(lab: LabInfo) -> None:
    node = lab.nodes[1]
    faults.hang(lab, node)
    try:
        with socket.create_connection((node.address, 22), timeout=3) as s:
            s.settimeout(2)
            with pytest.raises(TimeoutError):
                s.recv(8)
        r = ssh(lab, node, "true", timeout=30)
        assert r.returncode == 255 and "timed out" in r.stderr
    finally:
        faults.unhang(lab, node)
    assert ssh(lab, node, "true").returncode == 0


def test_fault_isolate_drops_ssh_from_here_only_and_clear_undoes_it(lab: LabInfo) -> None:
    head, node = lab.nodes[0], lab.nodes[2]
    assert cli("lab", "fault", "isolate", node.name, "--name", lab.name).exit_code == 0
    try:
        assert ssh(lab, node, "true", timeout=30).returncode == 255
        assert ssh(lab, head, f"nc -z -w 2 {node.address} 22").returncode == 0
        assert [f.kind for f in faults.active(lab)] == ["isolate"]
    finally:
        assert cli("lab", "fault", "clear", "--name", lab.name).exit_code == 0
    assert ssh(lab, node, "true").returncode == 0
    assert faults.active(lab) == []


def test_lab_up_json_and_down_leaves_nothing_behind() -> None:
    # a subnet of its own: the Podman lab's (10.250.103.0/24) may be up beside it
    subnet = os.environ.get("PROVISIONER_DOWN_LAB_SUBNET", "10.250.108.0/24")
    cfg = LabConfig(
        name=os.environ.get("PROVISIONER_DOWN_LAB_NAME", "e2edown"), subnet=subnet, nodes=1
    )
    args = ("--nodes", "1", "--name", cfg.name, "--subnet", cfg.subnet)
    r = cli("lab", "up", *args, "--flavours", "trixie+containerd", "--json")
    assert r.exit_code == 0, r.stderr
    doc = r.json()
    assert set(doc) >= {"inventory", "key", "known_hosts", "nodes"}
    assert doc["nodes"] == [
        {
            "name": f"provisioner-{cfg.name}-0",
            "address": str(ipaddress.ip_network(subnet)[10]),
            "user": "lab",
            "role": "head",
            "flavour": "trixie+containerd",
        }
    ]
    rc, out = exec_rc(f"provisioner-{cfg.name}-0", "docker info --format '{{json .DriverStatus}}'")
    assert rc == 0 and "io.containerd.snapshotter" in out, out
    r = cli("lab", "down", "--name", cfg.name)
    assert r.exit_code == 0, r.stderr
    c = client()
    assert c.containers.list(all=True, filters={"label": f"{LABEL}={cfg.name}"}) == []
    assert [n for n in c.networks.list() if n.name == cfg.network] == []
    assert not cfg.state_dir.exists()
    assert lab_down(cfg) == []  # twice is fine
