"""The image commands' input errors and output, run in-process; the star's command builders."""

from __future__ import annotations

import io
import os
import shlex
import stat
import subprocess
from pathlib import Path

import paramiko
import pytest

from provisioner.image.pin import pin_to_dict, write_pin
from provisioner.inventory import load_inventory
from provisioner.runtime.docker.star import (
    RELAY_COMMAND,
    add_key_command,
    authorized_line,
    make_relay_key,
    parse_added,
    relay_command,
    remove_key_command,
)
from tests.cli import cli
from tests.unit.test_image_lock import make_pin

INVENTORY = """cluster: t
ssh: {user: lab, port: 2222}
head: {name: h, address: 10.250.9.10}
workers: [{name: w, address: 10.250.9.11}]
"""


def test_show_prints_the_pin_as_json(tmp_path: Path) -> None:
    pin = make_pin()
    write_pin(pin, tmp_path / "image.lock.json")
    result = cli("image", "show", str(tmp_path / "image.lock.json"), "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json() == pin_to_dict(pin)


def test_show_of_a_missing_pin_is_exit_2_with_a_fix(tmp_path: Path) -> None:
    result = cli("image", "show", str(tmp_path / "nope.json"))
    assert result.exit_code == 2
    assert "no image pin" in result.stderr and "fix:" in result.stderr
    assert "Traceback" not in result.stderr


def test_push_without_a_pin_in_the_inventory_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    result = cli("image", "push", "-i", str(tmp_path / "inv.yaml"))
    assert result.exit_code == 2
    assert "names no image pin" in result.stderr and "image build" in result.stderr


def test_an_error_under_json_still_writes_one_json_document(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    result = cli("image", "push", "-i", str(tmp_path / "inv.yaml"), "--json")
    assert result.exit_code == 2
    doc = result.json()  # stdout is exactly one JSON document
    assert doc["ok"] is False and doc["error"]["exit_code"] == 2
    assert "names no image pin" in doc["error"]["message"] and doc["error"]["fix"]
    assert "names no image pin" in result.stderr  # the human lines stay on stderr
    missing = cli("status", "-i", str(tmp_path / "nope.yaml"), "--json")
    assert missing.exit_code == 2 and missing.json()["error"]["kind"] == "InventoryError"
    plain = cli("image", "push", "-i", str(tmp_path / "inv.yaml"))
    assert plain.exit_code == 2 and plain.stdout == ""  # without --json: nothing on stdout


def test_build_with_an_incomplete_images_dir_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    result = cli("image", "build", "--base", "x:y", "--images-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "requirements.lock is missing" in result.stderr


def test_relay_key_is_a_usable_openssh_key_restricted_to_the_head() -> None:
    key = make_relay_key()
    loaded = paramiko.Ed25519Key.from_private_key(io.StringIO(key.private_openssh.decode()))
    assert key.public_line.split()[1] == loaded.get_base64()
    line = authorized_line(key, "10.250.9.10", "20260101120000Z")
    quoted = RELAY_COMMAND.replace('"', '\\"')
    assert line.startswith(
        f'from="10.250.9.10",restrict,command="{quoted}",expiry-time="20260101120000Z" ssh-ed25519 '
    )
    assert line.endswith(key.comment)


USER_KEY = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIUser user@laptop"


def _sh(command: str, home: Path, limit_file_blocks: int | None = None) -> tuple[int, str]:
    """Run a builder's command with a real local shell, HOME pointing at `home`."""
    prefix = f"ulimit -f {limit_file_blocks}; " if limit_file_blocks is not None else ""
    done = subprocess.run(
        ["bash", "-c", prefix + command],
        env={"HOME": str(home), "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout + done.stderr


def _add_then_remove(home: Path, before: bytes | None) -> tuple[bytes, bytes, str]:
    keys = home / ".ssh" / "authorized_keys"
    if before is not None:
        keys.parent.mkdir(parents=True, exist_ok=True)
        keys.write_bytes(before)
    key = make_relay_key()
    code, said = _sh(add_key_command(key, "10.250.9.10", 900), home)
    assert code == 0, said
    added = parse_added(said, key, "10.250.9.10")
    assert added is not None
    during = keys.read_bytes()
    code, removed = _sh(remove_key_command(key, added), home)
    assert code == 0, removed
    return during, keys.read_bytes(), removed


@pytest.mark.parametrize(
    "before",
    [USER_KEY, USER_KEY + b"\n", b"", USER_KEY + b"\n# no newline after this comment"],
)
def test_relay_key_goes_in_on_its_own_line_and_leaves_the_file_as_it_was(
    tmp_path: Path, before: bytes
) -> None:
    during, after, removed = _add_then_remove(tmp_path, before)
    assert after == before  # byte for byte, a missing final newline included
    assert removed.strip() == "relay-key-removed exact"
    lines = during.split(b"\n")
    assert lines[-1] == b""
    assert lines[-2].startswith(b'from="10.250.9.10",restrict,command="sh -c ')
    if before:
        assert before.rstrip(b"\n").split(b"\n")[-1] in lines[:-2]  # the user's key intact
    assert not list(tmp_path.glob(".ssh/*tmp*"))


def test_relay_key_expiry_is_in_the_future_by_the_workers_clock(tmp_path: Path) -> None:
    import datetime

    key = make_relay_key()
    _, said = _sh(add_key_command(key, "10.0.0.1", 900), tmp_path)
    added = parse_added(said, key, "10.0.0.1")
    assert added is not None
    expiry = added.line.split('expiry-time="')[1][:14]
    when = datetime.datetime.strptime(expiry, "%Y%m%d%H%M%S").replace(tzinfo=datetime.UTC)
    left = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert 800 < left <= 901  # a bound, not a timing target


def test_relay_key_removal_after_the_file_changed_drops_only_the_key(tmp_path: Path) -> None:
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_bytes(USER_KEY)
    keys.chmod(0o644)
    key = make_relay_key()
    _, said = _sh(add_key_command(key, "10.0.0.1", 900), tmp_path)
    added = parse_added(said, key, "10.0.0.1")
    with keys.open("ab") as f:
        f.write(b"ssh-rsa AAAAlater added@meanwhile\n")
    code, out = _sh(remove_key_command(key, added), tmp_path)
    assert (code, out.strip()) == (0, "relay-key-removed line")
    assert keys.read_bytes() == USER_KEY + b"\nssh-rsa AAAAlater added@meanwhile\n"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o644  # the file's mode is kept
    # unknown appended bytes (the add's answer was lost): removed by the key's own line
    _, said = _sh(add_key_command(key, "10.0.0.1", 900), tmp_path)
    code, out = _sh(remove_key_command(key, None), tmp_path)
    assert (code, out.strip()) == (0, "relay-key-removed line")
    assert key.comment.encode() not in keys.read_bytes()
    code, out = _sh(remove_key_command(key, None), tmp_path)
    assert (code, out.strip()) == (0, "relay-key-absent")


def test_relay_key_removal_that_cannot_write_fails_loudly_and_keeps_the_file(
    tmp_path: Path,
) -> None:
    keys = tmp_path / ".ssh" / "authorized_keys"
    keys.parent.mkdir()
    keys.write_bytes(USER_KEY)
    key = make_relay_key()
    _, said = _sh(add_key_command(key, "10.0.0.1", 900), tmp_path)
    during = keys.read_bytes()
    # no room for the rewritten file (as on a full disk): non-zero, the file untouched
    code, _ = _sh(remove_key_command(key, parse_added(said, key, "10.0.0.1")), tmp_path, 0)
    assert code != 0
    assert keys.read_bytes() == during
    assert not list(tmp_path.glob(".ssh/*tmp*"))
    # the same for the add: nothing half-written
    other = make_relay_key()
    code, _ = _sh(add_key_command(other, "10.0.0.1", 900), tmp_path, 0)
    assert code != 0 and keys.read_bytes() == during


def test_relay_key_through_a_symlinked_authorized_keys_keeps_the_link(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(USER_KEY)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "authorized_keys").symlink_to(tmp_path / "real")
    _, after, _ = _add_then_remove(tmp_path, None)
    assert (tmp_path / ".ssh" / "authorized_keys").is_symlink()
    assert after == USER_KEY


def test_relay_command_checks_host_keys_and_quotes_everything(tmp_path: Path) -> None:
    (tmp_path / "inv.yaml").write_text(INVENTORY)
    inv = load_inventory(tmp_path / "inv.yaml")
    pin = make_pin()
    outer = shlex.split(relay_command(pin, inv.workers[0], "/tmp/k ey", "/tmp/known"))
    assert outer[:2] == ["bash", "-c"] and len(outer) == 3
    cmd = outer[2]
    assert cmd.startswith("set -o pipefail; docker save " + pin.image_id + " | ssh ")
    assert "'/tmp/k ey'" in cmd
    assert "StrictHostKeyChecking=yes" in cmd and "UserKnownHostsFile=/tmp/known" in cmd
    assert "ConnectTimeout=10 " in cmd  # OpenSSH takes whole seconds only
    assert "-p 2222" in cmd and cmd.endswith("lab@10.250.9.11 'docker load'")
