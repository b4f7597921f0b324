"""Findings: what the doctor concluded about one node, with evidence and a fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "ok"]
_RANK = {"error": 0, "warning": 1, "ok": 2}

# The checks every runtime's doctor shares: id -> what it looks at (the fix is specific to
# each finding). Each runtime adds its own (`Judges.checks`); the whole catalogue is
# `provisioner.doctor.CATALOGUE` (`runtime.registry.catalogue()`).
SHARED_CHECKS: dict[str, str] = {
    "ssh.connect": "the node answers SSH: name resolves, port open, banner arrives in time",
    "ssh.auth": "the key is accepted for the inventory's user",
    "ssh.hostkey": "the node's host key is known and unchanged",
    "sudo": "sudo without a password, where the runtime does not answer the SSH user without it "
    "(Docker, the user outside the docker group)",
    "shell.env": "python3 and ray are the same in a login shell (Ray's launcher) and in `ssh host "
    "cmd`",
    "python.version": "the same Python version (patch level) on every node",
    "ray.version": "the same Ray version on every node",
    "rllib.version": "host mode: the same RLlib, torch and gymnasium on every node",
    "project.packages": "host mode: the project pin's packages, at its versions, on every node",
    "ray.python": "host mode: a Python with Ray and RLlib for Ray to run with (the login "
    "shell's `ray`, or the inventory's ray.python)",
    "ray.control": "host mode: this machine's Ray (it submits the jobs) has the cluster's "
    "major.minor version",
    "image.present": "the node holds the pinned image",
    "image.arch": "the node's CPU architecture matches the pinned image's",
    "ports.free": "every port Ray will use is free (and who holds a busy one)",
    "ports.worker_range": "Ray's worker port range is free",
    "ray.cluster": "another cluster's Ray on the node (named, with whether a job runs there) "
    "uses none of this cluster's ports",
    "ray.stale": "no Ray left running: raylet/gcs_server processes, Ray containers, live sessions",
    "net.reachability": "every node reaches the others on Ray's ports (temporary listeners)",
    "net.hostname": "the node's hostname does not resolve to a loopback address",
    "net.address": "the address Ray would advertise is the inventory's address",
    "resources.shm": "/dev/shm and memory fit the planned object store",
    "resources.disk": "free disk where the runtime keeps its images (Docker's root, Podman's "
    "graph root) and where Ray's temp directory lives",
    "resources.memory": "memory for Ray and its object store",
    "resources.cpu": "CPU count",
    "clock.offset": "the node's clock agrees with this machine's",
    "storage.shared": "the inventory's storage: {path: DIR} is one filesystem on every node (a "
    "file written on the head, read on every other node), and its free space",
    "tools.rsync": "rsync is installed (Ray's own `ray up` copies files with it)",
    "doctor.facts": "the fact-gathering script ran to its end",
    "gpu.driver": "a node with NVIDIA GPUs (or asked for them) has a working driver: nvidia-smi "
    "lists its GPUs",
    "gpu.toolkit": "the runtime's containers get the node's GPUs (Docker: the NVIDIA Container "
    "Toolkit's --gpus, the nvidia runtime, or CDI; Podman: CDI)",
    "gpu.count": "the inventory's GPUs (gpus: / resources.GPU) are GPUs the node has",
    "gpu.cuda": "the driver runs the pinned image's CUDA (and the image has CUDA torch at all)",
    "gpu.models": "one GPU model across the cluster",
    "gpu.container": "--gpu-deep: a container of the pinned image sees the node's GPUs",
}


@dataclass(frozen=True)
class Finding:
    check: str
    severity: Severity
    host: str
    message: str
    evidence: str = ""
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def error(check: str, host: str, message: str, evidence: str = "", fix: str = "") -> Finding:
    return Finding(check, "error", host, message, evidence, fix)


def warning(check: str, host: str, message: str, evidence: str = "", fix: str = "") -> Finding:
    return Finding(check, "warning", host, message, evidence, fix)


def ok(check: str, host: str, message: str, evidence: str = "") -> Finding:
    return Finding(check, "ok", host, message, evidence, "")


def ordered(findings: list[Finding], hosts: list[str]) -> list[Finding]:
    """Grouped by node (inventory order), errors first within each node."""
    position = {host: i for i, host in enumerate(hosts)}
    return sorted(
        findings, key=lambda f: (position.get(f.host, len(hosts)), _RANK[f.severity], f.check)
    )
