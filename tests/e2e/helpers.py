"""Helpers for end-to-end tests: reach lab nodes through the real OpenSSH client."""

from __future__ import annotations

import subprocess

from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo


def ssh_args(lab: LabInfo, node: LabNode, *extra: str) -> list[str]:
    """OpenSSH client arguments with STRICT host key checking against the lab's known_hosts."""
    return lab.ssh_command(node, *extra)


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
