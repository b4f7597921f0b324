"""`image build` as an ordinary user: a non-root uid in the docker group builds the
cluster image from a base image already on this machine and gets its pin, with --base
and without it (then from the Debian base built here before; never debootstrap, which
needs root)."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker.errors import ImageNotFound

from provisioner.image.pin import read_pin
from provisioner.local import docker_client

ROOT = Path(__file__).resolve().parents[2]
USER_UID = 4343  # no such user on this machine: a uid, as docker sees it
USER_BASE = "provisioner-e2e-user-base:bookworm"
USER_TAG = "provisioner-e2e-user/ray:local"


@pytest.fixture
def home() -> Iterator[Path]:
    """A home of the user's own (the pytest temp folders are root's, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="image-user-"))
    os.chown(path, USER_UID, USER_UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def as_user(home: Path, *args: str, docker_group: bool = True) -> subprocess.CompletedProcess[str]:
    """ARGS run as USER_UID, in the docker group (or in no group), HOME its own."""
    groups = str(grp.getgrnam("docker").gr_gid) if docker_group else ""
    who = [f"--reuid={USER_UID}", f"--regid={USER_UID}"]
    who += [f"--groups={groups}"] if groups else ["--clear-groups"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        ["setpriv", *who, *args], capture_output=True, text=True, env=env, cwd=home, timeout=1800
    )


def build(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return as_user(
        home, sys.executable, "-m", "provisioner", "image", "build", "--json",
        "--images-dir", str(ROOT / "images"), "--lock", str(home / "image.lock.json"),
        "--tag", USER_TAG, *extra,
    )  # fmt: skip


def test_a_user_in_the_docker_group_builds_the_image_and_gets_its_pin(
    image_pin: Path, home: Path
) -> None:
    from provisioner.image.base_image import ensure_base_image

    who = as_user(home, sys.executable, "-c", "import os; print(os.geteuid(), os.getgroups())")
    assert who.stdout.split()[0] == str(USER_UID), who.stderr  # not root
    client = docker_client()
    client.images.get(ensure_base_image(print)).tag(USER_BASE)  # a base the user has, local
    try:
        given = build(home, "--base", USER_BASE)
        assert given.returncode == 0, given.stderr[-3000:]
        doc = json.loads(given.stdout)
        assert doc["base"] == {"image": USER_BASE, "how": "given"}
        pin = read_pin(home / "image.lock.json")
        assert (home / "image.lock.json").stat().st_uid == USER_UID  # the user's own pin
        assert pin.image_id == doc["image_id"] == client.images.get(USER_TAG).id
        assert pin.image_id == read_pin(image_pin).image_id  # the same image root builds
        # without --base: the Debian base built here before, as it is; no debootstrap
        (home / "image.lock.json").unlink()
        default = build(home)
        assert default.returncode == 0, default.stderr[-3000:]
        assert json.loads(default.stdout)["base"]["how"] == "built"
        assert "debootstrap" not in default.stderr
        assert read_pin(home / "image.lock.json").image_id == pin.image_id
        # positive control for the docker group: without it the same user cannot build
        refused = as_user(
            home, sys.executable, "-m", "provisioner", "image", "build", "--base", USER_BASE,
            "--images-dir", str(ROOT / "images"), "--lock", str(home / "other.json"),
            docker_group=False,
        )  # fmt: skip
        assert refused.returncode == 2 and not (home / "other.json").exists()
        assert "docker group" in refused.stderr and "usermod -aG docker" in refused.stderr
    finally:
        for tag in (USER_BASE, USER_TAG):
            with contextlib.suppress(ImageNotFound):  # the tag only: the image stays
                client.images.remove(tag, noprune=True)
