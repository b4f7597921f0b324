"""End to end: the chain (`image push --chain`) on the lab's real sshd and dockerd.

Small test images (fixed pseudo-random bytes, one or two layers) keep it cheap. Bytes
are counted on the wire by the kernel (tests/labtools/wire.py: iptables counters in each
node), not taken from the push's own report. The tests leave the cluster image alone
and remove their own images from the nodes at the end.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from provisioner.image.pin import Pin, read_pin
from provisioner.image.savestream import containerd_id
from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.lab import faults
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.delivery import DeliveryReport
from provisioner.runtime.docker.chain_plan import (
    FOREIGN_RC,
    hop_script,
    parse_round_result,
    round_result_command,
)
from provisioner.runtime.docker.direct import SavedCache
from provisioner.runtime.docker.push import PushOptions, push_image
from provisioner.runtime.docker.star import RELAY_COMMAND
from tests.labtools import wire
from tests.labtools.filler import filler_image

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
    shutil.rmtree(IDS_CACHE, ignore_errors=True)


def on_node(node: Node, script: str) -> tuple[int, str]:
    return exec_rc(node.name, script, timeout=120)


def image_on(node: Node, ref: str) -> str:
    rc, out = on_node(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    return out.strip() if rc == 0 else ""


IDS_CACHE = Path(tempfile.gettempdir()) / "provisioner-forward-test-ids"


def pin_id(node: Node, pin: Pin) -> str:
    """The pin's ID in the node's image store: its own on the classic store; on Docker's
    containerd image store the digest of the manifest `docker load` makes there."""
    rc, out = on_node(node, "docker info --format '{{range .DriverStatus}}{{index . 1}} {{end}}'")
    assert rc == 0, out
    if "io.containerd.snapshotter" not in out:
        return pin.image_id
    return containerd_id(SavedCache(pin, IDS_CACHE).get(print), pin.layers)


def remove(nodes: list[Node], *pins: Pin) -> None:
    for node in nodes:
        refs = " ".join(f"{p.tag} {pin_id(node, p)}" for p in pins)
        on_node(node, f"docker image rm -f {refs} >/dev/null 2>&1; true")
        assert all(image_on(node, pin_id(node, p)) == "" for p in pins)


def authorized_keys(node: Node) -> bytes:
    rc, out = on_node(node, f"base64 -w0 /home/{node.ssh.user}/.ssh/authorized_keys")
    assert rc == 0, out
    return base64.b64decode(out.strip())


CACHE = Path(tempfile.gettempdir()) / "provisioner-forward-test-cache"  # not the user's cache


def push(inv: Inventory, pin: Pin, *, star: bool = False, chain: bool = False) -> DeliveryReport:
    opts = PushOptions(tag=pin.tag, star=star, chain=chain, cache_dir=CACHE)
    return push_image(inv, None, print, pin=pin, opts=opts)


def test_forward_sends_one_image_from_the_control_machine_and_at_most_one_per_node(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    pin = filler_image(base_pin, f"{REPO}:blob16", 16)
    keys = {n.name: authorized_keys(n) for n in inventory.nodes}
    # the star relay first, for contrast: its head sends the image to each worker
    remove(list(inventory.nodes), pin)
    wire.start(lab)
    star = push(inventory, pin, star=True)
    star_wire = wire.read(lab)
    remove(list(inventory.nodes), pin)
    wire.start(lab)

    report = push(inventory, pin, chain=True)

    counted = wire.read(lab)
    assert report.ok and star.ok, (report.errors, star.errors)
    size = pin.size
    for node in inventory.nodes:  # verified and tagged everywhere; keys as they were
        assert image_on(node, pin.tag) == pin_id(node, pin)
        assert authorized_keys(node) == keys[node.name], node.name
    control = sum(w.from_control for w in counted.values())
    busiest = max(w.to_nodes for w in counted.values())
    star_head = star_wire[inventory.head.name].to_nodes
    print(f"image {size} B; chain: control {control} B, busiest {busiest} B; star {star_head} B")
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


def cache_events(cache: Path) -> list[str]:
    record = cache / "layers" / "record.jsonl"
    if not record.exists():
        return []
    return [json.loads(line)["event"] for line in record.read_text().splitlines()]


def test_a_compressed_push_direct_and_chained_sends_fewer_bytes_and_compresses_once(
    lab: LabInfo, inventory: Inventory, base_pin: Pin, tmp_path: Path
) -> None:
    pin = filler_image(base_pin, f"{REPO}:text32", 32, text=True)
    first = inventory.nodes[0]
    single = replace(inventory, head=replace(first, role="head"), workers=())
    cache = tmp_path / "cache"  # a cache of its own: the first compressed push misses

    def counted_push(
        inv: Inventory, compress: str, chain: bool = False
    ) -> tuple[DeliveryReport, int]:
        remove(list(inv.nodes), pin)
        wire.start(lab)
        opts = PushOptions(tag=pin.tag, chain=chain, cache_dir=cache, compress=compress)  # type: ignore[arg-type]
        report = push_image(inv, None, print, pin=pin, opts=opts)
        got = wire.read(lab)
        assert report.ok, report.errors
        for node in inv.nodes:  # verified by ID and tagged, compressed or not
            assert image_on(node, pin.tag) == pin_id(node, pin), node.name
        return report, got[first.name].from_control

    plain, plain_bytes = counted_push(single, "never")
    assert plain.nodes[first.name].codec == "" and plain_bytes > pin.size

    # the node holds none of the image: `docker save | compressor` into its docker load
    direct, direct_bytes = counted_push(single, "always")
    done = direct.nodes[first.name]
    assert done.codec == "gz"  # Docker 20.10's load reads gzip (not zstd)
    assert (done.cache_misses, done.cache_hits) == (1, 0)  # positive control: compressed now
    assert cache_events(cache) == ["miss"]
    kept = cache / f"{pin.image_id.removeprefix('sha256:')}.tar.gz"
    assert kept.is_file() and not list(cache.glob("*.partial"))
    print(f"plain {plain_bytes} B on the wire, compressed {direct_bytes} B")
    assert direct_bytes < 0.7 * plain_bytes

    # the next cluster's cold push sends the kept stream: nothing saved or compressed
    again, again_bytes = counted_push(single, "always")
    assert (again.nodes[first.name].cache_hits, again.nodes[first.name].cache_misses) == (1, 0)
    assert cache_events(cache) == ["miss", "hit"]
    assert kept.stat().st_size < again_bytes < 0.7 * plain_bytes

    # the chain over the nodes whose docker load reads compressed layers: a node with the
    # containerd image store gets plain layers (its ID is the plain image's manifest)
    readers = [n for n in inventory.nodes if pin_id(n, pin) == pin.image_id]
    assert len(readers) >= 2
    classic = replace(inventory, head=readers[0], workers=tuple(readers[1:]))
    chain, chain_bytes = counted_push(classic, "always", chain=True)
    assert chain.mode == "chain"
    head = chain.nodes[first.name]
    assert head.codec == "gz" and (head.cache_hits, head.cache_misses) == (0, 1)
    chain_again, _ = counted_push(classic, "always", chain=True)
    assert (
        chain_again.nodes[first.name].cache_hits,
        chain_again.nodes[first.name].cache_misses,
    ) == (1, 0)
    assert cache_events(cache) == ["miss", "hit", "miss", "hit"]  # each compressed once
    assert chain_bytes < 0.7 * plain_bytes
    hops = wire.read(lab)  # the chain forwards the compressed stream: fewer bytes per hop
    assert all(hops[n.name].to_nodes < 0.7 * plain_bytes for n in classic.nodes[:2])
    remove(list(inventory.nodes), pin)


def test_a_cold_compressed_push_gives_each_docker_the_codec_its_load_reads(
    lab: LabInfo, inventory: Inventory, base_pin: Pin, tmp_path: Path
) -> None:
    """Every node at once, holding none of the image: Docker 20.10 gets gzip, Docker 26
    zstd (its load reads it from Docker 23), the containerd image store its OCI layout,
    plain; each is verified by its ID. The codec is the node's, not the first node's."""
    pin = filler_image(base_pin, f"{REPO}:text24", 24, text=True)
    remove(list(inventory.nodes), pin)
    cache = tmp_path / "cache"
    opts = PushOptions(tag=pin.tag, cache_dir=cache, compress="always")
    report = push_image(inventory, None, print, pin=pin, opts=opts)
    assert report.ok, report.errors
    got: dict[str, str] = {}
    for node in inventory.nodes:
        assert image_on(node, pin.tag) == pin_id(node, pin), node.name
        _, version = on_node(node, "docker version --format '{{.Server.Version}}'")
        store = "containerd" if pin_id(node, pin) != pin.image_id else "classic"
        major = int(version.strip().split(".")[0])
        want = "" if store == "containerd" else ("zst" if major >= 23 else "gz")
        got[node.name] = report.nodes[node.name].codec
        assert got[node.name] == want, (node.name, version, store, got)
    assert {"gz", "zst"} <= set(got.values())  # both Docker releases were met
    assert {p.name.rsplit(".", 1)[1] for p in cache.glob("*.tar.*")} == {"gz", "zst"}
    remove(list(inventory.nodes), pin)


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
    assert image_on(third, pin_id(third, top)) == pin_id(third, top)
    wire.start(lab)

    report = push(inventory, top, chain=True)

    counted = wire.read(lab)
    assert report.ok, report.errors
    for node in inventory.nodes:
        assert image_on(node, top.tag) == pin_id(node, top)
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
    result: list[DeliveryReport] = []
    worker = threading.Thread(target=lambda: result.append(push(inventory, pin, chain=True)))
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
        assert image_on(node, pin.tag) == pin_id(node, pin), node.name
    again = report.nodes[last.name]
    assert again.via == first.name and again.attempts == 2  # re-fed from the first node
    # the first node sent its stream twice at most: to the middle one and again to the last
    assert counted[first.name].to_nodes < 2.2 * pin.size
    assert sum(w.from_control for w in counted.values()) < 1.2 * pin.size


# --- the relay keys: one per edge and round, accepted by that edge's receiver only

KEY_DIRS = "/tmp /var/tmp /home /root"  # where a node could hold a private key of ours


def stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y%m%d%H%M%S")


# A docker command the node's hop runs (its forced command `sh DIR/hop`), whichever one: the
# hop lists the node's tags before its `docker load`, and both wait on the node's dockerd.
HOP_IN_DOCKER = "hops=$(pgrep -d, -f '^sh /tmp/tmp[.][^ ]*/hop$') && pgrep -x -P \"$hops\" docker"


def dockerd(node: Node, signal: str) -> None:
    """Stop or continue the node's own dockerd, by its pid file (its sshd runs on)."""
    rc, out = on_node(node, f"kill -{signal} $(cat /var/run/docker.pid)")
    assert rc == 0, out


