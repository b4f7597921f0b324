"""A worker reachable only through a two-hop ProxyJump chain declared in ~/.ssh/config.

The last worker drops SSH from the control machine and from the head (`lab fault isolate
--also-from HEAD`); only the first worker reaches it. The user's ssh_config (the hidden
home's, with an `Include` of the hosts file) says `ProxyJump HEAD,WORKER1` for it; the
inventory names the nodes by their ssh_config aliases. The doctor, `up` and `status` go
through the chain (resolved by `ssh -G`), and host keys are checked at every hop: with the
first worker's key missing from known_hosts the chain is refused at that hop.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.cli import run
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container
from tests.e2e.faults.lab import edited_inventory
from tests.e2e.helpers import ssh


def cli_json(*args: str) -> tuple[int, dict[str, Any], str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run([*args, "--json"])
    return code, json.loads(out.getvalue()), err.getvalue()


def alias(lab: LabInfo, index: int) -> str:
    return f"{lab.name}-node{index}"


@pytest.fixture(scope="module")
def cluster_down_after(cluster_inventory: Path) -> Iterator[Path]:
    """Ray is taken down when this module is done (its `up` may have started the cluster)."""
    yield cluster_inventory
    run(["down", "-i", str(cluster_inventory), "--no-logs"])


@pytest.fixture
def chained(
    lab: LabInfo, cluster_down_after: Path, hidden_home: Path, tmp_path: Path
) -> Iterator[Path]:
    """The ssh_config with the chain (Include'd hosts file) and an inventory naming the
    nodes by alias; the last worker isolated from the control machine and the head."""
    head, first, last = lab.nodes[0], lab.nodes[1], lab.nodes[-1]
    hosts = tmp_path / "lab-hosts.conf"
    hosts.write_text(
        "".join(
            f"Host {alias(lab, i)}\n  HostName {n.address}\n  User {n.user}\n"
            f"  IdentityFile {lab.key}\n"
            for i, n in enumerate(lab.nodes)
        )
        + f"Host {alias(lab, len(lab.nodes) - 1)}\n"
        f"  ProxyJump {alias(lab, 0)},{alias(lab, 1)}\n"
    )
    config = hidden_home / ".ssh" / "config"  # the user's own ~/.ssh/config in the tests
    config.parent.mkdir(exist_ok=True)
    config.write_text(f"Include {hosts}\n\nHost *\n  ConnectTimeout 5\n")
    inventory = edited_inventory(cluster_down_after, tmp_path / "chained.yaml")
    document = yaml.safe_load(inventory.read_text())
    for key in ("user", "key"):
        document["ssh"].pop(key, None)
    document["ssh"]["connect_timeout"] = 5
    document["head"] = {"name": head.name, "address": alias(lab, 0)}
    document["workers"] = [
        {"name": n.name, "address": alias(lab, i)} for i, n in enumerate(lab.nodes) if i
    ]
    inventory.write_text(yaml.safe_dump(document))
    faults.isolate(lab, last, [head])
    try:
        assert ssh(lab, last, "true").returncode != 0  # not from the control machine
        through_head = ssh(lab, head, f"timeout 5 bash -c '</dev/tcp/{last.address}/22'")
        assert through_head.returncode != 0, "the head still reaches the worker's sshd"
        through_first = ssh(lab, first, f"timeout 5 bash -c '</dev/tcp/{last.address}/22'")
        assert through_first.returncode == 0, through_first.stdout + through_first.stderr
        yield inventory
    finally:
        faults.unisolate(lab, last, [head])


def test_the_chain_is_read_from_ssh_config_with_include(lab: LabInfo, chained: Path) -> None:
    last = load_inventory(chained).workers[-1]
    assert last.address == lab.nodes[-1].address and last.ssh.user == lab.nodes[-1].user
    assert [(h.address, h.user) for h in last.ssh.hops] == [
        (lab.nodes[0].address, lab.nodes[0].user),
        (lab.nodes[1].address, lab.nodes[1].user),
    ]


def test_doctor_up_and_status_go_through_the_two_hop_chain(lab: LabInfo, chained: Path) -> None:
    from provisioner.lab.engine import exec_rc

    last = lab.nodes[-1]
    code, doctor, err = cli_json("doctor", "-i", str(chained))
    assert code == 0, (doctor, err[-2000:])
    assert any(f["check"] == "docker.access" and f["host"] == last.name for f in doctor["findings"])
    rc, said = exec_rc(last.container, f"docker rm -f {ray_container(load_inventory(chained))}")
    assert rc == 0, said
    code, up, err = cli_json("up", "-i", str(chained))
    assert code == 0 and last.name in up["started"], (up, err[-2000:])
    code, status, err = cli_json("status", "-i", str(chained))
    assert code == 0 and status["alive_nodes"] == len(lab.nodes), (status, err[-2000:])
    assert next(n for n in status["nodes"] if n["name"] == last.name)["ssh_ok"]


def test_host_keys_are_checked_at_every_hop(lab: LabInfo, chained: Path, tmp_path: Path) -> None:
    """With the first worker's key gone from known_hosts, the last worker (behind it) is
    refused at that hop; the first worker itself, reached directly, too."""
    first = lab.nodes[1]
    document = yaml.safe_load(chained.read_text())
    known = Path(document["ssh"]["known_hosts"])
    partial = tmp_path / "known_hosts"
    partial.write_text(
        "".join(
            line
            for line in known.read_text().splitlines(keepends=True)
            if not line.startswith((first.address + " ", f"[{first.address}]"))
        )
    )
    document["ssh"]["known_hosts"] = str(partial)
    inventory = tmp_path / "partial.yaml"
    inventory.write_text(yaml.safe_dump(document))
    code, doctor, _ = cli_json("doctor", "-i", str(inventory))
    assert code == 1, doctor
    refused = {
        f["host"]: f["message"]
        for f in doctor["findings"]
        if f["severity"] == "error" and f["check"] == "ssh.hostkey"
    }
    assert set(refused) == {first.name, lab.nodes[-1].name}, doctor["findings"]
    assert first.address in refused[lab.nodes[-1].name]
