"""The one address check (inventory/address.py) and where it holds: an inventory file's
addresses and names, what a SLURM login node answers, a relay key's `from="..."` and a
node certificate's names.

An IPv6 scope id is refused unless it is an interface's name or number: `ipaddress`
accepts `fe80::1%$(cmd)`, and an address reaches shell commands, authorized_keys and
certificates. The end-to-end counterpart (a login node that answers such an address) is
in tests/e2e/test_slurm_security.py.
"""

from __future__ import annotations

import ipaddress
import json
import os
from pathlib import Path

import pytest

from provisioner.errors import InputError, InventoryError
from provisioner.inventory import load_inventory
from provisioner.inventory.address import address_problem, checked_address
from provisioner.inventory.allocation import AllocatedNode
from provisioner.node import tls
from provisioner.runtime.docker import star
from tests.unit.test_inventory import NATIVE

GOOD = [
    "10.0.0.5",
    "fd00::5",
    "fe80::1%eth0",
    "fe80::1%enp0s31f6",
    "fe80::1%br-1a2b3c4d5e6f",  # 15 characters: IFNAMSIZ - 1
    "fe80::1%ib0.8001",
    "fe80::1%veth_a-1",
    "fe80::1%3",
    "gpu-01.lab.example",
    "n_1",
]
HOSTILE = [
    "fe80::1%$(touch /tmp/PWNED)",
    "fe80::1%$(touch${IFS}${PWD:0:1}tmp${PWD:0:1}PWNED)",  # '/' spelt without one
    "fe80::1%`id`",
    "fe80::1%a;id",
    "fe80::1%a|id",
    "fe80::1%a&id",
    "fe80::1%a b",
    'fe80::1%a"b',
    "fe80::1%a'b",
    "fe80::1%a,b",  # a second pattern in from="..."
    "fe80::1%a*",
    "fe80::1%a\\b",
    "fe80::1%a>b",
    "fe80::1%eth0\n",
    "fe80::1%\neth0",
    "fe80::1%" + "a" * 16,  # longer than an interface name can be
    "fe80::1%.",
    "fe80::1%..",
    "fe80::1%-oProxyCommand=x",
    "fe80::1%",
    "10.0.0.1%eth0",
    "-oProxyCommand=x",
    "10.0.0.1;id",
    "gpu-01\n",
    "a b",
    "",
]


@pytest.mark.parametrize("address", GOOD)
def test_addresses_and_interface_scopes_are_accepted(address: str) -> None:
    assert address_problem(address) is None
    assert checked_address(address) == address


@pytest.mark.parametrize("address", HOSTILE)
def test_hostile_addresses_are_refused(address: str) -> None:
    why = address_problem(address)
    assert why is not None and repr(address) in why
    if "%" in address and not address.startswith("10."):
        assert "scope id" in why and "interface's name" in why
    with pytest.raises(ValueError):
        checked_address(address)


def test_ipaddress_alone_takes_a_scope_id_of_any_characters() -> None:
    """Why the check exists (a control of the tests above): `ipaddress` accepts it."""
    for address in HOSTILE[1:16]:
        assert str(ipaddress.ip_address(address)) == address


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not checked here\n")
    os.chmod(path, 0o600)
    return path


def load_with(tmp_path: Path, old: str, new: str) -> object:
    path = tmp_path / "inv.yaml"
    path.write_text(NATIVE.replace(old, new))
    return load_inventory(path)


@pytest.mark.parametrize("address", HOSTILE[:19])
@pytest.mark.parametrize(
    ("old", "template", "field"),
    [
        ("address: 10.0.0.10", "address: {}", "head.address"),
        ("name: head-0", "name: {}", "head.name"),  # an IPv6 address as a node's name
        ("  - 10.0.0.12", "  - {}", "workers[1]"),
        ("    port: 2222", "    port: 2222\n    ray: {{address: {}}}", "ray.address"),
    ],
)
def test_an_inventory_with_a_hostile_scope_id_is_refused(
    tmp_path: Path, key: Path, address: str, old: str, template: str, field: str
) -> None:
    with pytest.raises(InventoryError) as caught:  # JSON's string: YAML's double-quoted
        load_with(tmp_path, old, template.format(json.dumps(address)))
    err = caught.value
    assert err.exit_code == 2 and str(tmp_path / "inv.yaml") in str(err)
    assert field in str(err), str(err)
    assert err.fix


