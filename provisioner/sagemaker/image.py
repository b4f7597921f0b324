"""The SageMaker training image: the pinned image plus the `train` entry point.

A thin variant of the pin (images/image.lock.json): `FROM` the pinned image, this
package's `container/` copied in, `/usr/local/bin/train` and `CMD ["train"]` (SageMaker runs
`docker run IMAGE train`; the SDK's local mode runs the image's command). Its tag is its own
pin: `provisioner/ray-sagemaker:<digest>`, the digest of the base image's ID and of the files
added, so a changed pin or entry point is a new tag and the same ones are built once.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from dataclasses import dataclass
from pathlib import Path

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError
from provisioner.image.pin import Pin
from provisioner.local import docker_client as client

REPOSITORY = "provisioner/ray-sagemaker"
PACKAGE = "smcontainer"  # the container/ folder's name inside the image
SITE = "/opt/provisioner-sagemaker"
LABEL_BASE = "org.provisioner.base-image-id"
TRAIN = f'#!/bin/sh\nexec /opt/ray/bin/python3 -m {PACKAGE}.train "$@"\n'


@dataclass(frozen=True)
class TrainingImage:
    tag: str
    image_id: str
    base_image_id: str
    built: bool  # False: it was already on this machine


def dockerfile(base: str, base_id: str) -> str:
    """The variant's Dockerfile (pure)."""
    return (
        f"FROM {base}\n"
        f"COPY {PACKAGE}/ {SITE}/{PACKAGE}/\n"
        "COPY train /usr/local/bin/train\n"
        f"ENV PYTHONPATH={SITE}\n"
        f'LABEL org.provisioner.image="ray-sagemaker" {LABEL_BASE}="{base_id}"\n'
        'CMD ["train"]\n'
    )


def context_files(base: str, base_id: str) -> dict[str, bytes]:
    """Every file of the build context, by name in it."""
    here = Path(__file__).resolve().parent / "container"
    files = {
        f"{PACKAGE}/{p.name}": p.read_bytes() for p in sorted(here.glob("*.py")) if p.is_file()
    }
    files["train"] = TRAIN.encode()
    files["Dockerfile"] = dockerfile(base, base_id).encode()
    return files


def tag_for(base_id: str, files: dict[str, bytes]) -> str:
    """`provisioner/ray-sagemaker:<12 hex>` of the base image's ID and the added files."""
    h = hashlib.sha256(base_id.encode())
    for name in sorted(files):
        h.update(b"\0" + name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return f"{REPOSITORY}:{h.hexdigest()[:12]}"


def _tar(files: dict[str, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name == "train" else 0o644
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def ensure_image(pin: Pin, report: Reporter = quiet) -> TrainingImage:
    """The variant of the pinned image, built here if this machine lacks it."""
    from docker.errors import APIError, BuildError, ImageNotFound

    docker = client()
    try:
        base = docker.images.get(pin.tag)
    except ImageNotFound:
        base = None
    if base is None or base.id != pin.image_id:
        raise InputError(
            f"the pinned image {pin.tag} ({pin.short_id()}) is not on this machine",
            "run `provisioner image build` (it builds the image and writes its pin)",
        )
    files = context_files(pin.tag, pin.image_id)
    tag = tag_for(pin.image_id, files)
    try:
        have = docker.images.get(tag)
        return TrainingImage(tag, str(have.id), pin.image_id, built=False)
    except ImageNotFound:
        pass
    report(f"building the SageMaker training image {tag} on the pin {pin.short_id()}")
    try:
        image, _ = docker.images.build(
            fileobj=_tar(files), custom_context=True, tag=tag, rm=True, pull=False
        )
    except (BuildError, APIError) as e:
        raise OperationError(f"building {tag} failed: {e}", "see `docker build` output") from e
    return TrainingImage(tag, str(image.id), pin.image_id, built=True)
