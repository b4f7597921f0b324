"""The project rows of `make bench` (`--rows project`): `image build --project` of
examples/gridcells after a one-line change, and the push of the result to a node holding
the previous build.

Each repeat changes one line of the example's environment (a copy in the bench's work
dir), times `provisioner image build --project` as a user runs it (a new process: pip
builds the wheel, Docker builds on the cached layers), then pushes the new pin to one lab
node that holds the previous one and reads the bytes sent from the push report.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.image.pin import Pin, read_pin
from provisioner.inventory import Inventory, Node
from provisioner.local import docker_client
from provisioner.runtime.docker.push import PushOptions, push_image

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "gridcells"
CLI = (sys.executable, "-m", "provisioner", "image", "build")
LINE = "reward = float(covered.sum()) - 0.1"


def copy_example(workdir: Path) -> Path:
    project = workdir / "gridcells"
    if project.exists():
        shutil.rmtree(project)
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("image.lock.json"))
    return project


def build(project: Path, images: Path) -> tuple[Pin, float]:
    """`provisioner image build --project` in a process of its own: the pin and seconds."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [*CLI, "--project", str(project), "--images-dir", str(images), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"image build --project failed: {proc.stderr[-2000:]}")
    return read_pin(Path(json.loads(proc.stdout)["lock"])), seconds


class _Chunks(io.RawIOBase):
    """A file over Docker's `save` stream (an iterator of byte chunks)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not self.rest:
            self.rest = next(self.chunks, b"")
            if not self.rest:
                return 0
        n = min(len(buf), len(self.rest))
        buf[:n], self.rest = self.rest[:n], self.rest[n:]
        return n


def last_layer_tar_bytes(image_id: str) -> int:
    """The size of the image's last layer as `docker save` writes it (the tar that moves):
    the pin's layer sizes count file contents only, not the tar's headers."""
    stream = docker_client().api.get_image(image_id)
    sizes: dict[str, int] = {}
    manifest: Any = None
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(iter(stream))), mode="r|") as tar:
        for member in tar:
            sizes[member.name] = member.size
            if member.name == "manifest.json":
                f = tar.extractfile(member)
                manifest = json.loads(f.read()) if f else None
    if not manifest:
        raise RuntimeError("docker save gave no manifest.json")
    return sizes[manifest[0]["Layers"][-1]]


def one_node(inv: Inventory, node: Node) -> Inventory:
    return replace(inv, head=replace(node, role="head"), workers=())


def push_bytes(inv: Inventory, pin: Pin) -> tuple[int, int, str]:
    """Bytes sent, layers sent and the codec ("" plain) to the inventory's one node."""
    report = push_image(inv, None, pin=pin, opts=PushOptions())
    if not report.ok:
        raise RuntimeError(f"push failed: {report.errors}")
    (node,) = report.nodes.values()
    return node.bytes_sent, node.layers_sent, node.codec


def measure(inv: Inventory, project: Path, images: Path, step: int) -> dict[str, Any]:
    """One repeat: a one-line change (the reward's cost, a value of this run's own: the
    builds are reproducible, so a change an earlier run made builds the image the node
    may hold already), rebuilt, pushed to the node, which holds the build before it."""
    env = project / "src" / "gridcells" / "env.py"
    before, _ = build(project, images)  # the node holds this one (pushed below)
    push_bytes(inv, before)
    text = env.read_text()
    cost = 0.1 + step / 1000 + (time.time_ns() // 1000 % 10**6) / 1e10
    changed_line = f"reward = float(covered.sum()) - {cost:.10f}"
    env.write_text(text.replace(LINE, changed_line))
    try:
        after, seconds = build(project, images)
    finally:
        env.write_text(text)
    sent, layers, codec = push_bytes(inv, after)
    if layers == 0:
        raise RuntimeError(f"the node held {after.short_id()} already: nothing was sent")
    last = after.layer_sizes[-1] if after.layer_sizes else 0
    last_tar = last_layer_tar_bytes(after.image_id)
    same_below = after.layers[:-1] == before.layers[:-1] and after.layers[-1] != before.layers[-1]
    return {
        "rebuild_seconds": seconds,
        "bytes_sent": sent,
        "layers_sent": layers,
        "codec": codec,
        "own_layer_bytes": last,  # its files' contents (docker history)
        "own_layer_tar_bytes": last_tar,  # the layer as docker save writes it
        "only_last_layer_differs": same_below,
        "project_layers_bytes": after.bytes_for(after.extra["project"]["base_pin"]["layers"]),
    }
