"""`provisioner image build --project examples/gridcells` on the lab, as a user runs it.

The nodes hold the base pin (the `cluster_inventory` fixture pushed it): the project's
image, pushed, sends only its own layers; `up` on it and `submit` of the example's
train.py trains with env runners on every node, each importing the project's package from
the image (not from the job's upload); one line of the environment changed and rebuilt
differs in the last layer only, and its push sends about that layer. A package that does
not build is refused through the CLI: exit 2, no pin. The cluster goes down at the end
and the nodes' cluster tag goes back to the base pin (later modules expect both).
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from provisioner.image.pin import CLUSTER_TAG, Pin, read_pin
from provisioner.inventory import Inventory, load_inventory
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.delivery import DeliveryReport
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.direct import SavedCache
from provisioner.runtime.docker.push import push_image
from tests.e2e.helpers import cli, cli_json

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gridcells"
IMAGES = ROOT / "images"
SITE = "/opt/ray/lib/python3.11/site-packages/gridcells/"
# docker save's tar around the layers (headers, manifest, config): well under a megabyte
TAR_SLACK = 1 << 20


def build(project: Path) -> tuple[Pin, dict[str, object]]:
    code, doc, err = cli_json(
        "image", "build", "--project", str(project), "--images-dir", str(IMAGES)
    )
    assert code == 0, err[-3000:]
    return read_pin(Path(doc["lock"])), doc


def own_bytes(pin: Pin, base: Pin) -> int:
    return pin.bytes_for(len(base.layers))


def check_push(report: DeliveryReport, layers: int, most: int) -> None:
    assert report.ok, report.errors
    assert len(report.nodes) == 3
    for node in report.nodes.values():
        assert node.layers_sent == layers, node
        assert 0 < node.bytes_sent <= most * 1.1 + TAR_SLACK, node


def loader_bytes(pin: Pin, cache: Path) -> tuple[int, dict[str, int]]:
    """The bytes of a send of `pin`'s last layer to a classic-store node holding the rest,
    counted from the image's `docker save` file in the push's cache: what `docker load`
    reads of it (the manifest.json, the config, the layer's file), each member's header
    and blocks, and the two end blocks; sent plain, and by codec family ("zst", "gz") with
    the layer's file replaced by its compressed copy in the push's layer cache (a
    one-line change is a send small enough to compress unmeasured). The save's other
    members (the legacy layer directories, their json and VERSION) must not travel."""
    saved_cache = SavedCache(pin, cache)
    saved = saved_cache.get(print)
    hexd = pin.image_id.removeprefix("sha256:")
    layer = saved.layer_files[-1]
    read = {"manifest.json", f"{hexd}.json", f"blobs/sha256/{hexd}", layer}
    kept = [m for m in saved.members if m.name.removeprefix("./") in read]
    assert len(kept) == 3, [m.name for m in kept]
    assert len(saved.members) > len(kept) + 1  # positive control: the save holds more
    plain = sum(m.offset_data - m.offset + m.size + (-m.size % 512) for m in kept) + 1024
    member = next(m for m in kept if m.name.removeprefix("./") == layer)
    rest = plain - (member.offset_data - member.offset + member.size + (-member.size % 512))
    compressed = {}
    for packed in saved_cache.layers.directory.glob(f"{pin.layers[-1].removeprefix('sha256:')}.*"):
        size = packed.stat().st_size
        compressed[packed.suffix[1:]] = (
            rest + len(member_header(member, size)) + size + (-size % 512)
        )
    return plain, compressed


def member_header(member: tarfile.TarInfo, size: int) -> bytes:
    """The header the push writes for a layer file replaced by its compressed copy."""
    info = tarfile.TarInfo(member.name)
    info.size = size
    info.mode, info.mtime, info.uid, info.gid = member.mode, member.mtime, member.uid, member.gid
    info.uname, info.gname = member.uname, member.gname
    return info.tobuf(tarfile.PAX_FORMAT)


def forget_project(inv: Inventory, base: Pin, deps_layer: str) -> None:
    """The nodes hold the base pin under the cluster tag and no image with the project's
    dependency layer (every build of the project has it)."""
    report = push_image(inv, None, print, pin=base)
    assert report.ok, report.errors
    # the pin's ID as each node's image store names it (a containerd store: its own)
    ids = {n.host: n.image_id or base.image_id for n in report.nodes.values()}
    script = (
        "for i in $(docker image ls -aq --no-trunc | sort -u); do "
        "docker image inspect -f '{{json .RootFS.Layers}}' \"$i\" | grep -q "
        f'{deps_layer} && docker rmi -f "$i" >/dev/null; done; '
        f"docker image ls -aq --no-trunc | xargs -r docker image inspect -f "
        "'{{json .RootFS.Layers}}' | grep -c " + deps_layer + " || true"
    )
    for node in inv.nodes:
        rc, out = exec_rc(node.name, script, timeout=120)
        assert rc == 0 and out.strip().splitlines()[-1] == "0", (node.name, out)
        rc, out = exec_rc(node.name, f"docker image inspect -f '{{{{.Id}}}}' {CLUSTER_TAG}")
        assert out.strip() == ids[node.name], (node.name, out)  # the positive control


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example (its lock included), edited by the tests, not the repository."""
    where = tmp_path_factory.mktemp("project") / "gridcells"
    shutil.copytree(EXAMPLE, where, ignore=shutil.ignore_patterns("image.lock.json", "*.egg-info"))
    return where


def test_the_project_image_is_pushed_trained_on_every_node_and_rebuilt_by_its_last_layer(
    cluster_inventory: Path, lab: LabInfo, project: Path, tmp_path: Path
) -> None:
    base = read_pin(IMAGES / "image.lock.json")
    pin, doc = build(project)
    info = pin.extra["project"]
    assert pin.layers[: len(base.layers)] == base.layers
    assert list(info["layers"]) == ["deps", "own"]
    assert pin.layers[len(base.layers) :] == (info["layers"]["deps"], info["layers"]["own"])
    assert info["packages"]["gridcells"] == "0.1.0" and "shapely" in info["packages"]
    assert (project / "provisioner.lock").read_text() == (EXAMPLE / "provisioner.lock").read_text()

    inv = load_inventory(cluster_inventory)
    forget_project(inv, base, info["layers"]["deps"])  # a kept lab may hold an earlier run's
    check_push(push_image(inv, None, print, pin=pin), 2, own_bytes(pin, base))

    # the same cluster, its inventory pointing at the project's pin (next to the lab's: its
    # key and known_hosts are named relative to it)
    document = yaml.safe_load(cluster_inventory.read_text())
    document["image"]["lock"] = str(doc["lock"])
    inventory = cluster_inventory.with_name("inventory-project.yaml")
    inventory.write_text(yaml.safe_dump(document))
    try:
        code, _, err = cli("up", "-i", str(inventory))
        assert code == 0, err[-3000:]
        # five runners of one CPU each on three nodes of two CPUs: every node has one
        code, out, err = cli(
            "submit", "-i", str(inventory), "--results", str(tmp_path / "results"), "--json",
            str(project / "train.py"), "--", "--env-runners", "5", "--iterations", "1",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = tmp_path / "results" / json.loads(out)["job_id"]
        rows = json.loads((job / "metrics.json").read_text())
        assert [r["iteration"] for r in rows] == [1] and rows[-1]["env_steps"] > 0
        runners = json.loads((job / "runners.json").read_text())
        assert len(runners) == 5
        assert {r["node_ip"] for r in runners} == {n.address for n in lab.nodes}, runners
        assert all(r["gridcells"].startswith(SITE) for r in runners), runners
        assert any(p.is_file() and p.stat().st_size for p in (job / "checkpoint").rglob("*"))
    finally:
        cli("down", "-i", str(inventory), "--no-logs")
        inventory.unlink()

    env = project / "src" / "gridcells" / "env.py"
    env.write_text(
        env.read_text().replace(
            "reward = float(covered.sum()) - 0.1", "reward = float(covered.sum()) - 0.2"
        )
    )
    changed, _ = build(project)
    assert changed.layers[:-1] == pin.layers[:-1] and changed.layers[-1] != pin.layers[-1]
    last = changed.layer_sizes[-1] if changed.layer_sizes else 0
    assert 0 < last < own_bytes(pin, base)
    cache = tmp_path / "push-cache"
    report = push_image(inv, None, print, pin=changed, opts=PushOptions(cache_dir=cache))
    check_push(report, 1, last)
    # a node on Docker's classic store gets what its `docker load` reads, and nothing else:
    # the layer compressed (a send this small is, unmeasured), so fewer bytes than plain
    classic = [n for n in report.nodes.values() if n.store == "classic"]
    assert classic, report.nodes
    plain, exact = loader_bytes(changed, cache)
    assert exact and all(n < plain for n in exact.values()), (plain, exact)
    for n in classic:
        assert n.codec in exact and n.bytes_sent == exact[n.codec], (exact, n)
    print(f"one-line change: {exact} B sent by codec (plain: {plain} B), layer {last} B")
    # the nodes' cluster tag back on the base pin, as later modules expect
    forget_project(inv, base, info["layers"]["deps"])


def test_a_package_that_does_not_build_exits_2_and_writes_no_pin(
    cluster_inventory: Path, tmp_path: Path
) -> None:
    project = tmp_path / "broken"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("image.lock.json"))
    env = project / "src" / "gridcells" / "env.py"
    (project / "setup.py").write_text("raise SystemExit('this package does not build')\n")
    code, _, err = cli("image", "build", "--project", str(project), "--images-dir", str(IMAGES))
    assert code == 2, err[-3000:]
    assert "the project's package does not build" in err and "this package does not build" in err
    assert "Traceback" not in err and "fix:" in err
    assert not (project / "image.lock.json").exists()
    assert env.is_file()  # a positive control: the project is where the test put it


def test_sagemakers_training_image_derives_from_the_project_pin(project: Path) -> None:
    """SageMaker runs the pin's image with its entry point added (`FROM` the pin): on a
    project's pin, the project's packages are there, from the image's site-packages."""
    from provisioner.lab.engine import client
    from provisioner.sagemaker.image import ensure_image

    pin = read_pin(project / "image.lock.json")  # the last build of the test above
    image = ensure_image(pin, print)
    assert image.base_image_id == pin.image_id
    out = client().containers.run(
        image.tag,
        ["python", "-c", "import gridcells, shapely; print(gridcells.__file__)"],
        remove=True,
        network_disabled=True,
    )
    assert bytes(out).decode().strip() == SITE + "__init__.py"
