"""The end-to-end lab: one session-scoped lab of real nodes shared by every e2e test.

Name and subnet come from PROVISIONER_LAB_NAME / PROVISIONER_LAB_SUBNET (default: a lab
named `e2e` on 10.250.100.0/24, apart from a user's `make lab`). Tests undo the faults
they inject; a lab an aborted run left is removed at the start. The lab is removed
at the end unless PROVISIONER_KEEP_LAB=1 (then the next run starts in seconds).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.errors import InputError
from provisioner.lab import faults
from provisioner.lab.config import LabConfig
from provisioner.lab.flavours import parse_flavours
from provisioner.lab.nodes import LabInfo, lab_down, lab_up

E2E_NAME = os.environ.get("PROVISIONER_LAB_NAME", "e2e")
E2E_SUBNET = os.environ.get("PROVISIONER_LAB_SUBNET", "10.250.100.0/24")
# The `e2e` lab is mixed, as users' clusters are: a bookworm head (Docker 20.10, Python
# 3.11), a trixie worker (Docker 26, Python 3.13) and a worker whose Docker keeps images in
# containerd's image store (`lab up --flavours`).
E2E_FLAVOURS = os.environ.get("PROVISIONER_LAB_FLAVOURS", "bookworm,trixie,trixie+containerd")
# The host-mode lab (Ray in a virtualenv on each node, no image): a lab of its own.
HOST_NAME = os.environ.get("PROVISIONER_HOST_LAB_NAME", f"{E2E_NAME}-host")
HOST_SUBNET = os.environ.get("PROVISIONER_HOST_LAB_SUBNET", "10.250.101.0/24")
# The SLURM lab (a login node with slurmctld, compute nodes with slurmd): a lab of its own.
SLURM_NAME = os.environ.get("PROVISIONER_SLURM_LAB_NAME", f"{E2E_NAME}-slurm")
SLURM_SUBNET = os.environ.get("PROVISIONER_SLURM_LAB_SUBNET", "10.250.102.0/24")
# Its nodes' kind, one for all (slurmctld and slurmd of one release): bookworm (Slurm
# 22.05) or trixie (Slurm 24.11).
SLURM_FLAVOUR = os.environ.get("PROVISIONER_SLURM_LAB_FLAVOUR", "bookworm")
# The other Slurm release, for the path a user takes (up on an allocation, submit, down):
# a second SLURM lab of the other flavour (trixie, Slurm 24.11, unless SLURM_FLAVOUR is
# trixie: then bookworm, 22.05), so `make test` runs SLURM on both releases.
SLURM_OTHER_NAME = os.environ.get("PROVISIONER_SLURM_OTHER_LAB_NAME", f"{E2E_NAME}-slurm2")
SLURM_OTHER_SUBNET = os.environ.get("PROVISIONER_SLURM_OTHER_LAB_SUBNET", "10.250.107.0/24")
SLURM_OTHER_FLAVOUR = "bookworm" if SLURM_FLAVOUR == "trixie" else "trixie"
# The podman lab (rootless Podman for a login user without Docker): a lab of its own.
PODMAN_NAME = os.environ.get("PROVISIONER_PODMAN_LAB_NAME", f"{E2E_NAME}-podman")
PODMAN_SUBNET = os.environ.get("PROVISIONER_PODMAN_LAB_SUBNET", "10.250.103.0/24")
# Podman 4.3 (Debian 12) and 5.4 (Debian 13) side by side: each loads other compressed streams
PODMAN_FLAVOURS = ("bookworm", "trixie", "bookworm")
# The two-network lab (SSH on one network, Ray's traffic on another): a lab of its own.
DATA_NAME = os.environ.get("PROVISIONER_DATA_LAB_NAME", f"{E2E_NAME}-data")
DATA_SUBNET = os.environ.get("PROVISIONER_DATA_LAB_SUBNET", "10.250.105.0/24")
DATA_DATA_SUBNET = os.environ.get("PROVISIONER_DATA_LAB_DATA_SUBNET", "10.250.106.0/24")


# The e2e modules share one lab; this order keeps the expensive state (the image on every
# node, a running cluster) built once and reused: the image tests wipe the nodes first and
# leave the pin on all of them; the cluster, jobs and fault tests then run on it.
MODULE_ORDER = (
    "test_lab",
    "test_doctor",
    "test_image_push",
    "test_image_forward",
    "test_image_user",
    # up and down on the project's image; leaves the base pin under the cluster tag
    "test_image_project",
    "test_cluster_lifecycle",
    "test_ssh_routes",
    "test_ssh_as_installed",
    "test_ssh_cipher",
    "test_ray_up",
    "test_jobs",
    "test_shared_nodes",
    "test_token_rotation",
    "test_long_runs",
    # on the data lab, after test_long_runs: up at its start, down at its end
    "test_job_output",
    "test_live_tensorboard",
    "test_storm",
    "test_faults",
    "test_security",
    "test_hostile_returns",
    "test_bounded_returns",
    # with the cluster down, it starts it again
    "test_dashboard_listener",
    "test_bench_smoke",
    "test_gpu",
    "test_host_mode",
    "test_slurm",
    "test_slurm_security",
    "test_tls",
    "test_podman",
    "test_data_network",
    # from a venv of `pip install .` alone; it ends with `down` (later tests run `up`)
    "test_light_install",
)


# Tests on the host-mode, SLURM and podman labs touch nothing of the `e2e` lab: `make e2e` runs
# them (marked `apart`) in a second pytest process beside the first, so the suite's time
# is nearer the longer of the two than their sum. Image builds take a lock
# (`provisioner.local.build_lock`), so the two never build the same image at once.
APART_FIXTURES = {
    "host_lab", "host_lab_mixed", "slurm_lab", "slurm_lab_other", "podman_lab", "data_lab"
}  # fmt: skip
# Modules that need none of the `e2e` lab (SageMaker's local mode runs on this machine's
# own Docker; its one cluster test resumes on the host-mode lab) run there too.
APART_MODULES = {"test_sagemaker_local"}


def unordered_modules(stems: set[str]) -> list[str]:
    """The e2e modules (file stems) placed nowhere: neither in MODULE_ORDER nor apart.
    Such a module would run after every other, on whatever state they left."""
    return sorted(stems - set(MODULE_ORDER) - APART_MODULES)


def _apart(item: pytest.Item) -> bool:
    if Path(str(item.fspath)).stem in APART_MODULES:
        return True
    return bool(APART_FIXTURES & set(getattr(item, "fixturenames", ())))


def _rank(item: pytest.Item) -> tuple[int, int]:
    name = Path(str(item.fspath)).stem
    module = MODULE_ORDER.index(name) if name in MODULE_ORDER else len(MODULE_ORDER)
    # in the second process, a test that also needs the pin runs last: by then the first
    # process has built it (the build cache makes this one's build take seconds)
    needs_pin = _apart(item) and "image_pin" in getattr(item, "fixturenames", ())
    return (int(needs_pin), module)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    missing = unordered_modules({p.stem for p in here.glob("test_*.py")})
    if missing:
        raise pytest.UsageError(
            f"tests/e2e/conftest.py: {', '.join(missing)} not in MODULE_ORDER (nor "
            "APART_MODULES): add each where it belongs in the order"
        )
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)
            if _apart(item):
                item.add_marker(pytest.mark.apart)
    items.sort(key=_rank)  # stable: tests keep their file order within a module


@pytest.fixture(scope="session")
def lab_config() -> LabConfig:
    return LabConfig(
        name=E2E_NAME, subnet=E2E_SUBNET, nodes=3, flavours=parse_flavours(E2E_FLAVOURS)
    )


def _start(cfg: LabConfig, *args: Any, **kwargs: Any) -> LabInfo:
    """`lab up` for a test session. Unless PROVISIONER_KEEP_LAB=1 (reuse a kept lab), a lab
    of that name an earlier run left is removed first: a run killed before its `lab down`
    leaves nodes with clusters still running, whose ports and containers the tests would
    meet. A leftover on another subnet or size is removed either way."""
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(cfg)
    try:
        return lab_up(cfg, print, *args, **kwargs)
    except InputError:
        lab_down(cfg)
        return lab_up(cfg, print, *args, **kwargs)


@pytest.fixture(scope="session")
def lab(lab_config: LabConfig) -> Iterator[LabInfo]:
    info = _start(lab_config)
    faults.clear(info)
    yield info
    faults.clear(info)
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(lab_config)


@pytest.fixture(scope="session")
def lab_inventory(lab: LabInfo) -> Path:
    return lab.inventory


IMAGES = Path(__file__).resolve().parents[2] / "images"


@pytest.fixture(scope="session")
def image_pin() -> Path:
    """The cluster image built from images/ (the build cache makes a rebuild take seconds)
    and its pin written to images/image.lock.json, as `provisioner image build` does."""
    from provisioner.image.base_image import ensure_base_image
    from provisioner.image.build import BuildOptions, build_image

    opts = BuildOptions(
        images_dir=IMAGES,
        wheelhouse=IMAGES / ".wheelhouse",
        lock_path=IMAGES / "image.lock.json",
        base=ensure_base_image(print),
    )
    result = build_image(opts, print)  # waits while the other e2e process builds
    assert result.lock_path is not None and result.pin is not None
    return result.lock_path


@pytest.fixture(scope="session")
def cluster_inventory(lab: LabInfo, lab_config: LabConfig, image_pin: Path) -> Iterator[Path]:
    """The lab's inventory pointing at the pin, with the pin pushed to every node.

    Ray is not started here: tests that need a cluster run `provisioner up` (idempotent,
    so the first one starts it and the others find it healthy). `down` at the end.
    """
    from provisioner.cli import run
    from provisioner.image.pin import read_pin
    from provisioner.inventory import load_inventory
    from provisioner.runtime.docker.push import push_image

    info = lab_up(lab_config, print, image_pin)  # the same lab (its flavours), now pinned
    inv = load_inventory(info.inventory)
    report = push_image(inv, None, print, pin=read_pin(image_pin))
    assert report.ok, report.errors
    yield info.inventory
    run(["down", "-i", str(info.inventory), "--no-logs"])


# Its nodes: three bookworm nodes (Python 3.11), on which every host-mode test runs, and one
# trixie node (Python 3.13, the same Ray), which only the mixed-Python test's inventory names.
HOST_FLAVOURS = ("bookworm", "bookworm", "bookworm", "trixie")


@pytest.fixture(scope="session")
def host_lab_mixed() -> Iterator[LabInfo]:
    """A lab whose nodes run Ray from their own virtualenv (`lab up --runtime host
    --flavours HOST_FLAVOURS`), with an inventory of all its nodes that says `runtime:
    host`; removed at the end unless kept."""
    cfg = LabConfig(
        name=HOST_NAME, subnet=HOST_SUBNET, nodes=len(HOST_FLAVOURS), runtime="host",
        flavours=HOST_FLAVOURS,
    )  # fmt: skip
    info = _start(cfg, images_dir=IMAGES)
    faults.clear(info)
    yield info
    faults.clear(info)
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(cfg)


@pytest.fixture(scope="session")
def host_lab(host_lab_mixed: LabInfo) -> LabInfo:
    """The host-mode lab's nodes of one Python (its bookworm nodes), with an inventory of
    those alone (beside the lab's own, in its state folder)."""
    nodes = tuple(n for n in host_lab_mixed.nodes if n.flavour == HOST_FLAVOURS[0])
    names = {n.name for n in nodes}
    document = yaml.safe_load(host_lab_mixed.inventory.read_text())
    document["workers"] = [w for w in document["workers"] if w["name"] in names]
    inventory = host_lab_mixed.inventory.with_name("inventory-bookworm.yaml")
    inventory.write_text(yaml.safe_dump(document, sort_keys=False))
    return dataclasses.replace(host_lab_mixed, inventory=inventory, nodes=nodes)


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[LabInfo]:
    """A SLURM cluster (`lab up --slurm`): a login node and 3 compute nodes reached only
    through it, whose inventory asks SLURM for the nodes; removed at the end unless kept."""
    yield from _slurm_lab(SLURM_NAME, SLURM_SUBNET, SLURM_FLAVOUR)


@pytest.fixture(scope="session")
def slurm_lab_other() -> Iterator[LabInfo]:
    """The SLURM lab of the other Slurm release (SLURM_OTHER_FLAVOUR)."""
    yield from _slurm_lab(SLURM_OTHER_NAME, SLURM_OTHER_SUBNET, SLURM_OTHER_FLAVOUR)


def _slurm_lab(name: str, subnet: str, flavour: str) -> Iterator[LabInfo]:
    cfg = LabConfig(
        name=name, subnet=subnet, nodes=3, runtime="host", slurm=True,
        flavours=parse_flavours(flavour),
    )  # fmt: skip
    info = _start(cfg, images_dir=IMAGES)
    yield info
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(cfg)


@pytest.fixture(scope="session")
def podman_lab(image_pin: Path) -> Iterator[LabInfo]:
    """A lab whose nodes run rootless Podman for a login user without Docker or sudo
    (`lab up --runtime podman`; PODMAN_FLAVOURS: Podman 4.3 and 5.4), with an inventory
    that says `runtime: podman` and names the pin; removed at the end unless kept."""
    cfg = LabConfig(
        name=PODMAN_NAME,
        subnet=PODMAN_SUBNET,
        nodes=3,
        runtime="podman",
        flavours=PODMAN_FLAVOURS,
    )
    info = _start(cfg, image_pin)
    yield info
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(cfg)


@pytest.fixture(scope="session")
def data_lab(image_pin: Path) -> Iterator[LabInfo]:
    """A lab whose nodes have two networks (`lab up --data-subnet`): SSH only on one, Ray's
    traffic only on the other; its inventory gives each node's `ray: {address}` there and
    names the pin. Removed at the end unless kept."""
    cfg = LabConfig(name=DATA_NAME, subnet=DATA_SUBNET, nodes=3, data_subnet=DATA_DATA_SUBNET)
    info = _start(cfg, image_pin)
    faults.clear(info)
    yield info
    faults.clear(info)
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(cfg)
