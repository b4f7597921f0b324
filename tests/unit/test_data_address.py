"""A node's Ray address apart from its SSH address (`ray: {address}`; Ansible's
`provisioner_ray_address`): what the inventory accepts, what Ray is told, what the doctor
probes and names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from provisioner.checks.facts import NodeFacts
from provisioner.checks.node_checks import check_address
from provisioner.checks.ports import judge_probes, listen_ports, parse_probe_output, probe_plan
from provisioner.cluster import membership
from provisioner.cluster.headprobe import GcsNode
from provisioner.errors import InventoryError
from provisioner.inventory import Inventory, Node, RayPorts, SSHSettings, load_inventory
from provisioner.node import commands, tls
from provisioner.runtime.docker import runtime as docker
from tests.unit.inventories import make_inventory

NATIVE = """\
cluster: two-nets
ssh: {user: lab}
head:
  name: head-0
  address: 192.0.2.10
  ray: {address: 198.51.100.10}
workers:
  - name: w-1
    address: 192.0.2.11
    ray: {address: 198.51.100.11}
  - name: w-2
    address: 192.0.2.12
"""


def load(tmp_path: Path, text: str, name: str = "inv.yaml") -> Inventory:
    path = tmp_path / name
    path.write_text(text)
    return load_inventory(path)


def error_of(tmp_path: Path, text: str, name: str = "inv.yaml") -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, text, name)
    assert caught.value.exit_code == 2
    return caught.value


def test_native_ray_address_per_node(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE)
    head, w1, w2 = inv.nodes
    assert (head.address, head.ray_address) == ("192.0.2.10", "198.51.100.10")
    assert (w1.address, w1.ray_address) == ("192.0.2.11", "198.51.100.11")
    assert (w2.address, w2.ray_address, w2.data_address) == ("192.0.2.12", "192.0.2.12", None)
    assert inv.node("198.51.100.11") is w1 and inv.node("192.0.2.11") is w1


def test_ray_address_same_as_ssh_is_no_data_address(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE.replace("198.51.100.11", "192.0.2.11"))
    assert inv.node("w-1").data_address is None and inv.node("w-1").ray_address == "192.0.2.11"


@pytest.mark.parametrize(
    ("old", "new", "needle"),
    [
        (
            "ray: {address: 198.51.100.11}",
            "ray: {address: gpu-01.example}",
            "workers[0].ray.address: expected the IP address",
        ),
        (
            "ray: {address: 198.51.100.11}",
            "ray: {adress: 198.51.100.11}",
            "did you mean 'workers[0].ray.address'",
        ),
        (
            "ray: {address: 198.51.100.11}",
            "ray: {address: '1.2.3.4; reboot'}",
            "workers[0].ray.address",
        ),
        ("ray: {address: 198.51.100.11}", "ray: {address: 198.51.100.10}", "head-0's Ray address"),
        ("ray: {address: 198.51.100.11}", "ray: 198.51.100.11", "expected a mapping"),
    ],
)
def test_bad_ray_address_is_exit_2_naming_the_field(
    tmp_path: Path, old: str, new: str, needle: str
) -> None:
    err = error_of(tmp_path, NATIVE.replace(old, new))
    text = f"{err} {err.fix}"
    assert needle in text, text
    assert str(err).startswith(f"{tmp_path / 'inv.yaml'}:"), str(err)


def test_a_ray_address_equal_to_another_nodes_ssh_address_is_refused(tmp_path: Path) -> None:
    err = error_of(tmp_path, NATIVE.replace("198.51.100.11", "192.0.2.12"))
    assert "w-1's Ray address" in str(err) and "w-2" in str(err)


def test_ansible_provisioner_ray_address(tmp_path: Path) -> None:
    text = (
        "[head]\nn0 ansible_host=192.0.2.20 provisioner_ray_address=198.51.100.20\n"
        "[workers]\nn1 ansible_host=192.0.2.21 provisioner_ray_address=198.51.100.21\n"
        "n2 ansible_host=192.0.2.22\n"
    )
    inv = load(tmp_path, text, "hosts.ini")
    assert [n.ray_address for n in inv.nodes] == ["198.51.100.20", "198.51.100.21", "192.0.2.22"]
    assert [n.address for n in inv.nodes] == ["192.0.2.20", "192.0.2.21", "192.0.2.22"]
    bad = text.replace("198.51.100.21", "not-an-ip")
    err = error_of(tmp_path, bad, "hosts.ini")
    assert "n1.provisioner_ray_address" in str(err)


def two_networks(tmp_path: Path) -> Inventory:
    inv = make_inventory(tmp_path)
    nodes = [
        dataclasses.replace(n, data_address=f"10.99.0.{10 + i}") for i, n in enumerate(inv.nodes)
    ]
    return dataclasses.replace(inv, head=nodes[0], workers=tuple(nodes[1:]))


def test_ray_start_uses_the_ray_addresses(tmp_path: Path) -> None:
    inv = two_networks(tmp_path)
    args = commands.ray_start_args(inv, inv.workers[0])
    assert args[2:4] == ["--address=10.99.0.10:6379", "--node-ip-address=10.99.0.11"]
    head = commands.ray_start_args(inv, inv.head)
    assert "--node-ip-address=10.99.0.10" in head
    cmd = docker.docker_run_command(inv, inv.head, "sha256:abc")
    assert "--node-ip-address=10.99.0.10 " in cmd and "10.250.9.10" not in cmd
    assert commands.head_address(inv) == "10.99.0.10:6379"


def test_tls_certificate_names_both_addresses(tmp_path: Path) -> None:
    from cryptography import x509

    inv = two_networks(tmp_path)
    pem = tls.bundle(tls.ensure_authority(inv), inv.workers[0])
    _, node_cert = x509.load_pem_x509_certificates(pem[: pem.index(b"-----BEGIN PRIVATE")])
    names = node_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert {"10.250.9.11", "10.99.0.11"} <= ips


def test_probes_go_to_the_ray_addresses_and_a_node_none_reaches_is_named(tmp_path: Path) -> None:
    inv = two_networks(tmp_path)
    nodes, ports = list(inv.nodes), RayPorts()
    bound = {n.name: tuple(listen_ports(n, ports)) for n in nodes}
    plan = probe_plan(nodes, ports, bound)
    assert {p.address for ps in plan.values() for p in ps} == {n.ray_address for n in nodes}
    victim = inv.workers[1]
    outcomes = {}
    for source, probes in plan.items():
        text = "\n".join(
            f"{p.address} {p.port} {'timeout' if p.target == victim.name else 'ok'}" for p in probes
        )
        outcomes.update(parse_probe_output(source, probes, text))
    addresses = {n.name: n.ray_address for n in nodes}
    (finding,) = judge_probes(outcomes, addresses, frozenset(n.name for n in nodes))
    assert finding.host == victim.name and finding.severity == "error"
    assert "10.99.0.12 (its ray.address)" in finding.message
    assert "ray: {address}" in finding.fix and "ip -o addr" in finding.fix
    (plain,) = judge_probes(outcomes, addresses)  # without a ray.address: the firewall first
    assert plain.fix.startswith("open TCP") and "(its ray.address)" not in plain.message
    assert plain.fix.endswith(
        "if Ray's traffic runs on another network, give w-2 its address "
        "there as `ray: {address}`".replace("w-2", victim.name)
    )


def facts_with(addresses: tuple[str, ...], route_source: str) -> NodeFacts:
    return NodeFacts(host="n", addresses=addresses, route_source=route_source)


def test_net_address_judges_the_ray_address() -> None:
    ssh = SSHSettings(user="u")
    node = Node("n", "192.0.2.5", "worker", ssh, data_address="10.99.0.5")
    on_both = facts_with(("192.0.2.5", "10.99.0.5"), "10.99.0.5")
    (good,) = [f for f in check_address(node, on_both) if f.check == "net.address"]
    assert good.severity == "ok" and "10.99.0.5" in good.message
    absent = facts_with(("192.0.2.5",), "192.0.2.5")
    (bad,) = [f for f in check_address(node, absent) if f.check == "net.address"]
    assert bad.severity == "warning" and "ray.address 10.99.0.5" in bad.message
    assert "ray: {address}" in bad.fix
    # the route toward the head leaves from the SSH network: named
    wrong_way = facts_with(("192.0.2.5", "10.99.0.5"), "192.0.2.5")
    (way,) = [f for f in check_address(node, wrong_way) if f.check == "net.address"]
    assert way.severity == "warning" and "sends from 192.0.2.5" in way.message


def test_status_and_membership_match_ray_by_its_address(tmp_path: Path) -> None:
    inv = two_networks(tmp_path)
    recorded = membership.node_from_json(membership.node_to_json(inv.workers[0]))
    assert recorded.data_address == "10.99.0.11" and recorded.address == "10.250.9.11"
    gcs = [GcsNode(f"id{i}", n.ray_address, True, {}) for i, n in enumerate(inv.nodes)]
    assert membership.outside_inventory(inv, gcs) == []
    assert membership.departed(inv, [recorded], gcs) == []
    stranger = GcsNode("x", "10.250.9.11", True, {})  # Ray at an SSH address: not ours
    assert membership.outside_inventory(inv, [stranger]) == [stranger]
