"""End to end: the pinned image pushed over SSH to the lab's real sshd and dockerd.

The tests run in file order and share the lab: a node first holds an older image that
shares the base layers, then one push reaches all three nodes (a full image to two, only
the missing layers to the third), then re-push, re-tag, an interrupted push and the star
relay (of a small test image). Every test leaves each node holding the pin under the
cluster tag, as the cluster tests expect.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import subprocess
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.image.base_image import ensure_base_image
from provisioner.image.build import BuildOptions, build_image
from provisioner.image.pin import CLUSTER_TAG, Pin, read_pin
from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.lab.engine import client, exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.delivery import DeliveryReport
from provisioner.remote import Session
from provisioner.runtime.docker.push import PushOptions, push_image
from tests.e2e.faults.lab import image_store
from tests.labtools.filler import filler_image

IMAGES = Path(__file__).resolve().parents[2] / "images"
OLDER_TAG = "provisioner/ray:torch-stage"
RELAY_REPO = "provisioner/relay-test"


def build_opts(tmp: Path) -> BuildOptions:
    return BuildOptions(
        images_dir=IMAGES,
        wheelhouse=IMAGES / ".wheelhouse",
        lock_path=tmp / "image.lock.json",
        base=ensure_base_image(print),
    )


@pytest.fixture(scope="module")
def pin(tmp_path_factory: pytest.TempPathFactory) -> Pin:
    """The image built from images/ (from the build cache when it was built before)."""
    result = build_image(build_opts(tmp_path_factory.mktemp("pin")), print)
    assert result.pin is not None and result.lock_path is not None
    assert read_pin(result.lock_path) == result.pin
    return result.pin


@pytest.fixture(scope="module")
def older(pin: Pin, tmp_path_factory: pytest.TempPathFactory) -> Pin:
    """An older image: the same Dockerfile stopped after the torch layer (base layers shared)."""
    opts = replace(build_opts(tmp_path_factory.mktemp("older")), target="torch", tag=OLDER_TAG)
    image_id = build_image(opts, print).image_id
    attrs = client().api.inspect_image(image_id)
    layers = tuple(attrs["RootFS"]["Layers"])
    assert layers == pin.layers[: len(layers)] and len(layers) < len(pin.layers)
    sizes = pin.layer_sizes[: len(layers)] if pin.layer_sizes else None
    return replace(pin, image_id=image_id, layers=layers, layer_sizes=sizes, size=attrs["Size"])


@pytest.fixture(scope="module")
def inventory(lab: LabInfo) -> Inventory:
    return load_inventory(lab.inventory)


def only(inv: Inventory, node: Node) -> Inventory:
    return replace(inv, head=replace(node, role="head"), workers=())


def on_node(node: Node, script: str) -> tuple[int, str]:
    return exec_rc(node.name, script, timeout=120)


# The pin's ID on each node, as its image store names it (the push reports it): the pin's own
# on the classic store, the digest of the manifest `docker load` made on the containerd store.
PIN_IDS: dict[str, str] = {}


def pin_id(node: Node, pin: Pin) -> str:
    return PIN_IDS.get(node.name, pin.image_id)


def image_on(node: Node, ref: str) -> str:
    rc, out = on_node(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    return out.strip() if rc == 0 else ""


def wipe(node: Node) -> None:
    """Remove every container and image from the node's Docker (the lab's, made by tests)."""
    rc, out = on_node(
        node,
        "docker ps -aq | xargs -r docker rm -f >/dev/null; "
        "for _ in 1 2 3; do "  # children first: a parent cannot go while a child holds it
        "docker image ls -aq | sort -u | xargs -r docker image rm -f >/dev/null 2>&1; done; "
        "docker image ls -aq | wc -l",
    )
    assert rc == 0 and out.strip() == "0", out


def assert_ok(report: DeliveryReport) -> None:
    assert report.ok, {h: str(e) for h, e in report.errors.items()}


def test_push_reaches_every_node_sending_only_missing_layers(
    inventory: Inventory, pin: Pin, older: Pin
) -> None:
    for node in inventory.nodes:
        wipe(node)
    third = inventory.workers[-1]
    first = push_image(
        only(inventory, third), None, print, pin=older, opts=PushOptions(tag=OLDER_TAG)
    )
    assert_ok(first)
    older_id = first.nodes[third.name].image_id
    assert image_on(third, OLDER_TAG) == older_id

    # plain, so the bytes compare with the image's (compressed pushes: test_image_forward);
    # a head start whatever this machine's load makes of the link probes (its budget by
    # the link: tests/unit/test_runtime_docker_head_start.py; its gain: `make bench`, push-fast)
    opts = PushOptions(compress="never", head_start="always")
    report = push_image(inventory, None, print, pin=pin, opts=opts)

    assert_ok(report)
    stores = {node.name: image_store(node.name) for node in inventory.nodes}
    for node in inventory.nodes:
        pushed = report.nodes[node.name]
        PIN_IDS[node.name] = pushed.image_id
        assert pushed.store == stores[node.name]
        # the classic store names the pin by its own ID, the containerd store by another
        assert (pushed.image_id == pin.image_id) == (pushed.store == "classic"), pushed
        assert image_on(node, CLUSTER_TAG) == pushed.image_id
        assert image_on(node, pushed.image_id) == pushed.image_id
    if len(inventory.nodes) > 1:  # the mixed lab: both stores met
        assert set(stores.values()) == {"classic", "containerd"}, stores
    full = report.nodes[inventory.head.name]
    partial = report.nodes[third.name]
    assert full.layers_sent == len(pin.layers) and full.bytes_sent > 0.9 * pin.size
    assert partial.layers_sent == len(pin.layers) - len(older.layers)
    assert partial.bytes_sent < 0.7 * full.bytes_sent  # well under the full image
    assert partial.bytes_omitted > 0.9 * older.size - 1e8
    # a node that held nothing, on the classic store, got a head start (the torch stage
    # this machine's Docker holds, loaded ahead while `docker save` prepared the pin): it
    # is removed again once the pin was verified, so each holds the pin only
    cold = [n for n in inventory.nodes if n is not third and stores[n.name] == "classic"]
    assert cold, stores
    for node in cold:
        sent = report.nodes[node.name]
        assert sent.head_start_bytes > 0.05 * pin.size, sent
        rc, out = on_node(node, "docker image ls -aq --no-trunc | sort -u")
        assert rc == 0 and out.split() == [pin.image_id], out
    print(f"full {full.bytes_sent} bytes, partial {partial.bytes_sent} bytes")
    for name, n in report.nodes.items():
        print(
            f"{name}: {n.store} store, ID {n.image_id}, {n.bytes_sent} bytes sent, "
            f"{n.bytes_omitted} held, {n.layers_sent}/{n.layers_total} layers"
        )


def test_a_second_push_sends_no_image_bytes(inventory: Inventory, pin: Pin) -> None:
    report = push_image(inventory, None, print, pin=pin, opts=PushOptions())
    assert_ok(report)
    assert report.control_bytes == 0
    assert {n.action for n in report.nodes.values()} == {"none"}
    assert report.seconds < 30


def test_a_different_image_under_the_cluster_tag_is_corrected(
    inventory: Inventory, pin: Pin
) -> None:
    node = inventory.workers[0]
    rc, out = on_node(
        node,
        f"printf 'FROM {pin.image_id}\\nLABEL wrong=yes\\n' | docker build -q -t {CLUSTER_TAG} -",
    )
    assert rc == 0, out
    assert image_on(node, CLUSTER_TAG) not in ("", pin_id(node, pin))

    report = push_image(inventory, None, print, pin=pin, opts=PushOptions())

    assert_ok(report)
    assert report.nodes[node.name].action == "tag"
    assert report.control_bytes == 0
    assert image_on(node, CLUSTER_TAG) == pin_id(node, pin)


def push_killed_once(
    inventory: Inventory, pin: Pin, node: Node, retries: int, tag: str = CLUSTER_TAG
) -> DeliveryReport:
    """Push in the background; once bytes flow to `node`, kill its `docker load` (the one
    this push started, by its PID) as a dropped transfer would end it."""
    lines: list[str] = []
    result: list[DeliveryReport] = []
    worker = threading.Thread(
        target=lambda: result.append(
            push_image(
                inventory, None, lines.append, pin=pin, opts=PushOptions(retries=retries, tag=tag)
            )
        )
    )
    worker.start()
    # once the node's `docker load` reads the stream (however fast the push goes)
    kill = "pids=$(pgrep -f '^docker load$'); [ -n \"$pids\" ] && kill $pids"
    deadline = time.monotonic() + 180
    rc, out = on_node(node, kill)
    while rc != 0 and time.monotonic() < deadline and worker.is_alive():
        time.sleep(0.1)
        rc, out = on_node(node, kill)
    assert rc == 0, (out, lines[-5:])
    worker.join(600)
    assert result, lines[-5:]
    return result[0]


INTERRUPTED_TAG = f"{RELAY_REPO}:interrupted250"


def test_an_interrupted_push_leaves_no_tagged_partial_image_and_a_rerun_completes(
    inventory: Inventory, pin: Pin
) -> None:
    """A push whose `docker load` dies mid-stream tags nothing; again with retries, the
    node whose load died starts over and the others load once. Of a 250 MB image of
    random bytes that no node holds: the claim is the push's, whatever the image's size,
    and the nodes keep the pin under the cluster tag throughout."""
    node = inventory.workers[0]
    big = filler_image(pin, INTERRUPTED_TAG, 250)
    drop = f"docker image ls -q '{RELAY_REPO}' | sort -u | xargs -r docker image rm -f"
    for n in inventory.nodes:
        on_node(n, drop)
    held = {n.name: image_on(n, CLUSTER_TAG) for n in inventory.nodes}
    assert all(held.values()), held  # the pin under the cluster tag, before
    try:
        interrupted = push_killed_once(only(inventory, node), big, node, 0, INTERRUPTED_TAG)

        assert node.name in interrupted.errors
        assert image_on(node, INTERRUPTED_TAG) == ""
        if image_store(node.name) == "classic":  # the containerd store names it otherwise
            assert image_on(node, big.image_id) == ""

        # again, all nodes, with retries: the broken node starts over, the others load once
        rerun = push_killed_once(inventory, big, node, 2, INTERRUPTED_TAG)

        assert_ok(rerun)
        assert rerun.nodes[node.name].action == "send"
        assert rerun.nodes[node.name].attempts == 2
        assert all(rerun.nodes[n.name].attempts == 1 for n in inventory.nodes if n != node)
        for n in inventory.nodes:
            assert image_on(n, INTERRUPTED_TAG) == rerun.nodes[n.name].image_id
            assert image_on(n, CLUSTER_TAG) == held[n.name]  # the pin stayed
    finally:
        for n in inventory.nodes:
            on_node(n, drop)
        subprocess.run(["docker", "image", "rm", "-f", INTERRUPTED_TAG], capture_output=True)


def authorized_keys(node: Node) -> bytes:
    import base64

    rc, out = on_node(node, f"base64 -w0 /home/{node.ssh.user}/.ssh/authorized_keys")
    assert rc == 0, out
    return base64.b64decode(out.strip())


def test_relay_sends_about_one_image_from_the_control_machine(
    inventory: Inventory, pin: Pin
) -> None:
    """The star relay (`image push --star`) of a 48 MB test image that no node holds: the
    control machine sends it once, to the head, which sends it on to each worker. The
    claim does not depend on the size (the pin's relay is measured by `make bench`'s scale
    rows), and the nodes keep the pin."""
    small = filler_image(pin, f"{RELAY_REPO}:relay48", 48)
    # One worker's authorized_keys lacks its final newline (as an editor may leave it): the
    # relay key must not glue onto the user's key, and its removal must not take it along.
    glued = inventory.workers[0]
    keys = f"/home/{glued.ssh.user}/.ssh/authorized_keys"
    on_node(glued, f'[ -z "$(tail -c 1 {keys})" ] && truncate -s -1 {keys}')
    before = {w.name: authorized_keys(w) for w in inventory.workers}
    assert not before[glued.name].endswith(b"\n")
    drop = f"docker image ls -q '{RELAY_REPO}' | sort -u | xargs -r docker image rm -f"
    try:
        for node in inventory.nodes:
            on_node(node, drop)
            assert image_on(node, small.tag) == image_on(node, small.image_id) == ""

        report = push_image(
            inventory, None, print, pin=small, opts=PushOptions(star=True, tag=small.tag)
        )

        assert_ok(report)
        for node in inventory.nodes:
            assert image_on(node, small.tag) == report.nodes[node.name].image_id
            assert image_on(node, CLUSTER_TAG) == pin_id(node, pin)  # the pin left as it was
        assert report.nodes[inventory.head.name].via == "control"
        assert all(report.nodes[w.name].via == inventory.head.name for w in inventory.workers)
        assert small.size * 0.9 < report.control_bytes < small.size * 1.1
        for node in inventory.workers:  # the temporary key is gone, the file as it was
            assert authorized_keys(node) == before[node.name], node.name
            session = Session.connect(node)  # the user's own key still logs in
            try:
                assert session.run("echo in", timeout=30).stdout.strip() == "in"
            finally:
                session.close()
    finally:
        on_node(glued, f'[ -n "$(tail -c 1 {keys})" ] && echo >> {keys}')
        for node in inventory.nodes:
            on_node(node, drop)


def cache_content(path: Path) -> bytes:
    """A compressed cache file's bytes, decompressed (gzip or zstd)."""
    if path.suffix == ".zst":
        return subprocess.run(["zstd", "-d", "-c", str(path)], capture_output=True).stdout
    return gzip.decompress(path.read_bytes())


