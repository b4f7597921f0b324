"""Images for the lab, built locally without any registry, reused until their recipe changes.

- the base: Debian bookworm with Python 3.11, from debootstrap (or FROM a registry
  image named in $PROVISIONER_BASE_IMAGE where a registry is reachable);
- the node: base + sshd + dockerd + a login user.
Each tag carries a hash of its recipe, so a changed recipe builds a new image.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from importlib import resources
from pathlib import Path

from docker.errors import BuildError, ImageNotFound

from provisioner.console import Reporter, quiet
from provisioner.errors import LabError, PrerequisiteError
from provisioner.image.lock import Pin
from provisioner.lab.config import LABEL
from provisioner.lab.engine import client, need
from provisioner.local import build_lock, state_root

SUITE = "bookworm"
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "openssh-client",
    "rsync",
    "ca-certificates",
    "iproute2",
    "procps",
)
RECIPE_FILES = ("node.Dockerfile", "sshd_config", "entrypoint.sh", "delay-proxy.py")


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def base_tag(registry_base: str | None = None) -> str:
    source = registry_base or f"debootstrap:{SUITE}"
    return f"provisioner-base:{SUITE}-{_digest(source, *BASE_PACKAGES)}"


def _recipe_dir() -> Path:
    return Path(str(resources.files("provisioner.lab") / "recipe"))


def node_tag(base: str) -> str:
    recipe = _recipe_dir()
    return (
        f"provisioner-lab-node:{_digest(base, *((recipe / f).read_bytes() for f in RECIPE_FILES))}"
    )


def _exists(tag: str) -> bool:
    try:
        client().images.get(tag)
    except ImageNotFound:
        return False
    return True


def debian_mirror() -> str:
    """The Debian mirror this machine already uses ($PROVISIONER_DEBIAN_MIRROR overrides)."""
    env = os.environ.get("PROVISIONER_DEBIAN_MIRROR")
    if env:
        return env
    candidates = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in candidates:
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", line)
            if m:
                return m.group(1)
    raise PrerequisiteError(
        "cannot find a Debian mirror in /etc/apt/sources.list(.d)",
        "set PROVISIONER_DEBIAN_MIRROR to your Debian mirror's URL",
    )


def ensure_base_image(report: Reporter = quiet) -> str:
    """The tag of the local base image, building it once (debootstrap, about a minute)."""
    with build_lock(report):
        return _ensure_base_image(report)


def _ensure_base_image(report: Reporter = quiet) -> str:
    registry_base = os.environ.get("PROVISIONER_BASE_IMAGE")
    tag = base_tag(registry_base)
    if _exists(tag):
        return tag
    if registry_base:
        _build_from_registry(registry_base, tag, report)
    else:
        _build_with_debootstrap(tag, report)
    return tag


def _build_from_registry(registry_base: str, tag: str, report: Reporter) -> None:
    dockerfile = (
        f"FROM {registry_base}\n"
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        f"--no-install-recommends {' '.join(BASE_PACKAGES)} && rm -rf /var/lib/apt/lists/*\n"
    )
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(dockerfile)
        _docker_build(Path(ctx), "Dockerfile", tag, {}, report)


def _build_with_debootstrap(tag: str, report: Reporter) -> None:
    debootstrap = need("debootstrap", "debootstrap")
    mirror = debian_mirror()
    cache = state_root() / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache))
    try:
        report(f"building the base image {tag} with debootstrap from {mirror} (about a minute)")
        cmd = [
            debootstrap,
            "--variant=minbase",
            f"--include={','.join(BASE_PACKAGES)}",
            SUITE,
            str(rootfs),
            mirror,
        ]
        _run_reporting(cmd, report, "debootstrap")
        (rootfs / "etc" / "resolv.conf").write_text("")  # docker provides its own at run time
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (rootfs / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        report("importing the root filesystem into docker")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imp = subprocess.run(
            [
                need("docker", "docker.io"),
                "import",
                "-c",
                'CMD ["/bin/bash"]',
                "-c",
                f"LABEL {LABEL}=base",
                "-",
                tag,
            ],
            stdin=tar.stdout,
            capture_output=True,
            check=False,
        )
        tar.wait()
        if imp.returncode != 0 or tar.returncode != 0:
            raise LabError(f"docker import of the base image failed: {imp.stderr.decode()[-400:]}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)


def _run_reporting(cmd: list[str], report: Reporter, what: str) -> None:
    """Run a slow command, reporting a line of its output every few seconds."""
    last = 0.0
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-9:], line.rstrip()]
            now = time.monotonic()
            if now - last > 5:
                report(f"{what}: {line.strip()[:100]}")
                last = now
    if proc.returncode != 0:
        raise LabError(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail[-3:]))


def ensure_node_image(report: Reporter = quiet) -> str:
    """The tag of the lab node image (sshd + dockerd + login user), built once."""
    with build_lock(report):
        return _ensure_node_image(report)


def _ensure_node_image(report: Reporter = quiet) -> str:
    base = ensure_base_image(report)
    tag = node_tag(base)
    if not _exists(tag):
        report(f"building the lab node image {tag} (sshd, dockerd; about a minute)")
        _docker_build(_recipe_dir(), "node.Dockerfile", tag, {"BASE_IMAGE": base}, report)
    return tag


HOST_DOCKERFILE = "host.Dockerfile"


def host_node_tag(node: str, lock_text: str) -> str:
    recipe = (_recipe_dir() / HOST_DOCKERFILE).read_bytes()
    return f"provisioner-lab-host:{_digest(node, recipe, lock_text)}"


def ensure_host_node_image(images_dir: Path, report: Reporter = quiet) -> str:
    """The tag of the host-mode lab node image: the node image plus a virtualenv built
    offline from images/requirements.lock and the wheelhouse (images/.wheelhouse), on
    the login shell's PATH only. Built once per lock."""
    with build_lock(report):
        return _ensure_host_node_image(images_dir, report)


