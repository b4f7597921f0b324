"""The cluster-wide `ray: {subnet: CIDR}` (Ansible: `provisioner_ray_subnet`): the field,
the pure parse and pick of a node's `ip -o addr show`, and the one resolution every verb
calls (a node's own `ray: {address}` wins)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from provisioner.cluster import render
from provisioner.cluster.subnet import (
    ADDRESSES_COMMAND,
    parse_addresses,
    pick,
    resolve_ray_subnet,
    with_ray_addresses,
)
from provisioner.errors import CommandFailed, InputError, InventoryError
from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.remote import Pool, Result
from tests.unit.inventories import docker_runtime

NATIVE = """\
cluster: subnet
ssh: {user: lab}
ray:
  subnet: 198.51.100.0/24
head:
  name: head-0
  address: 192.0.2.10
workers:
  - name: w-1
    address: 192.0.2.11
  - name: w-2
    address: 192.0.2.12
    ray: {address: 203.0.113.12}
"""

IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host noprefixroute \\       valid_lft forever preferred_lft forever
42: eth0    inet 192.0.2.10/24 brd 192.0.2.255 scope global eth0\\       valid_lft forever
44: eth1    inet 198.51.100.10/24 brd 198.51.100.255 scope global eth1\\       valid_lft forever
44: eth1    inet6 fe80::42:c6ff:fe33:640a/64 scope link \\       valid_lft forever
"""


def load(tmp_path: Path, text: str, name: str = "inv.yaml") -> Inventory:
    path = tmp_path / name
    path.write_text(text)
    return load_inventory(path)


def test_parse_addresses_lists_every_inet_in_order() -> None:
    assert parse_addresses(IP_ADDR) == [
        "127.0.0.1",
        "::1",
        "192.0.2.10",
        "198.51.100.10",
        "fe80::42:c6ff:fe33:640a",
    ]
    assert parse_addresses("") == []
    assert parse_addresses("192.0.2.10 198.51.100.10 fe80::1 \n") == [  # hostname -I
        "192.0.2.10",
        "198.51.100.10",
        "fe80::1",
    ]
    assert parse_addresses("garbage\n3: eth2    link/ether 02:42:ac:11:00:02\n") == []


def test_pick_the_address_inside_the_subnet() -> None:
    addresses = parse_addresses(IP_ADDR)
    assert pick("head-0", "198.51.100.0/24", addresses) == "198.51.100.10"
    assert pick("head-0", "192.0.2.0/24", addresses) == "192.0.2.10"
    assert pick("head-0", "fe80::/64", addresses) == "fe80::42:c6ff:fe33:640a"


def test_no_address_in_the_subnet_names_node_subnet_and_addresses() -> None:
    with pytest.raises(InventoryError) as caught:
        pick("w-1", "10.10.0.0/24", ["127.0.0.1", "192.0.2.11"], where="inv.yaml:4")
    err = caught.value
    assert "w-1" in str(err) and "10.10.0.0/24" in str(err)
    assert "127.0.0.1, 192.0.2.11" in str(err)
    assert str(err).startswith("inv.yaml:4")
    assert err.fix and "ray: {address}" in err.fix and "ray.subnet" in err.fix
    assert err.exit_code == 2


def test_native_ray_subnet_field(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE)
    assert inv.ray_subnet == "198.51.100.0/24"
    assert inv.ray_subnet_where == f"{tmp_path / 'inv.yaml'}:4"
    # unresolved: the SSH addresses, a node's own ray.address as written
    assert [n.ray_address for n in inv.nodes] == ["192.0.2.10", "192.0.2.11", "203.0.113.12"]


@pytest.mark.parametrize("bad", ["198.51.100.0/33", "eth1", "10.0.0.0/24; reboot"])
def test_bad_ray_subnet_is_exit_2_with_file_and_line(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, NATIVE.replace("198.51.100.0/24", bad))
    err = caught.value
    assert err.exit_code == 2
    assert str(err).startswith(f"{tmp_path / 'inv.yaml'}:4"), str(err)
    assert "ray.subnet" in str(err) and "CIDR" in str(err)


def test_ansible_provisioner_ray_subnet(tmp_path: Path) -> None:
    text = (
        "[head]\nn0 ansible_host=192.0.2.20\n[workers]\nn1 ansible_host=192.0.2.21\n"
        "[all:vars]\nprovisioner_ray_subnet=198.51.100.0/24\n"
    )
    assert load(tmp_path, text, "hosts.ini").ray_subnet == "198.51.100.0/24"
    with pytest.raises(InventoryError) as caught:
        load(tmp_path, text.replace("198.51.100.0/24", "nope"), "hosts.ini")
    assert "provisioner_ray_subnet" in str(caught.value) and caught.value.exit_code == 2


