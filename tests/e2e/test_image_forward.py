"""End to end: the forwarding relay (`image push --forward`) on the lab's real sshd and dockerd.

Small test images (fixed pseudo-random bytes, one or two layers) keep it cheap. Bytes
are counted on the wire by the kernel (provisioner.lab.wire: iptables counters in each
node), not taken from the push's own report. The tests leave the cluster image alone
and remove their own images from the nodes at the end.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.image.lock import Pin, read_pin
from provisioner.image.push import PushOptions, PushReport, push_image
from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.lab import faults, wire
from provisioner.lab.engine import exec_rc
from provisioner.lab.images import filler_image
from provisioner.lab.nodes import LabInfo

REPO = "provisioner/forward-test"


@pytest.fixture(scope="module")
def base_pin(image_pin: Path) -> Pin:
    return read_pin(image_pin)


@pytest.fixture(scope="module")
def inventory(lab: LabInfo) -> Iterator[Inventory]:
    inv = load_inventory(lab.inventory)
    yield inv
    for node in inv.nodes:  # the test images go; the cluster image stays
        on_node(node, f"docker image ls -q '{REPO}' | sort -u | xargs -r docker image rm -f")
    wire.stop(lab)
    shutil.rmtree(CACHE, ignore_errors=True)


def on_node(node: Node, script: str) -> tuple[int, str]:
    return exec_rc(node.name, script, timeout=120)


def image_on(node: Node, ref: str) -> str:
    rc, out = on_node(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    return out.strip() if rc == 0 else ""


def remove(nodes: list[Node], *pins: Pin) -> None:
    refs = " ".join(f"{p.tag} {p.image_id}" for p in pins)
    for node in nodes:
        on_node(node, f"docker image rm -f {refs} >/dev/null 2>&1; true")
        assert all(image_on(node, p.image_id) == "" for p in pins)


def authorized_keys(node: Node) -> bytes:
    rc, out = on_node(node, f"base64 -w0 /home/{node.ssh.user}/.ssh/authorized_keys")
    assert rc == 0, out
    return base64.b64decode(out.strip())


CACHE = Path(tempfile.gettempdir()) / "provisioner-forward-test-cache"  # not the user's cache


def push(inv: Inventory, pin: Pin, *, relay: bool = False, forward: bool = False) -> PushReport:
    opts = PushOptions(tag=pin.tag, relay=relay, forward=forward, cache_dir=CACHE)
    return push_image(inv, None, print, pin=pin, opts=opts)


def test_forward_sends_one_image_from_the_control_machine_and_at_most_one_per_node(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    pin = filler_image(base_pin, f"{REPO}:blob16", 16)
    keys = {n.name: authorized_keys(n) for n in inventory.nodes}
    # the star relay first, for contrast: its head sends the image to each worker
    remove(list(inventory.nodes), pin)
    wire.start(lab)
    star = push(inventory, pin, relay=True)
    star_wire = wire.read(lab)
    remove(list(inventory.nodes), pin)
    wire.start(lab)

    report = push(inventory, pin, forward=True)

    counted = wire.read(lab)
    assert report.ok and star.ok, (report.errors, star.errors)
    size = pin.size
    for node in inventory.nodes:  # verified and tagged everywhere; keys as they were
        assert image_on(node, pin.tag) == pin.image_id
        assert authorized_keys(node) == keys[node.name], node.name
    control = sum(w.from_control for w in counted.values())
    busiest = max(w.to_nodes for w in counted.values())
    star_head = star_wire[inventory.head.name].to_nodes
    print(f"image {size} B; forward: control {control} B, busiest {busiest} B; star {star_head} B")
    # the control machine sends the image once (plus SSH and TCP/IP framing)
    assert size < control < 1.15 * size
    # no node sends more than one image in a clean run (the bound is two images)
    assert busiest < 1.15 * size
    assert star_head > 1.9 * size  # the star relay's head sent N-1 = 2 images
    # the push's own accounting (bytes each receiver counted) agrees with the wire
    assert report.control_bytes <= control and report.busiest_node_bytes <= busiest
    assert report.busiest_node_bytes > 0.95 * size
    vias = [report.nodes[n.name].via for n in inventory.nodes]
    assert vias == ["control", inventory.nodes[0].name, inventory.nodes[1].name]


def test_forward_sends_a_node_only_its_missing_layers_and_skips_a_node_that_has_everything(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    bottom = filler_image(base_pin, f"{REPO}:blob16", 16)
    top = filler_image(base_pin, f"{REPO}:top8", 8, parent=bottom.tag)
    assert top.layers[:1] == bottom.layers
    first, second, third = inventory.nodes
    remove([first], top, bottom)  # nothing
    remove([second], top)  # the bottom layer
    push(replace(inventory, head=replace(third, role="head"), workers=()), top)  # everything
    assert image_on(third, top.image_id) == top.image_id
    wire.start(lab)

    report = push(inventory, top, forward=True)

    counted = wire.read(lab)
    assert report.ok, report.errors
    for node in inventory.nodes:
        assert image_on(node, top.tag) == top.image_id
    assert report.nodes[third.name].action == "none"
    assert counted[third.name].from_control < 100_000  # the facts round trip only
    assert counted[first.name].to_nodes < 0.7 * top.size  # to the second: the top layer only
    got = report.nodes[second.name]
    assert got.via == first.name and got.layers_sent == 1
    assert got.bytes_sent < 0.6 * top.size
    assert report.nodes[first.name].bytes_sent > 0.95 * top.size


def test_a_node_stopped_mid_relay_leaves_the_nodes_after_it_with_the_verified_image(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    pin = filler_image(base_pin, f"{REPO}:blob128", 128)
    first, middle, last = inventory.nodes
    remove(list(inventory.nodes), pin)
    keys = authorized_keys(middle)
    wire.start(lab)
    result: list[PushReport] = []
    worker = threading.Thread(target=lambda: result.append(push(inventory, pin, forward=True)))
    worker.start()
    try:
        # once the stream has reached the last node, the middle one is powered off
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if on_node(last, "pgrep -f '^docker load$'")[0] == 0:
                break
            time.sleep(0.1)
        faults.stop(lab, lab.node(middle.name))
        worker.join(600)
        assert result, "the push did not return"
        report = result[0]
        counted = wire.read(lab, (lab.node(first.name), lab.node(last.name)))
    finally:
        faults.start(lab, lab.node(middle.name))
        # undo: the relay key and its directory stayed on the node that was off
        rc, out = on_node(
            middle,
            f"printf %s {base64.b64encode(keys).decode()} | base64 -d > /home/{middle.ssh.user}"
            "/.ssh/authorized_keys; rm -rf /tmp/tmp.*",
        )
        assert rc == 0, out

    assert middle.name in report.errors  # named, with its fix
    for node in (first, last):
        assert image_on(node, pin.tag) == pin.image_id, node.name
    again = report.nodes[last.name]
    assert again.via == first.name and again.attempts == 2  # re-fed from the first node
    # the first node sent its stream twice at most: to the middle one and again to the last
    assert counted[first.name].to_nodes < 2.2 * pin.size
    assert sum(w.from_control for w in counted.values()) < 1.2 * pin.size
