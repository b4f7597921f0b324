"""The lab's pure parts: addresses, inventory, docker arguments, validation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provisioner.errors import InputError
from provisioner.lab.config import (
    LabConfig,
    inventory_document,
    known_hosts_lines,
    node_run_args,
)
from tests.cli import cli


def test_nodes_get_fixed_addresses_head_first() -> None:
    cfg = LabConfig(name="t", subnet="10.250.7.0/24", nodes=3)
    nodes = cfg.lab_nodes()
    assert [(n.name, n.address, n.role) for n in nodes] == [
        ("provisioner-t-0", "10.250.7.10", "head"),
        ("provisioner-t-1", "10.250.7.11", "worker"),
        ("provisioner-t-2", "10.250.7.12", "worker"),
    ]
    assert cfg.network == "provisioner-t" and cfg.gateway == "10.250.7.1"


def test_inventory_document_is_strict_and_relative() -> None:
    cfg = LabConfig(name="t", subnet="10.250.7.0/24", nodes=2)
    doc = inventory_document(cfg)
    assert doc["ssh"]["host_key_policy"] == "strict"
    assert doc["ssh"]["key"] == "id_ed25519" and doc["ssh"]["known_hosts"] == "known_hosts"
    assert doc["head"] == {"name": "provisioner-t-0", "address": "10.250.7.10"}
    assert doc["workers"] == [{"name": "provisioner-t-1", "address": "10.250.7.11"}]
    assert yaml.safe_load(yaml.safe_dump(doc)) == doc


def test_known_hosts_lines_take_each_key_type() -> None:
    pubs = (
        "ssh-ed25519 AAAAC3Nz root@n0\n"
        "ecdsa-sha2-nistp256 AAAAE2Vj root@n0\n"
        "ssh-rsa AAAAB3Nz root@n0\n"
        "garbage\n"
    )
    assert known_hosts_lines("10.250.7.10", pubs) == [
        "10.250.7.10 ssh-ed25519 AAAAC3Nz",
        "10.250.7.10 ecdsa-sha2-nistp256 AAAAE2Vj",
        "10.250.7.10 ssh-rsa AAAAB3Nz",
    ]


def test_node_run_args_pin_address_and_avoid_privileged() -> None:
    cfg = LabConfig(name="t", subnet="10.250.7.0/24", nodes=1)
    args = node_run_args(cfg, cfg.lab_nodes()[0], "img:1")
    assert "--privileged" not in args
    assert args[args.index("--ip") + 1] == "10.250.7.10"
    assert args[args.index("--cap-drop") + 1] == "SYS_RESOURCE"
    assert "/sys/fs/cgroup:/sys/fs/cgroup:rw" in args
    assert args[-1] == "img:1"
    # every node of the lab has the lab's one shared folder at the same path
    assert f"{cfg.shared_dir}:/srv/shared:rw" in args


def test_a_podman_lab_names_runtime_and_pin_and_stores_images_for_the_user(
    tmp_path: Path,
) -> None:
    cfg = LabConfig(name="t", subnet="10.250.7.0/24", nodes=2, runtime="podman")
    lock = tmp_path / "image.lock.json"
    doc = inventory_document(cfg, lock)
    assert doc["runtime"] == "podman" and doc["image"] == {"lock": str(lock.resolve())}
    node = cfg.lab_nodes()[0]
    args = node_run_args(cfg, node, "img:1")
    assert f"{cfg.node_storage(node)}:/home/lab/.local/share/containers:rw" in args
    docker = LabConfig(name="t", subnet="10.250.7.0/24", nodes=2)
    assert f"{docker.node_storage(node)}:/var/lib/docker:rw" in node_run_args(docker, node, "i")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"name": "Bad Name"}, "invalid lab name"),
        ({"name": "-x"}, "invalid lab name"),
        ({"subnet": "8.8.8.0/24"}, "private IPv4"),
        ({"subnet": "nonsense"}, "invalid lab subnet"),
        ({"nodes": 0}, "between 1 and"),
        ({"subnet": "10.250.0.0/29", "nodes": 3}, "too small"),
        ({"subnet": "10.250.7.0/24", "data_subnet": "10.250.7.128/25"}, "apart from"),
        ({"data_subnet": "8.8.8.0/24"}, "private IPv4"),
        ({"data_subnet": "nonsense"}, "invalid --data-subnet"),
        ({"data_subnet": "10.251.0.0/29", "nodes": 3}, "too small"),
        ({"data_subnet": "10.251.0.0/24", "slurm": True, "runtime": "host"}, "SLURM"),
    ],
)
def test_bad_lab_settings_are_input_errors(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        LabConfig(**kwargs)  # type: ignore[arg-type]


def test_cli_bad_input_exits_2_without_traceback() -> None:
    r = cli("lab", "up", "--nodes", "0")
    assert r.exit_code == 2
    assert "between 1 and" in r.stderr and "Traceback" not in r.stderr
    r = cli("lab", "up", "--nodes", "many")
    assert r.exit_code == 2 and "Traceback" not in r.stderr


def test_cli_unknown_command_exits_2() -> None:
    r = cli("frobnicate")
    assert r.exit_code == 2


def test_clock_fault_preloads_libfaketime_for_ssh_sessions_and_its_undo_removes_it() -> None:
    from provisioner.lab.faults import clock_script, unclock_script

    assert clock_script(-300) == (
        "lib=$(dpkg -L libfaketime 2>/dev/null | grep '/libfaketime.so.1$' | head -n 1); "
        '[ -n "$lib" ] || { echo "libfaketime is not installed (Debian: faketime)"; exit 1; }; '
        "printf '%s\\n' \"LD_PRELOAD=$lib\" FAKETIME=-300 FAKETIME_DONT_FAKE_MONOTONIC=1 "
        ">> /etc/environment"
    )
    assert unclock_script() == (
        "[ ! -e /etc/environment ] || "
        "sed -i -E '/^(LD_PRELOAD|FAKETIME|FAKETIME_DONT_FAKE_MONOTONIC)=/d' /etc/environment"
    )


@pytest.mark.parametrize("seconds", ["0", str(10**8 + 1)])
def test_cli_clock_fault_out_of_range_exits_2(seconds: str) -> None:
    result = cli("lab", "fault", "clock", "1", seconds, "--name", "no-such-lab-29")
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "clock offset" in result.stderr and "Traceback" not in result.stderr


def test_a_data_network_gives_each_node_its_ray_address() -> None:
    from provisioner.lab.config import data_network_script

    cfg = LabConfig(name="t", subnet="10.250.7.0/24", nodes=2, data_subnet="10.250.8.0/24")
    _, worker = cfg.lab_nodes()
    assert (worker.address, worker.data_address) == ("10.250.7.11", "10.250.8.11")
    assert cfg.data_network == "provisioner-t_data"  # `_`: no lab's own network name
    doc = inventory_document(cfg)
    assert doc["head"] == {
        "name": "provisioner-t-0",
        "address": "10.250.7.10",
        "ray": {"address": "10.250.8.10"},
    }
    assert doc["workers"][0]["ray"] == {"address": "10.250.8.11"}
    assert "ray" not in inventory_document(LabConfig(name="t", nodes=2))["head"]
    c = "-m comment --comment tag"
    assert data_network_script(worker, "tag") == (
        "{ iptables -C INPUT -d 10.250.7.11 -p tcp ! --dport 22 -m conntrack --ctstate NEW "
        f"! -i lo {c} -j DROP 2>/dev/null || iptables -I INPUT -d 10.250.7.11 -p tcp "
        f"! --dport 22 -m conntrack --ctstate NEW ! -i lo {c} -j DROP; }}; "
        f"{{ iptables -C INPUT -d 10.250.8.11 -p tcp --dport 22 {c} -j DROP 2>/dev/null || "
        f"iptables -I INPUT -d 10.250.8.11 -p tcp --dport 22 {c} -j DROP; }}"
    )


def test_the_lab_builds_each_runtimes_nodes_by_the_recipe_that_runtime_gives() -> None:
    """The lab names no runtime: each registered runtime gives it a node recipe (its
    folder's lab.py), whose Dockerfile is one of the lab's, and the lab's choices follow it:
    where a node's storage is mounted, whether the inventory names the pin, which runtime a
    SLURM lab runs, and the --runtime error's list."""
    from provisioner.lab.config import slurm_runtime
    from provisioner.runtime.registry import lab_recipe, names

    recipes = Path(__file__).parents[2] / "provisioner" / "lab" / "recipe"
    for name in names():
        assert (recipes / lab_recipe(name).dockerfile).is_file(), name
    assert LabConfig(runtime="docker").storage_target == "/var/lib/docker"
    assert LabConfig(runtime="host").storage_target == "/var/lib/docker"
    assert LabConfig(runtime="podman").storage_target == "/home/lab/.local/share/containers"
    assert slurm_runtime() == "host" and LabConfig.from_env(slurm=True).runtime == "host"
    lock = Path("/x/image.lock")
    assert inventory_document(LabConfig(runtime="podman"), lock)["image"] == {"lock": str(lock)}
    assert "image" not in inventory_document(LabConfig(runtime="host"), lock)
    with pytest.raises(InputError) as bad:
        LabConfig(runtime="nope")
    assert "nope" in bad.value.message
    assert "podman: nodes with rootless Podman for the pinned image" in bad.value.fix
    with pytest.raises(InputError, match="runs Ray in host mode"):
        LabConfig(runtime="docker", slurm=True)
