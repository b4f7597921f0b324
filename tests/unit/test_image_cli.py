"""The image commands' input errors and output, run in-process; relay's command builders."""

from __future__ import annotations

import io
import shlex
from pathlib import Path

import paramiko

from provisioner.image.lock import pin_to_dict, write_pin
from provisioner.image.relay import (
    add_key_command,
    authorized_line,
    make_relay_key,
    relay_command,
    remove_key_command,
)
from provisioner.inventory import load_inventory
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
    line = authorized_line(key, "10.250.9.10")
    assert line.startswith('from="10.250.9.10",restrict ssh-ed25519 ')
    assert line.endswith(key.comment)
    assert shlex.quote(line) in add_key_command(line)
    assert shlex.quote(f" {key.comment}$") in remove_key_command(key.comment)


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