def layer_digests(path: Path) -> set[str]:
    """The sha256 of each layer file (over 1 MB) in a saved image."""
    from provisioner.image.savestream import read_saved

    found = set()
    with path.open("rb") as f:
        for m in read_saved(path).members:
            if m.size > 1 << 20:
                f.seek(m.offset_data)
                found.add("sha256:" + hashlib.sha256(f.read(m.size)).hexdigest())
    return found


CACHE_DROP = f"docker image ls -q '{RELAY_REPO}' | sort -u | xargs -r docker image rm -f"


def cache_images(inventory: Inventory, pin: Pin) -> tuple[Node, Inventory, Pin, Pin]:
    """A node with the classic image store (it reads compressed layers), alone in an
    inventory, and two small images: `top` is `bottom` and a layer of its own."""
    node = next(n for n in inventory.nodes if image_store(n.name) == "classic")
    bottom = filler_image(pin, f"{RELAY_REPO}:cache-bottom", 2)
    top = filler_image(pin, f"{RELAY_REPO}:cache-top", 2, parent=bottom.tag)
    on_node(node, CACHE_DROP)
    return node, only(inventory, node), bottom, top


@pytest.mark.parametrize("forward", [False, True], ids=["direct", "chain"])
def test_a_corrupt_cached_layer_and_saved_image_are_dropped_and_the_push_lands_the_image(
    inventory: Inventory, pin: Pin, tmp_path: Path, forward: bool
) -> None:
    """The compressed layer and the saved image a partial push reads went bad after they
    were written (a disk error, a copy cut short). The load that rejects them has them
    dropped, and the push's retry makes them anew: the node ends holding the image and the
    entries are right again. The positive control: the corruption is checked before, and
    the push's first attempt failed on it. Direct, and along a chain (`--chain`, two nodes
    of the classic store: the first fed from here, the retry its second round)."""
    from provisioner.image.savestream import read_saved

    node, one, bottom, top = cache_images(inventory, pin)
    if forward:
        second = next(
            n for n in inventory.nodes if n.name != node.name and image_store(n.name) == "classic"
        )
        on_node(second, CACHE_DROP)
        one = replace(one, workers=(replace(second, role="worker"),))
    nodes = one.nodes
    cache = tmp_path / "cache"
    opts = PushOptions(tag=top.tag, cache_dir=cache, compress="always", chain=forward)
    try:
        assert_ok(push_image(one, None, print, pin=bottom, opts=replace(opts, tag=bottom.tag)))
        assert_ok(push_image(one, None, print, pin=top, opts=opts))  # the entries are made
        top_hex = top.layers[-1].removeprefix("sha256:")  # its own layer (the chain has both)
        (entry,) = [
            p
            for p in (cache / "layers").iterdir()
            if p.suffix in (".gz", ".zst") and p.name.startswith(top_hex)
        ]
        saved = cache / f"{top.image_id.removeprefix('sha256:')}.tar"
        entry.write_bytes(entry.read_bytes()[: entry.stat().st_size // 2])
        layer = next(m for m in read_saved(saved).members if m.size > 1 << 20)
        with saved.open("r+b") as f:  # one byte of a layer, flipped
            f.seek(layer.offset_data + 4096)
            f.write(bytes([f.read(1)[0] ^ 0xFF]))
        assert layer_digests(saved) != set(top.layers)  # the corruption is real
        for each in nodes:
            on_node(each, f"docker image rm -f {top.tag}")
            assert image_on(each, top.image_id) == "" and image_on(each, bottom.image_id)

        lines: list[str] = []
        partial = push_image(one, None, lines.append, pin=top, opts=opts)

        assert_ok(partial)
        for each in nodes:
            assert partial.nodes[each.name].attempts == 2, lines
            assert image_on(each, top.tag) == top.image_id
        assert any("dropped from the cache" in line for line in lines), lines
        assert "sha256:" + hashlib.sha256(cache_content(entry)).hexdigest() == top.layers[-1]
        assert layer_digests(saved) == set(top.layers)
    finally:
        for each in nodes:
            on_node(each, CACHE_DROP)


def test_a_corrupt_kept_stream_is_dropped_and_the_cold_push_lands_the_image(
    inventory: Inventory, pin: Pin, tmp_path: Path
) -> None:
    """A cold compressed push keeps its stream for the next cold push; one cut short
    later is dropped once the node's load rejected it, and the retry saves, sends and
    keeps it anew (the positive control: the first attempt failed on it)."""
    node, one, _, top = cache_images(inventory, pin)
    cache = tmp_path / "cache"
    opts = PushOptions(tag=top.tag, cache_dir=cache, compress="always")
    try:
        assert_ok(push_image(one, None, print, pin=top, opts=opts))  # the stream is kept
        (kept,) = [p for p in cache.glob("*.tar.*") if not p.name.endswith(".partial")]
        kept.write_bytes(kept.read_bytes()[: kept.stat().st_size // 2])
        on_node(node, CACHE_DROP)
        assert image_on(node, top.image_id) == ""

        lines: list[str] = []
        cold = push_image(one, None, lines.append, pin=top, opts=opts)

        assert_ok(cold)
        assert cold.nodes[node.name].attempts == 2, lines
        assert image_on(node, top.tag) == top.image_id
        whole = cache_content(kept)  # kept anew, whole
        with tarfile.open(fileobj=io.BytesIO(whole), mode="r:") as tar:
            assert "manifest.json" in tar.getnames()
    finally:
        on_node(node, CACHE_DROP)
