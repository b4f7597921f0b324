"""The runtime registry: the inventory holds a runtime's name as data; the registry builds
the runtime it names, and refuses a name it does not know at the place it is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.errors import InventoryError
from provisioner.inventory import load_inventory
from provisioner.runtime import registry
from provisioner.runtime.docker.runtime import DockerRuntime
from provisioner.runtime.host.runtime import HostRuntime
from tests.cli import cli

INVENTORY = """\
cluster: demo
ssh:
  user: lab
head: 10.250.9.10
workers: [10.250.9.11]
"""


def write(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY + extra)
    return path


def test_each_registered_runtime_is_built_from_its_module(tmp_path: Path) -> None:
    docker = registry.runtime_for(load_inventory(write(tmp_path)))
    host = registry.runtime_for(load_inventory(write(tmp_path, "runtime: host\n")))
    assert isinstance(docker, DockerRuntime) and isinstance(host, HostRuntime)
    assert (docker.caps.containers, docker.caps.needs_image) == (True, True)
    assert (host.caps.containers, host.caps.needs_image) == (False, False)
    assert registry.names() == ("docker", "host", "podman")


def test_an_unknown_runtime_is_refused_where_the_inventory_names_it(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime: dokcer\n")
    inventory = load_inventory(path)  # the name is data to the inventory
    assert inventory.runtime == "dokcer"
    with pytest.raises(InventoryError) as caught:
        registry.runtime_for(inventory)
    assert caught.value.message == "runtime: expected docker | host | podman, got 'dokcer'"
    assert caught.value.where == f"{path}:6"
    assert "docker: Ray in the pinned image's container" in (caught.value.fix or "")


def test_the_cli_refuses_an_unknown_runtime_with_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime: dokcer\n")
    result = cli("doctor", "-i", str(path))
    assert result.exit_code == 2, result
    assert "expected docker | host | podman, got 'dokcer'" in result.stderr
    assert f"{path}:6" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_runtime_that_is_no_name_is_refused_at_load(tmp_path: Path) -> None:
    path = write(tmp_path, "runtime: [docker]\n")
    with pytest.raises(InventoryError) as caught:
        load_inventory(path)
    assert caught.value.message.startswith("runtime: expected a runtime's name")
    assert caught.value.where == f"{path}:6"
