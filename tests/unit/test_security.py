"""Security of the pure parts: hostile text through the command builders (run by a real
local shell whose `docker`/`ray` print the words they get), and the token file's mode.

The end-to-end counterparts, on the lab's nodes, are in tests/e2e/test_security.py.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner.cluster import render
from provisioner.errors import InputError
from provisioner.inventory import Inventory, Node, RayPorts, SSHSettings
from provisioner.node import token
from provisioner.remote.commands import masked
from provisioner.runtime.docker import runtime as docker
from tests.unit.inventories import docker_runtime

SHIM = "docker() { printf '%s\\0' \"$@\"; }; ray() { printf '%s\\0' \"$@\"; }; mkdir() { :; }; "
# Text a shell would act on, mixed with ordinary characters (no NUL: argv cannot hold it).
HOSTILE = st.text(
    alphabet=st.sampled_from(list("$`;&|<>()[]{}'\"\\\n\t *?!#~=-,.:/abcXYZ019")),
    min_size=1,
    max_size=60,
)


def inventory(tmp: Path, labels: dict[str, str], resources: dict[str, float]) -> Inventory:
    ssh = SSHSettings(
        user="lab",
        port=22,
        key=tmp / "id",
        known_hosts=(),
        host_key_policy="strict",
        jump=None,
        connect_timeout=5,
    )
    head = Node("h", "10.0.0.1", "head", ssh, {}, {})
    worker = Node("w", "10.0.0.2", "worker", ssh, resources, labels)
    return Inventory(
        path=tmp / "inv.yaml",
        cluster="c",
        head=head,
        workers=(worker,),
        ports=RayPorts(),
        image_lock=None,
        shm_size=None,
        object_store_memory=None,
    )


def words(command: str, cwd: Path) -> list[str]:
    """What a POSIX shell passes to `docker`/`ray` for `command`."""
    proc = subprocess.run(
        ["bash", "-c", SHIM + command],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"HOME": str(cwd), "PATH": os.environ["PATH"]},
        timeout=10,
        check=True,
    )
    return proc.stdout.split("\0")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=HOSTILE, key=HOSTILE)
def test_hostile_labels_and_resources_stay_one_word(tmp_path: Path, value: str, key: str) -> None:
    inv = inventory(tmp_path, {"zone": value}, {key: 1.0})
    node = inv.workers[0]
    got = words(docker.docker_run_command(inv, node, "img"), tmp_path)
    assert f"--labels=zone={value}" in got
    resources = [w for w in got if w.startswith("--resources=")]
    assert len(resources) == 1
    assert json.loads(resources[0].removeprefix("--resources=")) == {key: 1.0}
    start = render.build_config(inv, tmp_path / "t", docker_runtime(inv, "img"))[
        "worker_start_ray_commands"
    ][-1]
    assert f"--labels=zone={value}" in words(start, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the shell created a file"


def test_token_file_is_0600_whatever_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = replace(inventory(tmp_path, {}, {}), path=tmp_path / "inv.yaml")
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    old = os.umask(0)
    try:
        path = token.ensure_token(inv)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) == 64
    path.chmod(0o644)
    with pytest.raises(InputError, match="others can read it") as refused:
        token.read_token(inv)
    assert refused.value.fix == f"chmod 600 {path}"


def test_token_installed_on_a_node_is_0600_and_not_on_the_command_line(tmp_path: Path) -> None:
    secret = "s3cr3t-" + "f" * 57
    command = token.install_command("c")
    assert secret not in command
    subprocess.run(
        ["bash", "-c", f"umask 000; {command}"],
        input=secret,
        text=True,
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
        check=True,
        timeout=10,
    )
    installed = tmp_path / ".provisioner" / "clusters" / "c" / "auth_token"
    assert installed.read_text() == secret
    assert stat.S_IMODE(installed.stat().st_mode) == 0o600
    assert stat.S_IMODE(installed.parent.stat().st_mode) & 0o077 == 0


def test_masked_hides_a_secret_and_its_quoted_form() -> None:
    secret = "a'b c"
    text = f"token={secret} quoted={shlex.quote(secret)}"
    assert secret not in masked(text, [secret]) and "'a'\"'\"'b c'" not in masked(text, [secret])


def test_state_folders_are_private_and_others_keep_their_modes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.local import private_dir

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    tmp_path.chmod(0o755)
    (tmp_path / "state").mkdir(mode=0o755)
    private_dir(tmp_path / "state" / "clusters" / "c" / "logs")
    modes = {
        p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in tmp_path.rglob("*")
    }
    assert set(modes.values()) == {0o700}, modes
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755
    private_dir(tmp_path / "elsewhere" / "logs")  # a user's -o DIR: left as the umask says
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "elsewhere").stat().st_mode) == 0o777 & ~umask


def test_node_and_job_text_cannot_drive_the_terminal() -> None:
    import io

    from rich.table import Table

    from provisioner.console import Output

    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    hostile = "[/tmp/x] [bold]x[/] \x1b]0;title\x07\x1b[2J\r\x9b31m\u202eevil"
    out.say(hostile)  # a job line
    out.progress(f"node-1: {hostile}")  # a node's progress line, rich markup on
    table = Table("cell")
    table.add_row(hostile)
    out.out.print(table)
    shown = out.stdout.getvalue() + out.stderr.getvalue()  # type: ignore[attr-defined]
    assert not any(c in shown for c in "\x1b\x07\r\x9b\u202e")
    assert shown.count("[/tmp/x] [bold]x[/]") == 3  # shown as written, not interpreted
    assert "\\x1b]0;title\\x07" in shown


def test_triage_passes_over_names_too_long_for_this_filesystem(tmp_path: Path) -> None:
    from provisioner.cluster.logs import triage_dir

    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / "raylet.out").write_text("OSError: [Errno 98] Address in use\n")
    fd = os.open(tmp_path / "node-1", os.O_RDONLY)
    try:  # a tree deeper than PATH_MAX, made relative to a descriptor
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            child = os.open("d" * 250, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("deep.log", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    found = triage_dir(tmp_path)
    assert [(f.node, f.file, f.pattern) for f in found] == [
        ("node-1", "raylet.out", "address-in-use")
    ]