def test_with_ray_addresses_gives_nodes_their_address_and_a_named_one_wins(
    tmp_path: Path,
) -> None:
    inv = load(tmp_path, NATIVE)
    found = {"head-0": "198.51.100.10", "w-1": "192.0.2.11", "w-2": "198.51.100.12"}
    resolved = with_ray_addresses(inv, found)
    assert [n.ray_address for n in resolved.nodes] == [
        "198.51.100.10",
        "192.0.2.11",  # its address in the subnet is its SSH address: no data address
        "203.0.113.12",  # its own ray.address wins
    ]
    assert resolved.workers[0].data_address is None
    assert resolved.ray_subnet is None


class _Session:
    def __init__(self, node: Node, outputs: dict[str, str], asked: list[str]) -> None:
        self.node, self.outputs, self.asked = node, outputs, asked

    def run(self, command: str, timeout: float) -> Result:
        assert command == ADDRESSES_COMMAND
        self.asked.append(self.node.name)
        return Result(self.node.name, command, self.outputs[self.node.name], "", 0)


class _Pool:
    def __init__(self, outputs: dict[str, str]) -> None:
        self.outputs, self.asked = outputs, cast(list[str], [])

    def session(self, node: Node) -> _Session:
        return _Session(node, self.outputs, self.asked)


def _ip(*addresses: str) -> str:
    return "".join(f"{i}: eth{i}    inet {a}/24 scope global\n" for i, a in enumerate(addresses))


def test_resolve_asks_each_node_without_an_address_once(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE)
    pool = _Pool({"head-0": _ip("192.0.2.10", "198.51.100.10"), "w-1": _ip("198.51.100.11")})
    resolved = resolve_ray_subnet(inv, cast(Pool, cast(Any, pool)))
    assert sorted(pool.asked) == ["head-0", "w-1"]  # w-2 names its own
    assert [n.ray_address for n in resolved.nodes] == [
        "198.51.100.10",
        "198.51.100.11",
        "203.0.113.12",
    ]
    # resolved once: a later verb's call asks nothing
    assert resolve_ray_subnet(resolved, cast(Pool, cast(Any, pool))) is resolved
    assert len(pool.asked) == 2


def test_resolve_a_node_without_an_address_there_is_an_error(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE)
    pool = _Pool({"head-0": _ip("198.51.100.10"), "w-1": _ip("192.0.2.11", "10.0.0.11")})
    with pytest.raises(InventoryError) as caught:
        resolve_ray_subnet(inv, cast(Pool, cast(Any, pool)))
    assert "w-1: no address in ray.subnet 198.51.100.0/24" in str(caught.value)
    assert "192.0.2.11, 10.0.0.11" in str(caught.value)


def test_without_a_subnet_nothing_is_asked(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE.replace("ray:\n  subnet: 198.51.100.0/24\n", ""))
    pool = _Pool({})
    assert resolve_ray_subnet(inv, cast(Pool, cast(Any, pool))) is inv
    assert pool.asked == []


def test_render_refuses_a_ray_subnet(tmp_path: Path) -> None:
    key = tmp_path / "id_test"
    key.write_text("key\n")
    key.chmod(0o600)
    text = NATIVE.replace("    ray: {address: 203.0.113.12}\n", "")
    inv = load(tmp_path, text.replace("ssh: {user: lab}", f"ssh: {{user: lab, key: {key}}}"))
    with pytest.raises(InputError) as caught:
        render.build_config(inv, tmp_path / "t", docker_runtime(inv, "img"))
    assert "ray.subnet 198.51.100.0/24" in str(caught.value)
    assert "provisioner up" in (caught.value.fix or "")
    assert str(caught.value).startswith(f"{tmp_path / 'inv.yaml'}:4")


def test_a_node_that_cannot_list_its_addresses_is_that_error(tmp_path: Path) -> None:
    inv = load(tmp_path, NATIVE)

    class Failing(_Session):
        def run(self, command: str, timeout: float) -> Result:
            return Result(self.node.name, command, "", "sh: ip: not found", 127)

    class FailingPool(_Pool):
        def session(self, node: Node) -> _Session:
            return Failing(node, self.outputs, self.asked)

    with pytest.raises(CommandFailed):
        resolve_ray_subnet(inv, cast(Pool, cast(Any, FailingPool({}))))
