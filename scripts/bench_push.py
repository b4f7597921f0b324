"""Benchmark `provisioner image push` (a script, not a timed test).

Measures, on the nodes of an inventory (the lab's by default):
1. push throughput to one node, side by side with
   `docker save IMAGE | ssh NODE docker load` through OpenSSH on the same image;
2. the re-push time (the node already holds the pin);
3. bytes sent from this machine for all nodes, with and without relay mode.
Each step first removes the image from the nodes it measures, so every figure is of a
full transfer. Prints one JSON document (and writes it with --out). `--small MB` pushes a
small image made here (one layer of MB of fixed pseudo-random bytes, tag
provisioner/bench:push) instead of the pin: the harness's smoke test uses it.

    .venv/bin/python scripts/bench_push.py -i ~/.local/state/provisioner/lab-img/inventory.yaml \
        --lock images/image.lock.json [--node NAME] [--skip-fanout] [--small MB] \
        [--out bench-results/push.json]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from provisioner.console import quiet
from provisioner.image.pin import CLUSTER_TAG, Pin, read_pin
from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.remote import Pool
from provisioner.runtime.docker.push import PushOptions, push_image

SMALL_TAG = "provisioner/bench:push"


def small_pin(pin: Pin, megabytes: int) -> Pin:
    """A one-layer image of `megabytes` fixed pseudo-random bytes (the same ID on every run)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.labtools
    from tests.labtools.filler import filler_image

    return filler_image(pin, f"{SMALL_TAG}-{megabytes}", megabytes)


def remove_pin(inv: Inventory, nodes: list[Node], pin: Pin, tag: str = CLUSTER_TAG) -> None:
    """Remove the image, its tag and every image that starts with the pin's first layer
    (what a push's head start loads ahead, were it left) from the nodes (containers
    using them stay)."""
    first = shlex.quote(pin.layers[0])
    starting = (
        "docker image ls -aq --no-trunc | sort -u | xargs -r docker image inspect "
        "--format '{{.Id}} {{index .RootFS.Layers 0}}' 2>/dev/null "
        f"| awk -v f={first} '$2 == f {{print $1}}'"
    )
    images = shlex.join([tag, pin.image_id])
    with Pool(inv) as pool:
        for node in nodes:
            pool.session(node).run(
                f"docker image rm -f {images} $({starting}) >/dev/null 2>&1; true",
                timeout=120,
            )


def openssh_baseline(node: Node, pin: Pin) -> float:
    """Seconds for `docker save IMAGE | ssh NODE docker load` through OpenSSH."""
    ssh = [
        "ssh",
        "-p",
        str(node.ssh.port),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
    ]
    if node.ssh.key:
        ssh += ["-i", str(node.ssh.key), "-o", "IdentitiesOnly=yes"]
    for kh in node.ssh.known_hosts:
        ssh += ["-o", f"UserKnownHostsFile={kh}"]
    ssh += [f"{node.ssh.user}@{node.address}", "docker load"]
    pipeline = f"set -o pipefail; docker save {shlex.quote(pin.image_id)} | {shlex.join(ssh)}"
    t0 = time.monotonic()
    subprocess.run(["bash", "-c", pipeline], check=True, capture_output=True)
    return time.monotonic() - t0


def one_node(inv: Inventory, node: Node) -> Inventory:
    return replace(inv, head=replace(node, role="head"), workers=())


def measure(
    inv: Inventory, pin: Pin, node: Node, *, tag: str = CLUSTER_TAG, fanout: bool = True
) -> dict[str, Any]:
    """The figures for one run: OpenSSH pipeline, push, re-push, then direct and relay."""
    single = one_node(inv, node)
    opts = PushOptions(tag=tag)
    results: dict[str, Any] = {"image_id": pin.image_id, "image_bytes": pin.size, "node": node.name}
    remove_pin(inv, [node], pin, tag)
    results["openssh_seconds"] = round(openssh_baseline(node, pin), 2)
    remove_pin(inv, [node], pin, tag)
    report = push_image(single, None, quiet, pin=pin, opts=opts)
    if not report.ok:
        raise SystemExit(f"push failed: {report.errors}")
    sent = report.nodes[node.name]
    results["push_seconds"] = round(sent.seconds, 2)
    results["push_bytes"] = sent.bytes_sent
    results["push_vs_openssh"] = round(results["openssh_seconds"] / sent.seconds, 2)
    again = push_image(single, None, quiet, pin=pin, opts=opts)
    results["repush_seconds"] = round(again.seconds, 2)
    results["repush_bytes"] = again.control_bytes
    if fanout:
        for relay in (False, True):
            remove_pin(inv, list(inv.nodes), pin, tag)
            report = push_image(inv, None, quiet, pin=pin, opts=replace(opts, star=relay))
            if not report.ok:
                raise SystemExit(f"push (relay={relay}) failed: {report.errors}")
            key = "relay" if relay else "direct"
            results[f"{key}_nodes"] = len(inv.nodes)
            results[f"{key}_control_bytes"] = report.control_bytes
            results[f"{key}_seconds"] = round(report.seconds, 2)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("-i", "--inventory", type=Path, required=True)
    parser.add_argument("--lock", type=Path, default=None)
    parser.add_argument("--node", default=None, help="node for the one-node figures")
    parser.add_argument("--skip-fanout", action="store_true", help="only the one-node figures")
    parser.add_argument("--small", type=int, default=0, metavar="MB", help="a small image")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    inv = load_inventory(args.inventory)
    pin = read_pin(args.lock or inv.image_lock or Path("images/image.lock.json"))
    if args.small:
        pin = small_pin(pin, args.small)
    node = inv.node(args.node) if args.node else (inv.workers or (inv.head,))[0]
    tag = pin.tag if args.small else CLUSTER_TAG
    results = measure(inv, pin, node, tag=tag, fanout=not args.skip_fanout)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