def private_keys(node: Node) -> dict[str, str]:
    """Every OpenSSH private key file on the node outside /etc (path -> public line)."""
    rc, out = on_node(
        node,
        f"grep -rlsF -- '-----BEGIN OPENSSH PRIVATE KEY-----' {KEY_DIRS} | "
        'while read -r f; do printf \'%s %s\\n\' "$f" "$(ssh-keygen -y -f "$f")"; done',
    )
    assert rc in (0, 1), out
    found = {}
    for line in out.splitlines():
        path, _, public = line.partition(" ")
        if public.startswith("ssh-"):
            found[path] = " ".join(public.split()[:2])
    return found


def relay_lines(node: Node) -> list[str]:
    text = authorized_keys(node).decode()
    return [line for line in text.splitlines() if "provisioner-relay-" in line]


def accepting(lines: dict[str, list[str]], public: str) -> list[str]:
    """The nodes whose authorized_keys hold this public key."""
    return sorted(n for n, held in lines.items() if any(f" {public} " in f" {x} " for x in held))


def ssh_from(node: Node, key: str, target: Node) -> tuple[int, str]:
    """A real OpenSSH connection from `node` to `target` with `key`, nothing else tried."""
    return on_node(
        node,
        f"cp {key} /tmp/probe.key && chown lab /tmp/probe.key && chmod 600 /tmp/probe.key && "
        f"su lab -s /bin/sh -c 'ssh -F /dev/null -i /tmp/probe.key -o IdentitiesOnly=yes "
        "-o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        f"-o ConnectTimeout=10 {target.ssh.user}@{target.address} true' </dev/null; "
        "rc=$?; rm -f /tmp/probe.key; exit $rc",
    )


