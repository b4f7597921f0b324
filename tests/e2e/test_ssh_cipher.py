"""The cipher a session negotiates with real OpenSSH servers, and the bytes it carries.

provisioner's SSH client prefers AES-GCM (one AEAD pass per packet, instead of AES-CTR
and a separate HMAC): every lab node's sshd (Debian 12's and 13's OpenSSH) is reached over
it, and a push-sized stream arrives whole. A second sshd on a node, started with only the
CTR ciphers, is still reached (over CTR) with the same bytes arriving; OpenSSH's own
client asking that sshd for GCM is refused (the positive control that it offers none).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.inventory import load_inventory
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.remote import Pool
from provisioner.remote.session import Session
from tests.e2e.faults.lab import edited_inventory

pytestmark = pytest.mark.e2e

PORT = 2299  # the second sshd's, on the head node only, for this module
PIDFILE = "/run/provisioner-test-sshd-ctr.pid"
MIB = 1 << 20


def send_and_hash(session: Session, mib: int) -> tuple[str, str]:
    """Stream `mib` MiB of random bytes into `sha256sum` on the node: (sent, node's)."""
    digest = hashlib.sha256()
    block = os.urandom(MIB)

    def chunks() -> Iterator[bytes]:
        for i in range(mib):
            piece = block[i:] + block[:i]  # no two MiB alike
            digest.update(piece)
            yield piece

    result = session.run_streaming_stdin("sha256sum", chunks(), timeout=120)
    assert result.exit_code == 0, result.stderr
    return digest.hexdigest(), result.stdout.split()[0]


def negotiated(session: Session) -> tuple[str, str]:
    transport = session._transport()  # the live paramiko transport: what was agreed
    return transport.local_cipher, transport.remote_cipher


def test_every_node_is_reached_over_aes_gcm_and_the_bytes_arrive(lab: LabInfo) -> None:
    inv = load_inventory(lab.inventory)
    with Pool(inv) as pool:
        for node in inv.nodes:
            session = pool.session(node)
            assert negotiated(session) == ("aes128-gcm@openssh.com",) * 2, node.name
            sent, arrived = send_and_hash(session, 64)
            assert arrived == sent, node.name


@pytest.fixture
def ctr_only_sshd(lab: LabInfo, tmp_path: Path) -> Iterator[Path]:
    """A second sshd on the head (port PORT) offering only AES-CTR, and an inventory of
    the head alone reaching it, with the head's host key recorded for that port. The
    sshd is stopped (by its pid file) when the test ends."""
    head = lab.nodes[0]
    rc, out = exec_rc(
        head.container,
        f"/usr/sbin/sshd -p {PORT} -o Ciphers=aes128-ctr,aes256-ctr -o PidFile={PIDFILE}",
    )
    assert rc == 0, out
    try:
        known = tmp_path / "known_hosts"
        lines = [
            line.split(None, 1)[1]
            for line in lab.known_hosts.read_text().splitlines()
            if line.split(None, 1)[0] == head.address
        ]
        assert lines, "the lab's known_hosts names the head"
        known.write_text("".join(f"[{head.address}]:{PORT} {rest}\n" for rest in lines))
        yield edited_inventory(
            lab.inventory,
            tmp_path / "inventory.yaml",
            ssh={"port": PORT, "known_hosts": str(known)},
            workers=[],
        )
    finally:
        exec_rc(head.container, f"[ -f {PIDFILE} ] && kill $(cat {PIDFILE}); rm -f {PIDFILE}")


def test_a_node_whose_sshd_offers_no_gcm_is_reached_over_ctr(
    lab: LabInfo, ctr_only_sshd: Path
) -> None:
    head = lab.nodes[0]
    ask_gcm = subprocess.run(
        [
            *lab.ssh_command(head, "-p", str(PORT), "-c", "aes128-gcm@openssh.com"),
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ask_gcm.returncode != 0 and "no matching cipher" in ask_gcm.stderr, ask_gcm.stderr
    inv = load_inventory(ctr_only_sshd)
    with Pool(inv) as pool:
        session = pool.session(inv.head)
        assert negotiated(session) == ("aes128-ctr",) * 2
        sent, arrived = send_and_hash(session, 16)
        assert arrived == sent
