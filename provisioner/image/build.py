"""`provisioner image build`: build the cluster image offline and write its pin.

The build context is laid out here, not taken from a directory: the Dockerfile,
requirements.lock, the login-shell profile snippet and exactly the wheels the lock names.
The base image must already be on this machine: nothing here contacts a registry.
"""

from __future__ import annotations

import io
import json
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from docker.errors import APIError, ImageNotFound

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError, ProvisionerError
from provisioner.image.facts import (
    FACTS_KEY,
    capture_in_image,
    login_capture_command,
    pin_facts,
    write_facts,
)
from provisioner.image.lock import index_urls, lock_sha256, parse_lock, without_indexes
from provisioner.image.pin import BUILD_TAG, Pin, Versions, layer_sizes_from_history, write_pin
from provisioner.image.wheelhouse import ensure_wheels
from provisioner.local import build_lock
from provisioner.local import docker_client as client

CONTEXT_FILES = ("Dockerfile", "requirements.lock", "ray-profile.sh")
# Run through a login shell, as `ray up` runs every command: this checks the PATH too.
# torch's CUDA version from its version.py, run alone (importing torch takes seconds)
VERSIONS_SCRIPT = (
    "import importlib.metadata as m, importlib.util as u, json, os, platform, runpy; "
    "t = u.find_spec('torch'); "
    "v = os.path.join(list(t.submodule_search_locations)[0], 'version.py') if t else ''; "
    "print(json.dumps({'python': platform.python_version(), "
    "'cuda': runpy.run_path(v).get('cuda') if v and os.path.exists(v) else None, "
    "**{k: m.version(k) for k in ('ray', 'torch', 'gymnasium')}}))"
)
# The image variants: the lock each installs, and where its pin goes by default.
VARIANTS = {"cpu": "requirements", "cuda": "requirements-cuda"}
LOGIN_CHECK = f'command -v ray >/dev/null && python -c "{VERSIONS_SCRIPT}"'


@dataclass(frozen=True)
class BuildOptions:
    images_dir: Path
    wheelhouse: Path
    lock_path: Path
    base: str  # a local image (tag or ID)
    tag: str = BUILD_TAG
    offline: bool = False
    target: str | None = None  # a Dockerfile stage; only the full image gets a pin
    variant: str = "cpu"  # cpu: requirements.lock; cuda: requirements-cuda.lock (CUDA torch)

    @property
    def lock_file(self) -> Path:
        """The requirements lock this variant installs."""
        return self.images_dir / f"{VARIANTS[self.variant]}.lock"


@dataclass(frozen=True)
class BuildResult:
    pin: Pin | None
    image_id: str
    seconds: float
    lock_path: Path | None


def default_images_dir() -> Path:
    """./images when it holds a Dockerfile, else the images/ of this source checkout."""
    here = Path.cwd() / "images"
    if (here / "Dockerfile").is_file():
        return here
    return Path(__file__).resolve().parents[2] / "images"


def check_images_dir(images_dir: Path, lock_name: str = "requirements.lock") -> None:
    for name in (*CONTEXT_FILES, lock_name):
        if not (images_dir / name).is_file():
            raise InputError(
                f"{name} is missing",
                "pass --images-dir pointing at the repository's images/ directory",
                where=str(images_dir),
            )


def write_context(
    images_dir: Path, wheels: Sequence[Path], out: IO[bytes], lock_name: str = "requirements.lock"
) -> None:
    """The build context as a tar: fixed owners and times, so the build cache holds; the
    variant's lock goes in as requirements.lock."""
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(path: Path, arcname: str) -> None:
            info = tar.gettarinfo(str(path), arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            info.mode = 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)

        for name in CONTEXT_FILES:
            if name == "requirements.lock":
                # without its index lines: where a wheel came from does not change the image
                data = without_indexes((images_dir / lock_name).read_text()).encode()
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(data), 0o644, 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data))
                continue
            add(images_dir / name, name)
        for wheel in wheels:
            add(wheel, f"wheels/{wheel.name}")


def _base_id(base: str) -> str:
    try:
        return str(client().images.get(base).id)
    except ImageNotFound:
        raise InputError(
            f"the base image {base!r} is not on this machine",
            f"pull it yourself where a registry is reachable (`docker pull {base}`), or "
            "leave out --base (the Debian base built here, as root with debootstrap, or "
            "python:3.11-slim-bookworm when pulled)",
        ) from None


def _docker_build(
    context: IO[bytes], opts: BuildOptions, args: dict[str, str], report: Reporter
) -> str:
    image_id = ""
    tail: list[str] = []
    try:
        stream = client().api.build(
            fileobj=context,
            custom_context=True,
            tag=opts.tag,
            buildargs=args,
            target=opts.target,
            rm=True,
            forcerm=True,
            pull=False,
            decode=True,
        )
        for chunk in stream:
            if "error" in chunk:
                raise OperationError(
                    f"docker build failed: {str(chunk['error']).strip()}",
                    "read the lines above; `docker build` output names the failing step. "
                    + " | ".join(tail[-3:]),
                )
            aux = chunk.get("aux")
            if isinstance(aux, dict) and "ID" in aux:
                image_id = str(aux["ID"])
            line = str(chunk.get("stream", "")).strip()
            if line:
                tail = [*tail[-5:], line[:160]]
                if line.startswith("Step "):
                    report(f"build: {line[:120]}")
    except APIError as exc:
        raise OperationError(
            f"docker build failed: {exc.explanation or exc}",
            "read the build's error above (a requirement that does not install, no disk "
            "space, no wheelhouse offline); fix it and run `provisioner image build` again",
        ) from exc
    if not image_id:
        image_id = str(client().images.get(opts.tag).id)
    return image_id


