"""The project rows of `make bench` (`--rows project`): `image build --project` of
examples/gridcells after a one-line change, and the push of the result to a node holding
the previous build.

Each repeat changes one line of the example's environment (a copy in the bench's work
dir), times `provisioner image build --project` as a user runs it (a new process: pip
builds the wheel, Docker builds on the cached layers), then pushes the new pin to one lab
node that holds the previous one and reads the bytes sent from the push report.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.image.pin import Pin, read_pin
from provisioner.inventory import Inventory, Node
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


def one_node(inv: Inventory, node: Node) -> Inventory:
    return replace(inv, head=replace(node, role="head"), workers=())


def push_bytes(inv: Inventory, pin: Pin) -> tuple[int, int]:
    """Bytes sent and layers sent to the inventory's one node."""
    report = push_image(inv, None, pin=pin, opts=PushOptions())
    if not report.ok:
        raise RuntimeError(f"push failed: {report.errors}")
    (node,) = report.nodes.values()
    return node.bytes_sent, node.layers_sent


def measure(inv: Inventory, project: Path, images: Path, step: int) -> dict[str, Any]:
    """One repeat: a one-line change (reward cost 0.1 + step/1000), rebuilt, pushed to the
    node, which holds the build before it."""
    env = project / "src" / "gridcells" / "env.py"
    before, _ = build(project, images)  # the node holds this one (pushed below)
    push_bytes(inv, before)
    text = env.read_text()
    changed_line = f"reward = float(covered.sum()) - {0.1 + step / 1000:.3f}"
    env.write_text(text.replace(LINE, changed_line))
    try:
        after, seconds = build(project, images)
    finally:
        env.write_text(text)
    sent, layers = push_bytes(inv, after)
    last = after.layer_sizes[-1] if after.layer_sizes else 0
    same_below = after.layers[:-1] == before.layers[:-1] and after.layers[-1] != before.layers[-1]
    return {
        "rebuild_seconds": seconds,
        "bytes_sent": sent,
        "layers_sent": layers,
        "own_layer_bytes": last,
        "only_last_layer_differs": same_below,
        "project_layers_bytes": after.bytes_for(after.extra["project"]["base_pin"]["layers"]),
    }
