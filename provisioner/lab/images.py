"""Images for the lab, built locally without any registry, reused until their recipe changes.

- the base: `provisioner.image.base_image` (Debian bookworm with Python 3.11, or trixie with
  Python 3.13, from debootstrap);
- the node: base + sshd + dockerd + a login user, one per flavour (`flavours.py`): the
  base of its Debian release, and for the containerd flavour Docker's containerd image
  store switched on (containerd.Dockerfile);
- the podman node: base + sshd + rootless Podman for a login user without Docker.
Each tag carries a hash of its recipe, so a changed recipe builds a new image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from importlib import resources
from pathlib import Path

from docker.errors import BuildError, ImageNotFound

from provisioner.console import Reporter, quiet
from provisioner.errors import LabError, PrerequisiteError
from provisioner.image.base_image import ensure_base_image
from provisioner.lab.config import LABEL
from provisioner.lab.engine import client
from provisioner.lab.flavours import DEFAULT_FLAVOUR, FLAVOURS, HOST_PACKAGES, RELEASE_PACKAGES
from provisioner.local import build_lock

RECIPE_FILES = ("node.Dockerfile", "sshd_config", "entrypoint.sh", "delay-proxy.py")


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def _recipe_dir() -> Path:
    return Path(str(resources.files("provisioner.lab") / "recipe"))


def node_tag(base: str) -> str:
    recipe = _recipe_dir()
    return (
        f"provisioner-lab-node:{_digest(base, *((recipe / f).read_bytes() for f in RECIPE_FILES))}"
    )


RELEASE_RECIPE = "node-release.Dockerfile"


def release_node_tag(node: str, packages: tuple[str, ...]) -> str:
    """The tag of a node image of a later Debian release: `node` plus that release's packages."""
    recipe = (_recipe_dir() / RELEASE_RECIPE).read_bytes()
    return f"provisioner-lab-node:{_digest(node, recipe, *packages)}"


def _exists(tag: str) -> bool:
    try:
        client().images.get(tag)
    except ImageNotFound:
        return False
    return True


CONTAINERD_RECIPE = ("containerd.Dockerfile", "containerd-daemon.json")


def containerd_node_tag(node: str) -> str:
    """The tag of a node image with Docker's containerd image store on, made from `node`."""
    recipe = _recipe_dir()
    files = [(recipe / f).read_bytes() for f in CONTAINERD_RECIPE]
    return f"provisioner-lab-node:{_digest(node, *files)}"


def ensure_node_image(report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR) -> str:
    """The tag of the lab node image (sshd + dockerd + login user) of a flavour, built once."""
    with build_lock(report):
        return _ensure_node_image(report, flavour)


def _ensure_node_image(report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR) -> str:
    kind = FLAVOURS[flavour]
    base = ensure_base_image(report, kind.suite)
    tag = node_tag(base)
    if not _exists(tag):
        report(f"building the lab node image {tag} ({kind.suite}: sshd, dockerd; a minute)")
        _docker_build(_recipe_dir(), "node.Dockerfile", tag, {"BASE_IMAGE": base}, report)
    packages = RELEASE_PACKAGES[kind.suite]
    if packages:
        node, tag = tag, release_node_tag(tag, packages)
        if not _exists(tag):
            report(f"building the lab node image {tag} ({kind.suite}: {' '.join(packages)})")
            args = {"NODE_IMAGE": node, "RELEASE_PACKAGES": " ".join(packages)}
            _docker_build(_recipe_dir(), RELEASE_RECIPE, tag, args, report)
    if not kind.containerd_store:
        return tag
    node, tag = tag, containerd_node_tag(tag)
    if not _exists(tag):
        report(f"building the lab node image {tag} ({flavour}: Docker's containerd store)")
        _docker_build(_recipe_dir(), "containerd.Dockerfile", tag, {"NODE_IMAGE": node}, report)
    return tag


HOST_DOCKERFILE = "host.Dockerfile"


def host_node_tag(node: str, lock_text: str) -> str:
    recipe = (_recipe_dir() / HOST_DOCKERFILE).read_bytes()
    return f"provisioner-lab-host:{_digest(node, recipe, lock_text)}"


# The host-mode virtualenv of a node whose Python is not the cluster lock's (3.11): the
# lock's Ray, RLlib and their packages for that Python, without torch (no CPU build of
# torch for CPython 3.13 on the indexes the lab uses: Debian's own is linked in, see
# HOST_PACKAGES), in the lab's recipe.
HOST_LOCKS = {"3.13": "host-py3.13.lock"}


def ensure_host_node_image(
    images_dir: Path, report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR
) -> str:
    """The tag of the host-mode lab node image of a flavour: its node image plus a
    virtualenv built offline from the node's own Python, the locked wheels (images/
    requirements.lock, or for another Python the lab's lock for it, HOST_LOCKS) and the
    wheelhouse (images/.wheelhouse), on the login shell's PATH only. Built once per lock."""
    with build_lock(report):
        return _ensure_host_node_image(images_dir, report, flavour)


def _host_lock(images_dir: Path, python: str) -> Path:
    if python in HOST_LOCKS:
        return _recipe_dir() / HOST_LOCKS[python]
    return images_dir / "requirements.lock"


