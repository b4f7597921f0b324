"""OpenSSH's default keys as a new user has them, against a real lab sshd.

The account's home (its passwd entry, as OpenSSH reads it: tests/account_home.py) holds
~/.ssh/id_rsa and ~/.ssh/id_ed25519; only the second is authorized on one lab node; there
is no agent and the inventory names no key. `ssh` gets in; so must `provisioner doctor`.
With neither key authorized both fail, and the doctor names the keys it offered.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from tests.account_home import home_env, in_account_home
from tests.e2e.faults.lab import edited_inventory

MARK = "provisioner-e2e-default-keys"


def run_in_home(home: Path, work: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        in_account_home(home, work, argv),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env=home_env(home),
        timeout=180,
        check=False,
    )


def on_node(node: LabNode, script: str) -> str:
    rc, out = exec_rc(node.container, script)
    assert rc == 0, f"{node.name}: {script!r} failed: {out}"
    return out


@pytest.fixture
def new_user(lab: LabInfo, tmp_path: Path) -> Iterator[tuple[Path, LabNode, Path]]:
    """(the account's home, the node, an inventory of that node naming no key)."""
    node = lab.nodes[0]
    home = tmp_path / "account"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    for kind in ("rsa", "ed25519"):
        key = home / ".ssh" / f"id_{kind}"
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", MARK, "-f", str(key)], check=True
        )
    inventory = edited_inventory(lab.inventory, tmp_path / "inventory.yaml")
    document = yaml.safe_load(inventory.read_text())
    document["ssh"].pop("key", None)
    document["ssh"]["connect_timeout"] = 10
    document["head"] = {"name": node.name, "address": node.address}
    document["workers"] = []
    inventory.write_text(yaml.safe_dump(document))
    try:
        yield home, node, inventory
    finally:
        on_node(node, f"sed -i '/{MARK}/d' ~{node.user}/.ssh/authorized_keys")


def authorize(node: LabNode, public: Path) -> None:
    line = public.read_text().strip()
    on_node(node, f"echo '{line}' >> ~{node.user}/.ssh/authorized_keys")


def ssh_gets_in(lab: LabInfo, home: Path, work: Path, node: LabNode) -> bool:
    argv = ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
    argv += ["-o", f"UserKnownHostsFile={lab.known_hosts}", "-o", "StrictHostKeyChecking=yes"]
    done = run_in_home(home, work, [*argv, f"{node.user}@{node.address}", "echo in"])
    return done.returncode == 0 and done.stdout.strip() == "in"


def doctor(home: Path, work: Path, inventory: Path) -> tuple[int, dict[str, Any]]:
    argv = [sys.executable, "-m", "provisioner", "doctor", "-i", str(inventory), "--json"]
    done = run_in_home(home, work, argv)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def ssh_errors(report: dict[str, Any], host: str) -> list[dict[str, Any]]:
    return [
        f
        for f in report["findings"]
        if f["host"] == host and f["check"].startswith("ssh.") and f["severity"] == "error"
    ]


def test_the_doctor_gets_in_with_the_second_default_key(
    lab: LabInfo, new_user: tuple[Path, LabNode, Path], tmp_path: Path
) -> None:
    home, node, inventory = new_user
    authorize(node, home / ".ssh" / "id_ed25519.pub")
    assert ssh_gets_in(lab, home, tmp_path, node)  # the reference: OpenSSH gets in
    _, report = doctor(home, tmp_path, inventory)
    assert not ssh_errors(report, node.name), report
    checks = {f["check"] for f in report["findings"] if f["host"] == node.name}
    assert checks - {c for c in checks if c.startswith("ssh.")}, report  # the facts came back


def test_with_neither_key_authorized_the_doctor_names_the_keys_offered(
    lab: LabInfo, new_user: tuple[Path, LabNode, Path], tmp_path: Path
) -> None:
    home, node, inventory = new_user
    assert not ssh_gets_in(lab, home, tmp_path, node)  # OpenSSH is refused as well
    code, report = doctor(home, tmp_path, inventory)
    (error,) = ssh_errors(report, node.name)
    assert code == 1 and error["check"] == "ssh.auth", report
    for name in ("id_rsa", "id_ed25519"):
        assert str(home / ".ssh" / name) in error["message"], error
    assert "ssh-copy-id" in error["fix"] and "ssh -v" not in error["fix"], error
