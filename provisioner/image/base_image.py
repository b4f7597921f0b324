"""The base image the cluster image is built FROM when `image build` is given none: Debian
bookworm with Python 3.11, built locally with debootstrap (or FROM a registry image named
in $PROVISIONER_BASE_IMAGE where a registry is reachable), reused until its recipe changes
(the tag carries a hash of it). The lab builds its node images on it too.

debootstrap needs root (and Debian); a user in the docker group builds from a base image
already on the machine: the Debian base built once before, else the default registry
base, `python:3.11-slim-bookworm`, when it was pulled (`choose_build_base`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from docker.errors import BuildError, ImageNotFound

from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError, PrerequisiteError
from provisioner.local import build_lock, need, state_root
from provisioner.local import docker_client as client

# The label on every local image this tool builds for its own use (the lab's cleanup and
# `docker image ls --filter label=...` find them by it).
LABEL = "io.provisioner.lab"

SUITE = "bookworm"
# Debian releases the lab's nodes may run (`provisioner lab up --flavours`): each gets a
# base of its own, debootstrapped from the same mirror. `image build` uses SUITE's.
SUITES = ("bookworm", "trixie")
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "openssh-client",
    "rsync",
    "ca-certificates",
    "iproute2",
    "procps",
    # software OpenGL (Mesa's OSMesa): MuJoCo renders headless with it in the cluster image
    # (`provisioner eval --video`; MUJOCO_GL=osmesa there)
    "libosmesa6",
)
# The base `image build` takes, without --base, where it cannot build the Debian one (not
# root, or no debootstrap) and it is on this machine: the official Python image of the
# same Debian release and Python (`docker pull` it where a registry is reachable).
DEFAULT_BASE = "python:3.11-slim-bookworm"


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:12]


def base_tag(registry_base: str | None = None, suite: str = SUITE) -> str:
    """The base's tag: its Debian release and a hash of where it comes from and what it holds.
    A registry base stands in for SUITE's only (it names its own release)."""
    source = (registry_base if suite == SUITE else None) or f"debootstrap:{suite}"
    return f"provisioner-base:{suite}-{_digest(source, *BASE_PACKAGES)}"


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


def ensure_base_image(report: Reporter = quiet, suite: str = SUITE) -> str:
    """The tag of the local base image of a Debian release (SUITES), building it once
    (debootstrap, about a minute)."""
    with build_lock(report):
        return _ensure_base_image(report, suite)


@dataclass(frozen=True)
class BaseChoice:
    """Which base `image build` builds FROM, and how it gets there."""

    tag: str
    how: str  # "built": already here | "debootstrap": built now (root) | "registry" | "default"


def choose_build_base(
    *,
    registry_base: str | None,
    built_tag: str,
    built_present: bool,
    default_present: bool,
    is_root: bool,
    has_debootstrap: bool,
) -> BaseChoice:
    """Pure: the base of `image build` without --base. $PROVISIONER_BASE_IMAGE first; then
    the Debian base when it is already built (by anyone: it is a local image); then
    debootstrap, the offline path, for root where it is installed; then DEFAULT_BASE when
    it is on this machine. Otherwise a PrerequisiteError (exit 2) saying how to get a base:
    never a debootstrap run that cannot succeed."""
    if registry_base:
        return BaseChoice(built_tag, "registry")
    if built_present:
        return BaseChoice(built_tag, "built")
    if is_root and has_debootstrap:
        return BaseChoice(built_tag, "debootstrap")
    if default_present:
        return BaseChoice(DEFAULT_BASE, "default")
    why = (
        "building the Debian base with debootstrap needs root"
        if not is_root
        else "`debootstrap` is not installed on this machine"
    )
    root_fix = (
        "or build the Debian base once as root (`sudo provisioner image build`; offline, "
        "from your Debian mirror), after which every user's `image build` uses it"
        if not is_root
        else "or install debootstrap (`apt-get install -y debootstrap`, Debian only) to "
        "build the Debian base offline"
    )
    raise PrerequisiteError(
        f"`image build` has no base image: neither the Debian base ({built_tag}) nor "
        f"{DEFAULT_BASE} is on this machine, and {why}",
        f"pull the default base where a registry is reachable (`docker pull {DEFAULT_BASE}`), "
        "or name a Debian bookworm image with python3 you have "
        f"(`provisioner image build --base IMAGE`), {root_fix}",
    )


def build_base(report: Reporter = quiet) -> BaseChoice:
    """The base for `image build` without --base (`choose_build_base` on this machine's
    facts), built first when that is the choice."""
    with build_lock(report):
        registry_base = os.environ.get("PROVISIONER_BASE_IMAGE")
        tag = base_tag(registry_base)
        choice = choose_build_base(
            registry_base=registry_base,
            built_tag=tag,
            built_present=_exists(tag),
            default_present=_exists(DEFAULT_BASE),
            is_root=os.geteuid() == 0,
            has_debootstrap=shutil.which("debootstrap") is not None,
        )
        if choice.how in ("registry", "debootstrap"):
            _ensure_base_image(report)
        return choice


def _ensure_base_image(report: Reporter = quiet, suite: str = SUITE) -> str:
    registry_base = os.environ.get("PROVISIONER_BASE_IMAGE") if suite == SUITE else None
    tag = base_tag(registry_base, suite)
    if _exists(tag):
        return tag
    if registry_base:
        _build_from_registry(registry_base, tag, report)
    else:
        _build_with_debootstrap(tag, report, suite)
    return tag


def _build_from_registry(registry_base: str, tag: str, report: Reporter) -> None:
    dockerfile = (
        f"FROM {registry_base}\n"
        "RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
        f"--no-install-recommends {' '.join(BASE_PACKAGES)} && rm -rf /var/lib/apt/lists/*\n"
    )
    with tempfile.TemporaryDirectory() as ctx:
        Path(ctx, "Dockerfile").write_text(dockerfile)
        _build(Path(ctx), tag, report)


def _build_with_debootstrap(tag: str, report: Reporter, suite: str = SUITE) -> None:
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
            suite,
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
            tail = imp.stderr.decode()[-400:]
            raise OperationError(
                f"docker import of the base image failed: {tail}",
                "check that the docker daemon runs and has disk space (`docker info`), then "
                "run `provisioner image build` again",
            )
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
        raise OperationError(
            f"{what} failed (exit {proc.returncode}): " + " | ".join(tail[-3:]),
            "read the lines above; debootstrap needs root and a reachable Debian mirror "
            "($PROVISIONER_DEBIAN_MIRROR), or set $PROVISIONER_BASE_IMAGE to a registry image",
        )


def _exists(tag: str) -> bool:
    try:
        client().images.get(tag)
    except ImageNotFound:
        return False
    return True


def _build(context: Path, tag: str, report: Reporter) -> None:
    last = 0.0
    try:
        for chunk in client().api.build(
            path=str(context),
            dockerfile="Dockerfile",
            tag=tag,
            labels={LABEL: "image"},
            rm=True,
            decode=True,
            network_mode="bridge",
        ):
            if "error" in chunk:
                raise OperationError(
                    f"building {tag} failed: {chunk['error'].strip()}",
                    "read the build's error above; check the docker daemon (`docker info`) "
                    "and its disk space, then build again",
                )
            line = str(chunk.get("stream", "")).strip()
            now = time.monotonic()
            if line and (line.startswith("Step") or now - last > 5):
                report(f"build {tag}: {line[:100]}")
                last = now
    except BuildError as exc:
        raise OperationError(
            f"building {tag} failed: {exc}",
            "read the build's error above; check the docker daemon (`docker info`) and its "
            "disk space, then build again",
        ) from exc
