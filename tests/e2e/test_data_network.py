"""Two networks per node (`lab up --data-subnet`): SSH reaches the nodes only on the lab's
network, Ray's ports answer only on the data network (iptables in each node), and the
inventory gives each node's `ray: {address}` there.

The path is the user's: the doctor (clean with the Ray addresses; with the SSH addresses
alone it names every node, the positive control that the split is real; with one wrong
Ray address it names that node), then up, PPO with env runners on every node (their
addresses are the Ray addresses), status, down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.lab.nodes import LabInfo
from tests.e2e.conftest import DATA_DATA_SUBNET
from tests.e2e.helpers import cli, cli_json, ssh

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def edited(lab: LabInfo, tmp_path: Path, name: str, ray: dict[str, str | None]) -> str:
    """The lab's inventory with some nodes' `ray: {address}` changed (None: removed)."""
    document: dict[str, Any] = yaml.safe_load(lab.inventory.read_text())
    document["ssh"]["key"] = str(lab.key)
    document["ssh"]["known_hosts"] = str(lab.known_hosts)
    for node in (document["head"], *document["workers"]):
        if node["name"] in ray:
            address = ray[node["name"]]
            if address is None:
                node.pop("ray", None)
            else:
                node["ray"] = {"address": address}
    if "image" in document:
        document["image"]["lock"] = str(Path(document["image"]["lock"]).resolve())
    path = tmp_path / name
    path.write_text(yaml.safe_dump(document))
    return str(path)


def problems(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(f["check"], f["host"]): f for f in doc["findings"] if f["severity"] != "ok"}


def test_ssh_and_ray_each_on_their_own_network(data_lab: LabInfo) -> None:
    head, worker = data_lab.nodes[0], data_lab.nodes[1]
    assert worker.data_address and worker.data_address != worker.address
    # SSH answers on the lab's network only
    assert ssh(data_lab, worker, "true").returncode == 0
    reach = (
        f"timeout 2 bash -c 'exec 3<>/dev/tcp/{worker.data_address}/22' && echo open || echo shut"
    )
    assert ssh(data_lab, head, reach).stdout.strip() == "shut"
    control = f"timeout 2 bash -c 'exec 3<>/dev/tcp/{worker.address}/22' && echo open"
    assert ssh(data_lab, head, control).stdout.strip() == "open"  # positive control


def test_doctor_probes_the_ray_addresses(data_lab: LabInfo, tmp_path: Path) -> None:
    code, doc, err = cli_json("doctor", "-i", str(data_lab.inventory))
    assert code == 0, err[-3000:]
    assert [f for f in doc["findings"] if f["severity"] == "error"] == []
    advertised = {f["host"]: f["message"] for f in doc["findings"] if f["check"] == "net.address"}
    assert advertised == {n.name: f"Ray would advertise {n.data_address}" for n in data_lab.nodes}
    assert any(f["check"] == "net.reachability" and f["severity"] == "ok" for f in doc["findings"])

    # the SSH addresses alone: Ray's ports are shut there, and every node is named
    plain = edited(data_lab, tmp_path, "plain.yaml", {n.name: None for n in data_lab.nodes})
    code, doc, err = cli_json("doctor", "-i", plain)
    assert code == 1, err[-3000:]
    named = {h for (c, h) in problems(doc) if c == "net.reachability"}
    assert named == {n.name for n in data_lab.nodes}, problems(doc)

    # one node's Ray address on no interface of it: that node alone is named, with the fix
    odd = data_lab.nodes[2]
    wrong = str(odd.data_address).rsplit(".", 1)[0] + ".99"
    path = edited(data_lab, tmp_path, "wrong.yaml", {odd.name: wrong})
    code, doc, err = cli_json("doctor", "-i", path)
    assert code == 1, err[-3000:]
    found = problems(doc)
    assert {h for (c, h), f in found.items() if f["severity"] == "error"} == {odd.name}, found
    unreached = found[("net.reachability", odd.name)]
    assert f"at {wrong} (its ray.address)" in unreached["message"], unreached
    assert "ray: {address}" in unreached["fix"]
    assert f"ray.address {wrong}" in found[("net.address", odd.name)]["message"]


def test_up_submit_status_down_on_the_data_network(
    data_lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    inventory = str(data_lab.inventory)
    rays = {n.data_address for n in data_lab.nodes}
    try:
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        assert up["totals"]["nodes"] == 3
        assert sorted(p["ip"] for p in up["placement"] if p["ok"]) == sorted(rays)

        code, st, err = cli_json("status", "-i", inventory)
        assert code == 0, err[-3000:]
        assert st["alive_nodes"] == 3 and st["healthy"] and st["outside_inventory"] == []
        assert st["address"] == f"{data_lab.nodes[0].data_address}:6379"
        assert {g["ip"] for g in st["gcs_nodes"] if g["alive"]} == rays

        code, again, err = cli_json("up", "-i", inventory)
        assert code == 0 and again["changed"] is False, err[-3000:]

        code, out, err = cli(
            "submit", "-i", inventory, "--results", str(tmp_path), "--json",
            str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--train-batch", "300",
            "--max-iterations", "2",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = json.loads(out)
        assert job["status"] == "SUCCEEDED"
        runners = json.loads((tmp_path / job["job_id"] / "runners.json").read_text())
        assert {r["node_ip"] for r in runners} == rays, runners

        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]
        code, st, err = cli_json("status", "-i", inventory)
        assert st["alive_nodes"] == 0, st
    finally:
        cli("down", "-i", inventory, "--no-logs")


def subnet_only(lab: LabInfo, tmp_path: Path, subnet: str, name: str = "subnet.yaml") -> str:
    """The lab's inventory with no node's `ray: {address}`, the cluster-wide
    `ray: {subnet}` instead: each node's Ray address is asked of the node."""
    path = edited(lab, tmp_path, name, {n.name: None for n in lab.nodes})
    document: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    document.setdefault("ray", {})["subnet"] = subnet
    Path(path).write_text(yaml.safe_dump(document))
    return path


