"""The local Docker engine that runs the lab: a client with clear errors and a CLI runner."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from provisioner.errors import LabError
from provisioner.local import docker_client as client
from provisioner.local import need

__all__ = ["client", "docker_cli", "exec_in", "exec_rc", "need"]


def docker_cli(args: Sequence[str], *, timeout: float = 120, input_: bytes | None = None) -> str:
    """Run the docker CLI (for what the SDK does not stream well); raise LabError on failure."""
    cmd = [need("docker", "docker.io"), *args]
    try:
        proc = subprocess.run(cmd, input=input_, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(
            f"`docker {' '.join(args[:3])}` did not finish in {timeout:.0f}s",
            "check that the docker daemon answers (`docker info`) and is not overloaded, "
            "then run it again",
        ) from exc
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise LabError(
            f"`docker {' '.join(args[:3])}` failed: {' | '.join(tail)}",
            "read docker's error above; `provisioner lab status` shows the lab, `provisioner "
            "lab up` makes it again",
        )
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
