"""Benchmark a push over a slow link and over the lab's own link (a script for bench.py).

One lab node's SSH link is limited with the lab's delay proxy (a token bucket in user
space: provisioner.lab.faults.throttle), then, side by side on the same node and image:
- `docker save IMAGE | ssh NODE docker load` (the plain pipe);
- `docker save IMAGE | gzip -1 | ssh NODE 'gunzip | docker load'` (the gzip pipe);
- `provisioner image push` from a cold start: neither the saved image nor any compressed
  layer on this machine (so `docker save` and the compression are paid);
- the same push again from a warm cache (the second cluster's push: nothing compressed).
Each run first removes the image from the node, so every figure is of a full transfer.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench_push import one_node, remove_pin

from provisioner.console import quiet
from provisioner.image.pin import CLUSTER_TAG, Pin
from provisioner.inventory import Inventory, Node
from provisioner.runtime.docker.push import PushOptions, push_image


def ssh_argv(node: Node, command: str) -> list[str]:
    argv = [
        "ssh",
        "-p",
        str(node.ssh.port),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
    ]
    if node.ssh.key:
        argv += ["-i", str(node.ssh.key), "-o", "IdentitiesOnly=yes"]
    for kh in node.ssh.known_hosts:
        argv += ["-o", f"UserKnownHostsFile={kh}"]
    return [*argv, f"{node.ssh.user}@{node.address}", command]


def pipe_seconds(node: Node, pin: Pin, gzip: bool) -> float:
    """Seconds for the plain or the gzip pipe, checked: the node then holds the pin."""
    image = shlex.quote(pin.image_id)
    if gzip:
        ssh = shlex.join(ssh_argv(node, "gunzip | docker load"))
        pipeline = f"set -o pipefail; docker save {image} | gzip -1 | {ssh}"
    else:
        pipeline = (
            f"set -o pipefail; docker save {image} | {shlex.join(ssh_argv(node, 'docker load'))}"
        )
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", pipeline], capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if proc.returncode != 0 or pin.image_id.removeprefix("sha256:")[:12] not in proc.stdout:
        raise RuntimeError(f"pipe failed: {proc.stdout[-200:]} {proc.stderr[-300:]}")
    return took


def push_seconds(inv: Inventory, pin: Pin, cache: Path, compress: str) -> dict[str, Any]:
    opts = PushOptions(tag=CLUSTER_TAG, cache_dir=cache, compress=compress)  # type: ignore[arg-type]
    t0 = time.monotonic()
    report = push_image(inv, None, quiet, pin=pin, opts=opts)
    took = time.monotonic() - t0
    if not report.ok:
        raise RuntimeError(f"push failed: {report.errors}")
    node = next(iter(report.nodes.values()))
    return {
        "seconds": took,
        "bytes": node.bytes_sent,
        "head_start_bytes": node.head_start_bytes,
        "codec": node.codec,
        "why": node.compress_reason,
        "cache_hits": node.cache_hits,
        "cache_misses": node.cache_misses,
    }


def measure(
    inv: Inventory, pin: Pin, node: Node, cache: Path, *, gzip: bool = True, warm: bool = True
) -> dict[str, Any]:
    """One repeat on `node` (its link as it is set now)."""
    single = one_node(inv, node)
    out: dict[str, Any] = {"node": node.name, "image_bytes": pin.size}
    shutil.rmtree(cache, ignore_errors=True)  # cold: no saved image, no compressed layer
    remove_pin(inv, [node], pin)
    out["cold"] = push_seconds(single, pin, cache, "auto")
    if warm:
        remove_pin(inv, [node], pin)
        out["warm"] = push_seconds(single, pin, cache, "auto")
    remove_pin(inv, [node], pin)
    out["pipe_s"] = pipe_seconds(node, pin, gzip=False)
    if gzip:
        remove_pin(inv, [node], pin)
        out["gzip_pipe_s"] = pipe_seconds(node, pin, gzip=True)
    return out
