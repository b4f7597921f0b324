"""Helpers for end-to-end tests: reach lab nodes through the real OpenSSH client."""

from __future__ import annotations

import subprocess

from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo


def ssh_args(lab: LabInfo, node: LabNode, *extra: str) -> list[str]:
    """OpenSSH client arguments with STRICT host key checking against the lab's known_hosts."""
    return [
        "ssh",
        "-i",
        str(lab.key),
        "-o",
        f"UserKnownHostsFile={lab.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        *extra,
        f"{node.user}@{node.address}",
    ]


def ssh(
    lab: LabInfo, node: LabNode, command: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a command on a lab node through the real OpenSSH client."""
    return subprocess.run(
        [*ssh_args(lab, node), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