def _ensure_host_node_image(images_dir: Path, report: Reporter = quiet) -> str:
    from provisioner.image.requirements import parse_lock
    from provisioner.image.wheelhouse import ensure_wheels

    node = ensure_node_image(report)
    lock = images_dir / "requirements.lock"
    if not lock.is_file():
        raise PrerequisiteError(
            f"no requirements lock at {lock}: host-mode nodes get their virtualenv from it",
            "run from the repository root, or pass --images DIR",
        )
    text = lock.read_text()
    tag = host_node_tag(node, text)
    if _exists(tag):
        return tag
    wheels = ensure_wheels(parse_lock(text, str(lock)), images_dir / ".wheelhouse", report=report)
    report(f"building the host-mode lab node image {tag} (a virtualenv with Ray; minutes)")
    with tempfile.TemporaryDirectory(prefix="lab-host-") as tmp:
        ctx = Path(tmp)
        (ctx / "wheels").mkdir()
        for wheel in wheels:
            try:
                os.link(wheel, ctx / "wheels" / wheel.name)
            except OSError:
                shutil.copy2(wheel, ctx / "wheels" / wheel.name)
        shutil.copy2(lock, ctx / "requirements.lock")
        shutil.copy2(_recipe_dir() / HOST_DOCKERFILE, ctx / "Dockerfile")
        _docker_build(ctx, "Dockerfile", tag, {"NODE_IMAGE": node}, report)
    return tag


SLURM_RECIPE = ("slurm.Dockerfile", "slurm-entrypoint.sh")


def slurm_node_tag(host: str) -> str:
    recipe = _recipe_dir()
    return (
        f"provisioner-lab-slurm:{_digest(host, *((recipe / f).read_bytes() for f in SLURM_RECIPE))}"
    )


def ensure_slurm_node_image(images_dir: Path, report: Reporter = quiet) -> str:
    """The tag of the SLURM lab node image: the host-mode node image plus Debian's
    slurm-wlm and munge packages (from the Debian mirror at build time). Built once."""
    with build_lock(report):
        return _ensure_slurm_node_image(images_dir, report)


def _ensure_slurm_node_image(images_dir: Path, report: Reporter = quiet) -> str:
    host = ensure_host_node_image(images_dir, report)
    tag = slurm_node_tag(host)
    if not _exists(tag):
        report(f"building the SLURM lab node image {tag} (slurm-wlm, munge; a minute)")
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
                raise LabError(f"building {tag} failed: {chunk['error'].strip()}")
            line = str(chunk.get("stream", "")).strip()
            now = time.monotonic()
            if line and (line.startswith("Step") or now - last > 5):
                report(f"build {tag}: {line[:100]}")
                last = now
    except BuildError as exc:
        raise LabError(f"building {tag} failed: {exc}") from exc


def filler_image(
    base: Pin, tag: str, megabytes: int, parent: str = "scratch", text: bool = False
) -> Pin:
    """A cheap image to push in tests and benchmarks: `parent` plus one layer of
    `megabytes` pseudo-random bytes fixed by the tag (so the same image ID on every run),
    built locally as `tag` and pinned like `base`. `text`: the bytes drawn from 16
    letters (4 bits each, so a compressor halves them about), not from all 256."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", tag)
    with tempfile.TemporaryDirectory(prefix="filler-") as tmp:
        blob = Path(tmp) / name
        data = random.Random(tag).randbytes(megabytes * 1024 * 1024)
        if text:
            data = data.translate(bytes(b"abcdefghijklmnop"[i % 16] for i in range(256)))
        blob.write_bytes(data)
        os.utime(blob, (0, 0))
        (Path(tmp) / "Dockerfile").write_text(f"FROM {parent}\nCOPY {name} /{name}\n")
        image, _ = client().images.build(path=tmp, tag=tag, rm=True)
    attrs = client().api.inspect_image(image.id)
    return replace(
        base,
        image_id=image.id,
        layers=tuple(attrs["RootFS"]["Layers"]),
        layer_sizes=None,
        size=int(attrs["Size"]),
        tag=tag,
    )