def test_an_inventory_with_an_interface_scope_loads(tmp_path: Path, key: Path) -> None:
    """Positive control: a link-local address with its interface, as the head's address
    and as a worker's name and address."""
    inv = load_with(tmp_path, "address: 10.0.0.10", "address: fe80::1%eth0")
    assert inv.head.address == "fe80::1%eth0"  # type: ignore[attr-defined]
    inv = load_with(tmp_path, "  - 10.0.0.12", "  - fe80::2%enp0s31f6")
    assert inv.node("fe80::2%enp0s31f6").address == "fe80::2%enp0s31f6"  # type: ignore[attr-defined]


def test_the_scope_message_says_what_and_how() -> None:
    where = Path("inv.yaml")
    from provisioner.inventory.fields import Where, check_address

    with pytest.raises(InventoryError) as caught:
        check_address("fe80::1%$(id)", Where(where, 7), "head.address")
    err = caught.value
    assert str(err).startswith("inv.yaml:7: head.address: expected an IP address or DNS name")
    assert "scope id is an interface's name" in str(err) and "fe80::1%eth0" in (err.fix or "")


@pytest.mark.parametrize("address", HOSTILE)
def test_a_login_node_answering_a_hostile_address_is_refused(address: str) -> None:
    with pytest.raises(InputError, match="refused a node of the SLURM allocation") as caught:
        AllocatedNode("n-1", address)
    assert caught.value.exit_code == 2 and "login node" in (caught.value.fix or "")


def test_a_login_node_answering_an_interface_scope_is_taken() -> None:
    assert AllocatedNode("n-1", "fe80::1%ib0").address == "fe80::1%ib0"


@pytest.mark.parametrize("address", HOSTILE)
def test_relay_keys_and_certificates_take_only_checked_addresses(address: str) -> None:
    """Defence in depth: authorized_keys' `from="..."` (star and chain relays) and a node
    certificate's names refuse what the check refuses, whoever calls them."""
    key = star.make_relay_key()
    if "," not in address:  # `from="..."` takes a list: a comma separates two addresses
        with pytest.raises(InputError, match="refused to authorize a relay key"):
            star.authorized_line(key, address, "20300101000000Z")
        with pytest.raises(InputError, match="refused to authorize a relay key"):
            star.add_key_command(key, f"10.0.0.1,{address}", 60)
    with pytest.raises(InputError, match="refused to issue a node certificate"):
        tls.subject_names(address)


def test_relay_keys_and_certificates_take_checked_addresses() -> None:
    key = star.make_relay_key()
    line = star.authorized_line(key, "10.0.0.1,fe80::1%eth0", "20300101000000Z")
    assert line.startswith('from="10.0.0.1,fe80::1%eth0",restrict,command="sh -c ')
    names = tls.subject_names("fe80::1%eth0")
    assert names[0].value == ipaddress.ip_address("fe80::1%eth0")


def test_a_node_listing_a_hostile_scope_among_its_addresses_gives_only_checked_ones() -> None:
    """`ray.subnet`: a node's own list of addresses (`hostname -I`'s words) goes through
    the same check before one becomes its Ray address."""
    from provisioner.cluster.subnet import parse_addresses

    words = "10.10.0.3 fe80::1%$(id) fe80::2%eth0 fe80::3%a;id\n"
    assert parse_addresses(words) == ["10.10.0.3", "fe80::2%eth0"]


def test_the_doctors_bash_probe_never_runs_an_address(tmp_path: Path) -> None:
    """The doctor's probe.sh without python3 (its bash fallback) is given a hostile
    address: nothing runs; the same text read as code does run (positive control)."""
    import subprocess

    from provisioner.doctor import gather

    script = (Path(gather.__file__).parent / "probe.sh").read_text()
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("timeout", "bash", "touch"):  # no python3 on this PATH
        (bin_ / tool).symlink_to(subprocess.run(
            ["bash", "-c", f"command -v {tool}"], capture_output=True, text=True, check=True
        ).stdout.strip())  # fmt: skip
    mark = tmp_path / "PWNED"
    hostile = f"fe80::1%$(touch${{IFS}}{mark})"
    env = {"PATH": str(bin_)}
    done = subprocess.run(
        ["bash", "-s", "--", "1", f"{hostile}:9", "127.0.0.1:9"],
        input=script, capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert "127.0.0.1 9 refused" in done.stdout, done.stdout + done.stderr  # it ran the loop
    assert not mark.exists()
    subprocess.run(["bash", "-c", f"echo {hostile}"], env=env, timeout=30, check=False)
    assert mark.exists()  # positive control