def _ensure_host_node_image(
    images_dir: Path, report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR
) -> str:
    from provisioner.image.lock import without_indexes

    node = _ensure_node_image(report, flavour)
    python = FLAVOURS[flavour].python
    lock = _host_lock(images_dir, python)
    if not lock.is_file():
        raise PrerequisiteError(
            f"no requirements lock at {lock}: host-mode nodes get their virtualenv from it",
            "run from the repository root, or pass --images DIR",
        )
    full = lock.read_text()
    text = without_indexes(full)  # the packages: the index lines only say where they come from
    tag = host_node_tag(node, text)
    if not _exists(tag):
        _build_host_node_image(images_dir, full, text, lock, node, tag, flavour, report)
    packages = HOST_PACKAGES[FLAVOURS[flavour].suite]
    if not packages:
        return tag
    host, tag = tag, host_release_tag(tag, packages)
    if not _exists(tag):
        report(f"building the host-mode lab node image {tag} ({' '.join(packages)})")
        args = {"HOST_IMAGE": host, "PYTHON": python, "HOST_PACKAGES": " ".join(packages)}
        _docker_build(_recipe_dir(), HOST_RELEASE_RECIPE, tag, args, report)
    return tag


HOST_RELEASE_RECIPE = "host-release.Dockerfile"


def host_release_tag(host: str, packages: tuple[str, ...]) -> str:
    """The tag of a host-mode node image plus its Debian release's packages for Ray."""
    recipe = (_recipe_dir() / HOST_RELEASE_RECIPE).read_bytes()
    return f"provisioner-lab-host:{_digest(host, recipe, *packages)}"


def _build_host_node_image(
    images_dir: Path,
    full: str,
    text: str,
    lock: Path,
    node: str,
    tag: str,
    flavour: str,
    report: Reporter,
) -> None:
    from provisioner.image.lock import index_urls, parse_lock
    from provisioner.image.wheelhouse import ensure_wheels

    python = FLAVOURS[flavour].python
    wheels = ensure_wheels(
        parse_lock(text, str(lock)),
        images_dir / ".wheelhouse",
        indexes=index_urls(full),
        report=report,
        python_version=python,
    )
    report(f"building the host-mode lab node image {tag} ({flavour}: a virtualenv with Ray)")
    with tempfile.TemporaryDirectory(prefix="lab-host-") as tmp:
        ctx = Path(tmp)
        (ctx / "wheels").mkdir()
        for wheel in wheels:
            try:
                os.link(wheel, ctx / "wheels" / wheel.name)
            except OSError:
                shutil.copy2(wheel, ctx / "wheels" / wheel.name)
        (ctx / "requirements.lock").write_text(text)
        shutil.copy2(_recipe_dir() / HOST_DOCKERFILE, ctx / "Dockerfile")
        _docker_build(ctx, "Dockerfile", tag, {"NODE_IMAGE": node}, report)


PODMAN_RECIPE = ("podman.Dockerfile", "podman-entrypoint.sh", "sshd_config")


def podman_node_tag(base: str) -> str:
    recipe = _recipe_dir()
    files = [(recipe / f).read_bytes() for f in PODMAN_RECIPE]
    return f"provisioner-lab-podman:{_digest(base, *files)}"


def ensure_podman_node_image(report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR) -> str:
    """The tag of the podman lab node image of a flavour: its Debian release's base plus
    sshd and that release's rootless Podman (4.3 on bookworm, 5.4 on trixie) for a login
    user with no Docker and no sudo. Built once."""
    suite = FLAVOURS[flavour].suite
    with build_lock(report):
        base = ensure_base_image(report, suite)
        tag = podman_node_tag(base)
        if not _exists(tag):
            report(f"building the podman lab node image {tag} ({suite}: sshd, podman; a minute)")
            _docker_build(_recipe_dir(), "podman.Dockerfile", tag, {"BASE_IMAGE": base}, report)
        return tag


SLURM_RECIPE = ("slurm.Dockerfile", "slurm-entrypoint.sh")


def slurm_node_tag(host: str) -> str:
    recipe = _recipe_dir()
    return (
        f"provisioner-lab-slurm:{_digest(host, *((recipe / f).read_bytes() for f in SLURM_RECIPE))}"
    )


def ensure_slurm_node_image(
    images_dir: Path, report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR
) -> str:
    """The tag of the SLURM lab node image of a flavour: its host-mode node image plus
    Debian's slurm-wlm and munge packages (from the Debian mirror at build time: Slurm
    22.05 on bookworm, 24.11 on trixie). Built once."""
    with build_lock(report):
        return _ensure_slurm_node_image(images_dir, report, flavour)


def _ensure_slurm_node_image(
    images_dir: Path, report: Reporter = quiet, flavour: str = DEFAULT_FLAVOUR
) -> str:
    host = _ensure_host_node_image(images_dir, report, flavour)
    tag = slurm_node_tag(host)
    if not _exists(tag):
        report(f"building the SLURM lab node image {tag} ({flavour}: slurm-wlm, munge)")
        _docker_build(_recipe_dir(), "slurm.Dockerfile", tag, {"HOST_IMAGE": host}, report)
    return tag


def _docker_build(
    context: Path, dockerfile: str, tag: str, buildargs: dict[str, str], report: Reporter
) -> None:
    last = 0.0
    try:
        for chunk in client().api.build(
            path=str(context),
            dockerfile=dockerfile,
            tag=tag,
            buildargs=buildargs,
            labels={LABEL: "image"},
            rm=True,
            decode=True,
            network_mode="bridge",
        ):
            if "error" in chunk:
                raise LabError(
                    f"building {tag} failed: {chunk['error'].strip()}",
                    "read the build's error above; check the docker daemon (`docker info`) "
                    "and its disk space, then run `provisioner lab up` again",
                )
            line = str(chunk.get("stream", "")).strip()
            now = time.monotonic()
            if line and (line.startswith("Step") or now - last > 5):
                report(f"build {tag}: {line[:100]}")
                last = now
    except BuildError as exc:
        raise LabError(
            f"building {tag} failed: {exc}",
            "read the build's error above; check the docker daemon (`docker info`) and its "
            "disk space, then run `provisioner lab up` again",
        ) from exc
