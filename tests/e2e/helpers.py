"""Helpers for end-to-end tests: reach lab nodes through the real OpenSSH client."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
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


@contextmanager
def ssh_only_through_a_jump(lab: LabInfo, node: LabNode) -> Iterator[None]:
    """`node` drops SSH from the control machine (the lab network's gateway, as the node
    sees it); other nodes still reach it. The rule goes when the block ends."""
    rc, gateway = exec_rc(node.container, "ip route | awk '/^default/ {print $3; exit}'")
    assert rc == 0 and gateway.strip(), gateway
    rule = f"INPUT -p tcp --dport 22 -s {gateway.strip()} -j DROP"
    rc, said = exec_rc(node.container, f"iptables -I {rule}")
    assert rc == 0, said
    try:
        direct = ssh(lab, node, "true")
        assert direct.returncode != 0, f"{node.name} still answers SSH from the control machine"
        yield
    finally:
        exec_rc(
            node.container, f"while iptables -C {rule} 2>/dev/null; do iptables -D {rule}; done"
        )


def jumped_inventory(source: Path, target: Path, lab: LabInfo, node: LabNode) -> Path:
    """A copy of the inventory `source` (paths made absolute) where `node` is reached
    through the head (`jump: USER@HEAD:22`), with a short connect timeout."""
    document = yaml.safe_load(source.read_text())
    base = source.parent
    document["ssh"].update(
        key=str((base / document["ssh"]["key"]).resolve()),
        known_hosts=str((base / document["ssh"]["known_hosts"]).resolve()),
        connect_timeout=3,
    )
    if document.get("image", {}).get("lock"):
        document["image"]["lock"] = str((base / document["image"]["lock"]).resolve())
    head = lab.nodes[0]
    (entry,) = [w for w in document["workers"] if w["name"] == node.name]
    entry["jump"] = f"{head.user}@{head.address}:22"
    target.write_text(yaml.safe_dump(document))
    return target