def test_forward_gives_each_edge_its_own_key_that_only_its_receiver_accepts(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    from tests.e2e.faults.record import scenario

    pin = filler_image(base_pin, f"{REPO}:blob64", 64)
    first, middle, last = inventory.nodes
    nodes = list(inventory.nodes)
    remove(nodes, pin)
    keys_before = {n.name: authorized_keys(n) for n in nodes}
    assert all(not private_keys(n) for n in nodes), "a private key left from before"
    result: list[DeliveryReport] = []

    def report(line: str) -> None:
        print(line)
        if line.startswith("chain:"):  # the facts gathered: hold the chain's end
            dockerd(last, "STOP")

    opts = PushOptions(tag=pin.tag, chain=True, cache_dir=CACHE)
    worker = threading.Thread(
        target=lambda: result.append(push_image(inventory, None, report, pin=pin, opts=opts))
    )
    with scenario(
        "a compromised node during a forwarding push",
        "it holds at most one relay key, accepted only by its own receiver, only from its "
        "address, only for the hop's one load, for minutes; every key removed after the round",
        kind="security",
    ) as s:
        worker.start()
        try:
            # the round is under way once the last node's hop waits on its docker (held by
            # its stopped dockerd): the hop reads the node's tags before it loads
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if on_node(last, HOP_IN_DOCKER)[0] == 0:
                    break
                time.sleep(0.2)
            else:
                raise AssertionError("the chain never reached the last node")
            held = {n.name: private_keys(n) for n in nodes}
            lines = {n.name: relay_lines(n) for n in nodes}
            date = {n.name: on_node(n, "date -u +%Y%m%d%H%M%S")[1].strip() for n in nodes}
            # who holds a key, and who accepts it: only the edge's receiver
            receiver = {first.name: middle, middle.name: last}
            for name, found in held.items():
                for path, public in found.items():
                    ok = [receiver[name].name] if name in receiver else []
                    assert accepting(lines, public) == ok, (name, path, lines)
                assert len(found) == (1 if name in receiver else 0), (name, found)
                assert all(path.endswith("/send.key") for path in found), found
            keys = {name: next(iter(found)) for name, found in held.items() if found}
            publics = {public for found in held.values() for public in found.values()}
            s.expect("keys", len(publics), 2)  # a key per edge, no key shared
            s.saw(
                edges=len(receiver),
                held=sorted({len(found) for n, found in held.items() if n in receiver}),
            )
            for name, held_lines in lines.items():
                assert len(held_lines) == (0 if name == first.name else 1), (name, held_lines)
            for sender, to in receiver.items():  # from the sender only, the hop, minutes
                (line,) = lines[to.name]
                address = next(n.address for n in nodes if n.name == sender)
                assert line.startswith(f'from="{address}",restrict,command="sh /tmp/tmp.'), line
                expiry = line.split('expiry-time="', 1)[1][:14]
                left = stamp(expiry) - stamp(date[to.name])  # by the receiver's own clock
                assert 0 < left.total_seconds() < 600, (expiry, date[to.name])
            # real OpenSSH from the nodes: a key reaches nothing but its receiver's hop
            probes = {}
            for sender, to in receiver.items():
                sender_node = next(n for n in nodes if n.name == sender)
                key = keys[sender]
                for target in nodes:
                    if target.name == sender:
                        continue
                    rc, out = ssh_from(sender_node, key, target)
                    probes[(sender, target.name)] = rc
                    if target.name == to.name:  # positive control: accepted, and the
                        # forced command refuses a second load in this round
                        assert rc == 3 and "received its stream already" in out, out
                        s.saw(hop=rc)
                    else:
                        assert rc == 255 and "Permission denied" in out, (sender, target, out)
                        s.saw(others=rc)
                # the same key from a node that is not its sender: refused (from=)
                other = next(n for n in nodes if n.name not in (sender, to.name))
                rc, out = on_node(sender_node, f"base64 -w0 {key}")
                assert rc == 0, out
                copy = "/tmp/stolen.key"
                rc, out = on_node(other, f"echo {out.strip()} | base64 -d > {copy}")
                assert rc == 0, out
                rc, out = ssh_from(other, copy, to)
                on_node(other, f"rm -f {copy}")
                assert rc == 255 and "Permission denied" in out, (other.name, to.name, out)
                probes[(f"{other.name} with {sender}'s key", to.name)] = rc
                s.saw(stolen=rc)
        finally:
            dockerd(last, "CONT")
            worker.join(600)
        assert result, "the push did not return"
        push_report = result[0]
        s.expect("push_ok", push_report.ok, True, str(push_report.errors))
        for node in nodes:  # loaded and verified everywhere; no key left anywhere
            assert image_on(node, pin.tag) == pin_id(node, pin), node.name
            assert authorized_keys(node) == keys_before[node.name], node.name
            assert not private_keys(node), node.name
        s.saw(nodes=len(nodes), left=sum(len(private_keys(n)) for n in nodes))
        s.observed = (
            "mid-round, with the chain held at its last node: each sender held {held} "
            "private key ({edges} edges, {keys} keys), each key in exactly one "
            "authorized_keys, its receiver's, from the sender's address, forced to the hop, "
            "expiring in minutes; real ssh with it: its receiver accepted it and the hop "
            "refused a second load (exit {hop}), every other node refused it (exit {others}), "
            "and so did its receiver from another node's address (exit {stolen}); after the "
            "push (ok: {push_ok}): loaded and verified on {nodes} nodes, {left} private keys "
            "on any node, authorized_keys byte for byte as before"
        )
        s.measure(probes=len(probes))
        s.measured = "{probes} ssh probes"


HOP_RUNNING = "pgrep -f '^sh .*/hop$' >/dev/null"  # a chain round's hop runs on the node


def test_ctrl_c_mid_round_removes_every_relay_key(
    lab: LabInfo, inventory: Inventory, base_pin: Pin
) -> None:
    """SIGINT to this process while a round streams (held at the chain's last node, as in
    the test above): the push stops with KeyboardInterrupt, and before it does every edge
    key is gone from every node: authorized_keys byte for byte as before, no private key."""
    import os
    import signal

    pin = filler_image(base_pin, f"{REPO}:blob64", 64)
    last = inventory.nodes[-1]
    nodes = list(inventory.nodes)
    remove(nodes, pin)
    keys_before = {n.name: authorized_keys(n) for n in nodes}
    seen: dict[str, int] = {}

    def report(line: str) -> None:
        print(line)
        if line.startswith("chain:"):
            dockerd(last, "STOP")

    def interrupt_mid_round() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if on_node(last, "pgrep -f '^docker load$'")[0] == 0:
                break
            time.sleep(0.2)
        # positive control: the round's keys are there while it streams
        seen["keys"] = sum(len(private_keys(n)) for n in nodes)
        seen["lines"] = sum(len(relay_lines(n)) for n in nodes)
        seen["hops"] = sum(on_node(n, HOP_RUNNING)[0] == 0 for n in nodes)
        os.kill(os.getpid(), signal.SIGINT)

    opts = PushOptions(tag=pin.tag, chain=True, cache_dir=CACHE)
    # a run started in the background (`cmd &`, nohup) inherits SIGINT ignored: restore
    # Python's handler, so that the signal below is a KeyboardInterrupt here too
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    helper = threading.Thread(target=interrupt_mid_round, daemon=True)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            push_image(inventory, None, report, pin=pin, opts=opts)
    finally:
        dockerd(last, "CONT")
        helper.join(130)
        signal.signal(signal.SIGINT, previous)
    assert seen == {"keys": 2, "lines": 2, "hops": 3}, seen
    # no hop left running: the push's end ended each with its process group (before, the
    # upstream hops of a round cut off this way read on for the rest of the suite)
    hops = [n.name for n in nodes if on_node(n, HOP_RUNNING)[0] == 0]
    deadline = time.monotonic() + 15
    while hops and time.monotonic() < deadline:
        time.sleep(0.5)
        hops = [n.name for n in nodes if on_node(n, HOP_RUNNING)[0] == 0]
    assert hops == [], {
        n: on_node(x, "ps -eo pid,pgid,etime,args")[1] for n in hops for x in nodes if x.name == n
    }
    for node in nodes:
        assert authorized_keys(node) == keys_before[node.name], node.name
        assert not private_keys(node), node.name
        assert image_on(node, pin.tag) == "", node.name  # nothing tagged by a broken push
    remove(nodes, pin)


def test_a_hop_keeps_no_tag_its_sender_put_in_the_stream(
    inventory: Inventory, base_pin: Pin
) -> None:
    """A sender's stream goes straight into its receiver's `docker load`, which applies any
    tag the stream's manifest names. The hop script (as the relay writes it) removes each
    such tag and tags the node's own image of that name again; the round fails there.
    Positive controls: the same stream into a plain `docker load` retags the node's image;
    a pin's stream (saved by ID, no tag) goes through the hop and changes no tag."""
    from tests.e2e.faults.record import scenario

    node = inventory.nodes[0]
    own = filler_image(base_pin, f"{REPO}:own", 1)
    evil = filler_image(base_pin, f"{REPO}:evil", 1)
    victim = f"{REPO}:victim"
    work = "/tmp/provisioner-hop-test"

    def feed(ref: str, command: str) -> int:
        save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
        done = subprocess.run(
            ["docker", "exec", "-i", node.name, "sh", "-c", command],
            stdin=save.stdout,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert save.wait(60) == 0
        return done.returncode

    def hop(ref: str) -> tuple[int, list[str]]:
        rc, out = on_node(node, f"rm -rf {work} && mkdir -p {work}")
        assert rc == 0, out
        on_node(node, f"cat > {work}/hop <<'EOF'\n{hop_script(work, None, ())}EOF")
        code = feed(ref, f"sh {work}/hop")
        rc, out = on_node(node, round_result_command(work))
        return code, parse_round_result(out)[1]

    with scenario(
        "a forwarding relay's sender puts an image tag of its own in its stream",
        "the receiving hop removes the tag and reports it (exit 4, read by the control "
        "machine), the node's own image of that name keeps it; a pin's stream (by ID) "
        "changes no tag",
        kind="security",
    ) as s:
        subprocess.run(["docker", "tag", evil.image_id, victim], check=True)  # the stream's
        try:
            assert feed(own.tag, "docker load") == 0  # the node's own image of that name
            on_node(node, f"docker tag {own.tag} {victim}")
            own_id = image_on(node, victim)
            assert own_id, "the node's own image is not there"
            # positive control: a plain `docker load` takes the sender's tag
            assert feed(victim, "docker load") == 0
            assert image_on(node, victim) not in ("", own_id)
            s.saw(control="moved")
            on_node(node, f"docker tag {own_id} {victim}")
            assert image_on(node, victim) == own_id

            code, foreign = hop(victim)
            assert code == FOREIGN_RC and foreign == [victim], (code, foreign)
            s.saw(hop=code, reported=len(foreign))
            s.expect("kept", image_on(node, victim) == own_id, True, "the sender's tag stayed")
            # a pin's stream: saved by ID, it names no tag, and goes through
            code, foreign = hop(evil.image_id)
            assert code == 0 and foreign == [], (code, foreign)
            s.saw(by_id=code, by_id_reported=len(foreign))
            s.expect("unchanged", image_on(node, victim) == own_id, True)
        finally:
            subprocess.run(["docker", "image", "rm", victim], capture_output=True, check=False)
            on_node(node, f"rm -rf {work}")
        s.observed = (
            "positive control: the sender's stream naming the node's tag, into a plain "
            "`docker load`, {control} that tag to the sender's image; through the hop: exit "
            "{hop}, {reported} tag reported, the node's tag on its own image again: {kept}; "
            "a stream saved by ID went through the hop (exit {by_id}, {by_id_reported} tags "
            "reported), the tag still on the node's own image: {unchanged}"
        )


def test_a_star_worker_keeps_no_tag_its_head_put_in_the_stream(
    inventory: Inventory, base_pin: Pin
) -> None:
    """The star's relay key runs the same guard on a worker (its forced command, as sshd
    runs it): a head that puts a tag in its stream gets it removed, the worker's own image
    of that name tagged again, exit FOREIGN_RC. Positive controls: that stream into a plain
    `docker load` moves the tag; a pin's stream (saved by ID) loads, exit 0, no tag moved."""
    node = inventory.nodes[-1]
    own = filler_image(base_pin, f"{REPO}:star-own", 1)
    evil = filler_image(base_pin, f"{REPO}:star-evil", 1)
    victim = f"{REPO}:star-victim"

    def feed(ref: str, command: str) -> subprocess.CompletedProcess[bytes]:
        save = subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE)
        done = subprocess.run(
            ["docker", "exec", "-i", node.name, "sh", "-c", command],
            stdin=save.stdout,
            capture_output=True,
            timeout=300,
            check=False,
        )
        assert save.wait(60) == 0
        return done

    subprocess.run(["docker", "tag", evil.image_id, victim], check=True)  # the head's stream
    try:
        assert feed(own.tag, "docker load").returncode == 0  # the worker's own image
        on_node(node, f"docker tag {own.tag} {victim}")
        own_id = image_on(node, victim)
        assert own_id, "the worker's own image is not there"
        assert feed(victim, "docker load").returncode == 0  # positive control
        assert image_on(node, victim) not in ("", own_id)
        on_node(node, f"docker tag {own_id} {victim}")

        done = feed(victim, RELAY_COMMAND)
        assert done.returncode == FOREIGN_RC, done
        assert image_on(node, victim) == own_id, "the head's tag stayed"
        done = feed(evil.image_id, RELAY_COMMAND)  # a pin's stream: by ID, no tag
        assert done.returncode == 0, done
        assert b"Loaded image ID: " in done.stdout  # what the head reads
        assert image_on(node, victim) == own_id
    finally:
        subprocess.run(["docker", "image", "rm", victim], capture_output=True, check=False)