def read_versions(image_id: str) -> tuple[Versions, str | None]:
    """Python, Ray, torch and gymnasium versions, read inside the image via a login shell,
    and the CUDA version of its torch (None: the CPU build)."""
    try:
        out = client().containers.run(
            image_id,
            ["bash", "--login", "-c", "-i", LOGIN_CHECK],
            remove=True,
            network_disabled=True,
            stdout=True,
            stderr=False,
        )
    except APIError as exc:
        raise OperationError(
            f"the built image cannot run `ray`/`python` from a login shell: {exc}",
            "check images/ray-profile.sh and the Dockerfile's PATH",
        ) from exc
    data: Any = json.loads(bytes(out).decode().strip().splitlines()[-1])
    versions = Versions(
        python=str(data["python"]),
        ray=str(data["ray"]),
        torch=str(data["torch"]),
        gymnasium=str(data["gymnasium"]),
    )
    return versions, (str(data["cuda"]) if data.get("cuda") else None)


def capture_facts(
    image_id: str, command: list[str], pin_path: Path, report: Reporter
) -> dict[str, str] | None:
    """The experiment facts (`image.facts`), captured with the image's Python and written
    beside the pin: the pin's entry for them. A capture that fails does not fail the
    build: it is said, and `submit FILE.yaml` captures them from the head instead."""
    kept = kept_facts(image_id, pin_path)
    if kept is not None:
        report(f"experiment facts: {pin_path.parent / kept['file']} (this image's, kept)")
        return kept
    report("capturing the experiment facts with the image's Python (RLlib, gymnasium)")
    try:
        data = capture_in_image(image_id, command)
    except ProvisionerError as exc:
        report(f"no experiment facts: {exc}; `submit FILE.yaml` will ask the head for them")
        return None
    entry = write_facts(data, pin_path)
    report(f"experiment facts: {pin_path.parent / entry['file']} ({len(data) // 1024} KiB)")
    return entry


def kept_facts(image_id: str, pin_path: Path) -> dict[str, str] | None:
    """The facts entry of the pin already at `pin_path` when it pins this very image and
    its facts file is intact (a rebuild from the cache captures nothing again)."""
    from provisioner.image.pin import read_pin

    try:
        pin = read_pin(pin_path)
    except InputError:
        return None
    if pin.image_id != image_id or pin_facts(pin, pin_path).facts is None:
        return None
    return dict(pin.extra[FACTS_KEY])


def build_image(opts: BuildOptions, report: Reporter = quiet) -> BuildResult:
    """Build the image from the lock and the wheelhouse; write the pin for the full image.
    One build at a time on this machine (`build_lock`): another waits."""
    with build_lock(report):
        return _build_image(opts, report)


def _build_image(opts: BuildOptions, report: Reporter) -> BuildResult:
    t0 = time.monotonic()
    lock_file = opts.lock_file
    check_images_dir(opts.images_dir, lock_file.name)
    lock_text = lock_file.read_text()
    locked = parse_lock(lock_text, str(lock_file))
    base_id = _base_id(opts.base)
    wheels = ensure_wheels(
        locked,
        opts.wheelhouse,
        offline=opts.offline,
        indexes=index_urls(lock_text),
        report=report,
    )
    requirements_sha = lock_sha256(lock_text)
    report(f"building {opts.tag} from {opts.base} with {len(wheels)} locked wheels")
    with tempfile.TemporaryFile(prefix="provisioner-context-") as ctx:
        write_context(opts.images_dir, wheels, ctx, lock_file.name)
        ctx.seek(0)
        args = {"BASE": opts.base, "REQUIREMENTS_SHA256": requirements_sha}
        image_id = _docker_build(ctx, opts, args, report)
    if opts.target is not None:
        return BuildResult(None, image_id, time.monotonic() - t0, None)
    report("reading versions inside the image through a login shell")
    versions, cuda = read_versions(image_id)
    if opts.variant == "cuda" and not cuda:
        raise OperationError(
            f"the CUDA image's torch ({versions.torch}) has no CUDA",
            f"make {lock_file.name} again (`provisioner image lock --cuda`): pip picked a "
            "CPU build of torch",
        )
    extra: dict[str, Any] = {"variant": "cuda", "cuda": cuda} if opts.variant == "cuda" else {}
    facts = capture_facts(image_id, login_capture_command(), opts.lock_path, report)
    if facts:
        extra[FACTS_KEY] = facts
    attrs = client().api.inspect_image(image_id)
    layers = tuple(str(d) for d in attrs["RootFS"]["Layers"])
    pin = Pin(
        image_id=image_id,
        layers=layers,
        base_image=opts.base,
        base_image_id=base_id,
        requirements_sha256=requirements_sha,
        versions=versions,
        size=int(attrs["Size"]),
        layer_sizes=layer_sizes_from_history(client().api.history(image_id), layers),
        built_at=datetime.now(UTC).isoformat(timespec="seconds"),
        tag=opts.tag,
        extra=extra,
    )
    write_pin(pin, opts.lock_path)
    return BuildResult(pin, image_id, time.monotonic() - t0, opts.lock_path)