def test_the_cluster_wide_ray_subnet(data_lab: LabInfo, tmp_path: Path) -> None:
    inventory = subnet_only(data_lab, tmp_path, DATA_DATA_SUBNET)
    written: dict[str, Any] = yaml.safe_load(Path(inventory).read_text())
    assert written["ray"]["subnet"] == DATA_DATA_SUBNET
    assert all("ray" not in n for n in (written["head"], *written["workers"]))
    rays = {n.data_address for n in data_lab.nodes}
    # a subnet none of the nodes is on: exit 2 naming a node, the subnet, its addresses
    elsewhere = subnet_only(data_lab, tmp_path, "10.250.199.0/24", "elsewhere.yaml")
    code, _, err = cli("doctor", "-i", elsewhere)
    assert code == 2 and "no address in ray.subnet 10.250.199.0/24" in err, err[-3000:]
    assert "Traceback" not in err and "ray: {address}" in err
    # render cannot say it (Ray's launcher: one address per node)
    code, _, err = cli("render", "-i", inventory)
    assert code == 2 and "ray.subnet" in err and "provisioner up" in err, err[-3000:]
    try:
        code, doc, err = cli_json("doctor", "-i", inventory)
        assert code == 0, err[-3000:]
        assert [f for f in doc["findings"] if f["severity"] == "error"] == []
        advertised = {
            f["host"]: f["message"] for f in doc["findings"] if f["check"] == "net.address"
        }
        want = {n.name: f"Ray would advertise {n.data_address}" for n in data_lab.nodes}
        assert advertised == want, advertised
        assert any(
            f["check"] == "net.reachability" and f["severity"] == "ok" for f in doc["findings"]
        )

        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        assert sorted(p["ip"] for p in up["placement"] if p["ok"]) == sorted(rays)

        code, st, err = cli_json("status", "-i", inventory)
        assert code == 0, err[-3000:]
        assert st["alive_nodes"] == 3 and st["healthy"] and st["outside_inventory"] == []
        assert st["address"] == f"{data_lab.nodes[0].data_address}:6379"
        assert {g["ip"] for g in st["gcs_nodes"] if g["alive"]} == rays

        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]
        code, st, err = cli_json("status", "-i", inventory)
        assert st["alive_nodes"] == 0, st
    finally:
        cli("down", "-i", inventory, "--no-logs")


@pytest.mark.parametrize("bad", ["gpu-01.example", "10.0.0.5; reboot"])
def test_a_ray_address_not_an_ip_is_exit_2(data_lab: LabInfo, tmp_path: Path, bad: str) -> None:
    path = edited(data_lab, tmp_path, "bad.yaml", {data_lab.nodes[1].name: bad})
    code, _, err = cli("doctor", "-i", path)
    assert code == 2 and "ray.address" in err and "Traceback" not in err, err
