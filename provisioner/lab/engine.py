"""The local Docker engine that runs the lab: a client with clear errors and a CLI runner."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from functools import cache

import docker
from docker.errors import DockerException

from provisioner.errors import LabError, PrerequisiteError


@cache
def client() -> docker.DockerClient:
    """A docker SDK client for the local engine, or a PrerequisiteError saying how to start one."""
    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except DockerException as exc:
        raise PrerequisiteError(
            f"no Docker engine answers on this machine ({exc.__class__.__name__})",
            "install docker.io and start it: `apt-get install -y docker.io` then "
            "`dockerd >/var/log/dockerd.log 2>&1 &` (or `systemctl start docker`)",
        ) from exc
    return c


def need(tool: str, package: str) -> str:
    """Path of a host tool the lab needs, or a PrerequisiteError naming the package."""
    path = shutil.which(tool)
    if path is None:
        raise PrerequisiteError(
            f"`{tool}` is not installed on this machine", f"apt-get install -y {package}"
        )
    return path


def docker_cli(args: Sequence[str], *, timeout: float = 120, input_: bytes | None = None) -> str:
    """Run the docker CLI (for what the SDK does not stream well); raise LabError on failure."""
    cmd = [need("docker", "docker.io"), *args]
    try:
        proc = subprocess.run(cmd, input=input_, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"`docker {' '.join(args[:3])}` did not finish in {timeout:.0f}s") from exc
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise LabError(f"`docker {' '.join(args[:3])}` failed: {' | '.join(tail)}")
    return proc.stdout.decode(errors="replace")


def exec_in(container: str, script: str, *, user: str = "root", timeout: float = 60) -> str:
    """Run a shell script inside a lab node container as `user`; raise LabError on failure."""
    return docker_cli(["exec", "-u", user, container, "bash", "-c", script], timeout=timeout)


def exec_rc(container: str, script: str, *, timeout: float = 60) -> tuple[int, str]:
    """Run a shell script in a node; return (exit code, output) without raising."""
    cmd = [need("docker", "docker.io"), "exec", container, "bash", "-c", script]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
