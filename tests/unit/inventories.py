"""Inventories built in memory for unit tests of pure logic (render, command builders)."""

from __future__ import annotations

from pathlib import Path

from provisioner.inventory import Inventory, Node, SSHSettings
from provisioner.runtime.docker.runtime import DockerRuntime


def make_inventory(tmp: Path, *, workers: int = 2, **kw: object) -> Inventory:
    key = tmp / "id_ed25519"
    key.write_text("not a real key\n")
    ssh = SSHSettings(user="lab", key=key)
    head = Node("head-0", "10.250.9.10", "head", ssh, {"accel": 1.0}, {"zone": "a"})
    nodes = tuple(
        Node(f"worker-{i}", f"10.250.9.{10 + i}", "worker", ssh) for i in range(1, workers + 1)
    )
    return Inventory(path=tmp / "inventory.yaml", cluster="demo", head=head, workers=nodes, **kw)  # type: ignore[arg-type]


def docker_runtime(inventory: Inventory, image: str) -> DockerRuntime:
    """The docker runtime running `image` (no pin: the render tests name the image)."""
    return DockerRuntime(inventory, None, image=image)
