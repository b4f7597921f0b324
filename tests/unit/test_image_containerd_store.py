"""Docker's containerd image store: the ID it gives a loaded image (its manifest's digest)
and the OCI layout a node with that store gets, whole or without the layers it holds."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from provisioner.image.pin import Pin, Versions
from provisioner.image.savestream import (
    SavedImage,
    containerd_id,
    containerd_manifest,
    oci_layout,
    read_saved,
)
from provisioner.runtime.docker.push_plan import decide, facts_script, parse_facts
from tests.unit.test_image_savestream import (
    CONFIG,
    DIFF_IDS,
    DIRS,
    LAYERS,
    legacy_save,
    members,
    oci_save,
)

# Seen on a trixie+containerd lab node (Docker 26.1.5): `docker load` of a Docker 20.10
# `docker save` of a one-layer image with a 1,247-byte config and a 16,778,752-byte layer
# tar, then `docker image inspect --format {{.Id}}`.
SEEN_CONFIG = "sha256:b64a1a98a48627f3a3dbf9c6fc6f1465d0e4fc77179113a011a0788de52983bd"
SEEN_LAYER = "sha256:8ed424a20d2f31c11e0daca3f1f4c28c1e2623474880b8a505496c12706225f9"
SEEN_ID = "sha256:cbdc4a252d240adc4dddc0d1dee67e7a72fc57b8971830ba7ef875099f8ca543"


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def test_the_id_is_the_one_docker_26_gave_a_loaded_image() -> None:
    hexd = SEEN_CONFIG.removeprefix("sha256:")
    saved = SavedImage(
        Path("unused.tar"),
        SEEN_CONFIG,
        ("aa41/layer.tar",),
        (_member(f"{hexd}.json", 1247), _member("aa41/layer.tar", 16778752)),
    )
    assert len(containerd_manifest(saved, (SEEN_LAYER,))) == 424
    assert containerd_id(saved, (SEEN_LAYER,)) == SEEN_ID


@pytest.mark.parametrize("layout", ["legacy", "oci"])
def test_both_save_layouts_give_the_same_id(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "image.tar"
    saved = read_saved(legacy_save(path, DIRS) if layout == "legacy" else oci_save(path))
    manifest = json.loads(containerd_manifest(saved, tuple(DIFF_IDS)))
    assert manifest["config"] == {
        "mediaType": "application/vnd.docker.container.image.v1+json",
        "digest": f"sha256:{CONFIG}",
        "size": 2,
    }
    assert [(x["digest"], x["size"]) for x in manifest["layers"]] == [
        (d, len(data)) for d, data in zip(DIFF_IDS, LAYERS, strict=True)
    ]
    other = tmp_path / "other.tar"
    again = read_saved(oci_save(other) if layout == "legacy" else legacy_save(other, DIRS))
    assert containerd_id(saved, tuple(DIFF_IDS)) == containerd_id(again, tuple(DIFF_IDS))


@pytest.mark.parametrize("omit", [0, 1, 3])
def test_the_oci_layout_names_the_manifest_and_leaves_out_held_layers(
    tmp_path: Path, omit: int
) -> None:
    saved = read_saved(legacy_save(tmp_path / "image.tar", DIRS))
    left_out: list[int] = []
    got = members(b"".join(oci_layout(saved, tuple(DIFF_IDS), omit, left_out.append)))
    index = json.loads(got["index.json"])
    (entry,) = index["manifests"]
    manifest = got[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"]
    assert entry["digest"] == containerd_id(saved, tuple(DIFF_IDS))
    assert hashlib.sha256(manifest).hexdigest() == entry["digest"].removeprefix("sha256:")
    assert manifest == containerd_manifest(saved, tuple(DIFF_IDS))
    assert got[f"blobs/sha256/{CONFIG}"] == b"{}"
    for i, (diff, data) in enumerate(zip(DIFF_IDS, LAYERS, strict=True)):
        name = f"blobs/sha256/{diff.removeprefix('sha256:')}"
        assert (got.get(name) == data) if i >= omit else (name not in got)
    assert left_out == [len(d) for d in LAYERS[:omit]]
    assert json.loads(got["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}


def test_a_repeated_layer_is_one_blob(tmp_path: Path) -> None:
    saved = read_saved(legacy_save(tmp_path / "image.tar", DIRS, link_last_to_first=True))
    diffs = (DIFF_IDS[0], DIFF_IDS[1], DIFF_IDS[0])
    got = members(b"".join(oci_layout(saved, diffs)))
    blobs = [n for n in got if n.startswith("blobs/sha256/")]
    assert len(blobs) == 4  # manifest, config, two distinct layers
    layers = json.loads(containerd_manifest(saved, diffs))["layers"]
    assert layers[0] == layers[2]


PIN = Pin(
    image_id="sha256:" + "1" * 64,
    layers=tuple(DIFF_IDS),
    base_image="base",
    base_image_id="sha256:" + "3" * 64,
    requirements_sha256="4" * 64,
    versions=Versions(python="3.11", ray="2.60.0", torch="2.13.0", gymnasium="1.0"),
    size=1 << 20,
)


def test_the_facts_say_which_store_and_decide_uses_the_nodes_id() -> None:
    assert "io.containerd.snapshotter" in facts_script()
    node_id = "sha256:" + "2" * 64
    out = (
        "docker=ok\nroot=/var/lib/docker\nfree=99999999999\nengine=26.1.5 overlayfs\n"
        f"store=containerd\ntagged={node_id}\nimage {node_id} {' '.join(DIFF_IDS)}\n"
    )
    facts = parse_facts(out)
    assert facts.store == "containerd"
    plan = decide(PIN, facts, "n", node_id=node_id)
    assert (plan.action, plan.image_id, plan.store) == ("none", node_id, "containerd")
    # the node's image is not the pin by the pin's own ID there: only its layers are held
    plan = decide(PIN, facts, "n")
    assert (plan.action, plan.first_missing) == ("send", len(DIFF_IDS))
    classic = parse_facts(out.replace("store=containerd", "store=classic"))
    assert classic.store == "classic" and parse_facts("docker=ok\n").store == "classic"


def test_store_ids_add_the_containerd_id_only_when_the_pin_is_saved_here(tmp_path: Path) -> None:
    from dataclasses import replace

    from provisioner.runtime.docker.direct import store_ids

    pin = replace(PIN, image_id=f"sha256:{CONFIG}")
    assert store_ids(pin, tmp_path) == {pin.image_id}  # nothing saved: nothing is saved now
    assert not list(tmp_path.iterdir())
    saved = read_saved(legacy_save(tmp_path / f"{CONFIG}.tar", DIRS))
    assert store_ids(pin, tmp_path) == {pin.image_id, containerd_id(saved, tuple(DIFF_IDS))}
    other = replace(PIN, image_id="sha256:" + "9" * 64)  # a file of another image: not it
    (tmp_path / f"{'9' * 64}.tar").write_bytes((tmp_path / f"{CONFIG}.tar").read_bytes())
    assert store_ids(other, tmp_path) == {other.image_id}


def test_the_doctor_sees_the_pin_under_either_stores_id() -> None:
    from dataclasses import replace

    from provisioner.checks.facts import NodeFacts
    from provisioner.doctor.run import DoctorReport
    from provisioner.runtime.docker.doctor import DockerFacts

    own, alt = "sha256:" + "1" * 64, "sha256:" + "2" * 64

    def holding(image: str) -> NodeFacts:
        return replace(NodeFacts(host="n"), runtime=DockerFacts(image=f"{image} linux/amd64"))

    facts = {"classic": holding(own), "containerd": holding(alt), "neither": holding("")}
    report = DoctorReport([], list(facts), facts=facts, pin_id=own, pin_alt=alt)
    assert report.holding(own) == {"classic": own, "containerd": alt}  # by the store's ID
    assert replace(report, pin_alt="").holding(own) == {"classic": own}
    assert report.holding(alt) == {}  # only the pin it asked about


def test_a_node_not_pushed_now_runs_the_pin_under_its_stores_id(tmp_path: Path) -> None:
    import os
    import subprocess

    from provisioner.runtime.docker.runtime import with_image_fallback

    own, alt = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    command = f"mkdir -p {tmp_path}/x && docker run -d --name ray {own} ray start"
    assert with_image_fallback(command, own, []) == command
    picked = with_image_fallback(command, own, [alt])
    assert picked.endswith('docker run -d --name ray "$img" ray start')
    # the start's run and its retry (a container of this cluster's in the way) run alike
    from provisioner.runtime.docker.runtime import docker_run_command
    from tests.unit.inventories import make_inventory

    inv = make_inventory(tmp_path)
    start = with_image_fallback(
        docker_run_command(inv, inv.head, own, None, "01234567"), own, [alt]
    )
    # "$img": its lookup and the run (a function the retry calls); the ID only in the pick
    assert start.count(' "$img" ') == 2 and start.count(own) == 1
    assert start.count("docker run ") == 1 and start.count("run_ray") == 3
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "docker").write_text(  # a node whose store holds only `held`
        '#!/bin/sh\nif [ "$1 $2" = "image inspect" ]; then [ "$3" = "$HELD" ]; exit; fi\n'
        'echo "$@" >> "$LOG"\n'
    )
    (fake / "docker").chmod(0o755)
    for held in (own, alt):
        log = tmp_path / f"{held[-1]}.log"
        env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "HELD": held, "LOG": str(log)}
        subprocess.run(["sh", "-c", picked], env=env, check=True)
        assert log.read_text().split()[4] == held


def test_a_node_the_doctor_saw_holding_the_pin_starts_it_by_that_id_with_no_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doctor's round told each node's ID for the pin (its own, or the containerd
    store's): the start runs that ID, where it looked the image up on the node first."""
    from provisioner.remote import Pool
    from provisioner.runtime.docker import runtime as docker
    from tests.unit.inventories import make_inventory

    own, alt = PIN.image_id, "sha256:" + "2" * 64
    monkeypatch.setattr(docker, "store_ids", lambda pin: frozenset({own, alt}))
    inv = make_inventory(tmp_path)
    head, one, two = inv.nodes
    # positive control: without the doctor's word, the start asks the node's Docker first
    assert "docker image inspect" in docker.DockerRuntime(inv, PIN).start_command(head)
    runtime = docker.DockerRuntime(inv, PIN)
    seen = {head.name: own, one.name: alt, two.name: own}
    with Pool(inv) as pool:  # every node holds it: nothing is asked of any
        report = runtime.delivery().deliver(pool, lambda _: None, ready=seen)
    assert {n.via for n in report.nodes.values()} == {"doctor"}
    for node in inv.nodes:
        command = runtime.start_command(node)
        assert "docker image inspect" not in command and f" {seen[node.name]} " in command
