"""Helpers for end-to-end tests: reach lab nodes through the real OpenSSH client."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from provisioner.cli import run
from provisioner.image.lock import Pin
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.engine import client
from provisioner.lab.nodes import LabInfo


def ssh_args(lab: LabInfo, node: LabNode, *extra: str) -> list[str]:
    """OpenSSH client arguments with STRICT host key checking against the lab's known_hosts."""
    return lab.ssh_command(node, *extra)


def ssh(
    lab: LabInfo, node: LabNode, command: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a command on a lab node through the real OpenSSH client."""
    return subprocess.run(
        [*ssh_args(lab, node), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def ssh_only_through_a_jump(lab: LabInfo, node: LabNode) -> Iterator[None]:
    """`node` drops SSH from the control machine (`lab fault isolate`); other nodes still
    reach it. Undone when the block ends (and by `lab fault clear` after an aborted run)."""
    faults.isolate(lab, node)
    try:
        direct = ssh(lab, node, "true")
        assert direct.returncode != 0, f"{node.name} still answers SSH from the control machine"
        yield
    finally:
        faults.unisolate(lab, node)


def jumped_inventory(source: Path, target: Path, lab: LabInfo, node: LabNode) -> Path:
    """A copy of the inventory `source` (paths made absolute) where `node` is reached
    through the head (`jump: USER@HEAD:22`), with a short connect timeout."""
    from tests.e2e.faults.lab import edited_inventory

    edited_inventory(source, target, ssh={"connect_timeout": 3})
    document = yaml.safe_load(target.read_text())
    head = lab.nodes[0]
    (entry,) = [w for w in document["workers"] if w["name"] == node.name]
    entry["jump"] = f"{head.user}@{head.address}:22"
    target.write_text(yaml.safe_dump(document))
    return target


def cli(*args: str) -> tuple[int, str, str]:
    """The CLI in-process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> tuple[int, Any, str]:
    """The CLI with --json: exit code, the parsed stdout, stderr."""
    code, out, err = cli(*args, "--json")
    return code, json.loads(out), err


def small_image(base: Pin, repo: str, name: str, megabytes: int, parent: str = "scratch") -> Pin:
    """A test image `repo:name`: `parent` plus one layer of `megabytes` fixed pseudo-random
    bytes (the same bytes for the same name), pinned like `base`: cheap to push."""
    with tempfile.TemporaryDirectory(prefix="small-image-") as tmp:
        blob = Path(tmp) / name
        blob.write_bytes(random.Random(name).randbytes(megabytes * 1024 * 1024))
        os.utime(blob, (0, 0))
        (Path(tmp) / "Dockerfile").write_text(f"FROM {parent}\nCOPY {name} /{name}\n")
        image, _ = client().images.build(path=tmp, tag=f"{repo}:{name}", rm=True)
    attrs = client().api.inspect_image(image.id)
    return replace(
        base,
        image_id=image.id,
        layers=tuple(attrs["RootFS"]["Layers"]),
        layer_sizes=None,
        size=int(attrs["Size"]),
        tag=f"{repo}:{name}",
    )
