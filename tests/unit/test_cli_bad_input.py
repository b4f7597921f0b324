"""Bad input, run as a user would (issue 47, items 7, 11, 12): the real `provisioner`
command in a subprocess, one case a row. Each case checks the exit code, one message that
says what went wrong, where and the fix, no traceback, one JSON document on stdout under
--json, and that nothing was left half-written.

No node is needed: the inventories name loopback addresses whose SSH port is held by a
socket that never listens (every connection refused). A full and a read-only filesystem
are small tmpfs mounts made for the test (the suite runs as root, as the lab needs)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from provisioner.image.pin import Pin, Versions, write_pin

PROVISIONER = Path(sys.executable).parent / "provisioner"
PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"

INVENTORY = """\
cluster: badinput
runtime: host
head: {{name: h1, address: 127.0.0.1}}
workers:
  - {{name: w1, address: 127.0.0.2}}
ssh:
  user: lab
  port: {port}
  key: {key}
"""


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str


@dataclass
class World:
    """What the cases run against: the inventory, its folders, the mounts."""

    tmp: Path
    inventory: Path
    state: Path
    full: Path  # a tmpfs with no space left
    readonly: Path  # a read-only tmpfs
    pin: Path  # an image pin (for `sagemaker render`)
    env: dict[str, str] = field(default_factory=dict)

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> Ran:
        done = subprocess.run(
            [str(PROVISIONER), *argv],
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            cwd=self.tmp,
            timeout=120,
        )
        return Ran(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class Case:
    name: str
    argv: Callable[[World], list[str]]
    code: int
    says: tuple[str, ...]  # what and where, in the one message
    fix: str  # in the fix line
    env: Callable[[World], dict[str, str]] = lambda w: {}
    untouched: Callable[[World], None] = lambda w: None  # nothing half-written
    json: bool = False


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _no_logs_kept(w: World) -> None:
    logs = w.state / "clusters" / "badinput" / "logs"
    assert not logs.exists() or _files(logs) == [], _files(logs)


CASES = [
    Case(
        "render -o in a missing folder",
        lambda w: ["render", "-i", str(w.inventory), "-o", str(w.tmp / "nope" / "c.yaml")],
        2,
        ("nope/c.yaml: cannot write this file", "the folder", "does not exist"),
        "mkdir -p",
        untouched=lambda w: _absent(w.tmp / "nope"),
    ),
    Case(
        "render -o on a full filesystem",
        lambda w: ["render", "-i", str(w.inventory), "-o", str(w.full / "cluster.yaml")],
        2,
        ("full/cluster.yaml: cannot write this file", "no space left"),
        "free space there",
        untouched=lambda w: _only(w.full, ["filler"]),
    ),
    Case(
        "render -o on a read-only filesystem",
        lambda w: ["render", "-i", str(w.inventory), "-o", str(w.readonly / "cluster.yaml")],
        2,
        ("readonly/cluster.yaml: cannot write this file", "read-only"),
        "filesystem you can write to",
        untouched=lambda w: _only(w.readonly, []),
    ),
    Case(
        "render -o a folder",
        lambda w: ["render", "-i", str(w.inventory), "-o", str(w.tmp)],
        2,
        ("cannot write this file: it is a folder",),
        "name a file",
    ),
    Case(
        "render -o on a full filesystem, --json",
        lambda w: ["render", "-i", str(w.inventory), "-o", str(w.full / "c.yaml"), "--json"],
        2,
        ("full/c.yaml: cannot write this file", "no space left"),
        "free space there",
        untouched=lambda w: _only(w.full, ["filler"]),
        json=True,
    ),
    Case(
        "sagemaker render -o on a read-only filesystem",
        lambda w: [
            "sagemaker",
            "render",
            str(PLAYBOOK),
            "--lock",
            str(w.pin),
            "-o",
            str(w.readonly / "job"),
        ],
        2,
        ("readonly/job: cannot write the job's files here", "read-only"),
        "filesystem you can write to",
        untouched=lambda w: _only(w.readonly, []),
    ),
    Case(
        "sagemaker render -o on a full filesystem, --json",
        lambda w: [
            "sagemaker",
            "render",
            str(PLAYBOOK),
            "--lock",
            str(w.pin),
            "-o",
            str(w.full / "job"),
            "--json",
        ],
        2,
        ("full/job: cannot write the job's files here", "no space left", "render it again"),
        "free space there",
        json=True,
    ),
    Case(
        "logs -o on a read-only filesystem",
        lambda w: ["logs", "-i", str(w.inventory), "-o", str(w.readonly / "logs")],
        2,
        ("readonly/logs: cannot make this folder", "read-only"),
        "filesystem you can write to",
        untouched=lambda w: _only(w.readonly, []),
    ),
    Case(
        "up with a read-only state directory",
        lambda w: ["up", "-i", str(w.inventory), "--no-doctor"],
        2,
        ("readonly/state", "cannot make this folder", "read-only"),
        "PROVISIONER_STATE_DIR",
        env=lambda w: {"PROVISIONER_STATE_DIR": str(w.readonly / "state")},
    ),
    Case(
        "up --timeout -5 --json (a usage error)",
        lambda w: ["up", "-i", str(w.inventory), "--timeout", "-5", "--json"],
        2,
        ("Invalid value for '--timeout'",),
        "provisioner up --help",
        json=True,
    ),
    Case(
        "status --no-such-flag --json (a usage error)",
        lambda w: ["status", "-i", str(w.inventory), "--no-such-flag", "--json"],
        2,
        ("No such option: --no-such-flag",),
        "provisioner status --help",
        json=True,
    ),
    Case(
        "up --push nowhere --json (refused before the command's output)",
        lambda w: ["up", "-i", str(w.inventory), "--push", "nowhere", "--json"],
        2,
        ("error: --push: 'nowhere' is not a push mode",),
        "use one of",
        json=True,
    ),
    Case(
        "tunnel --port -1",
        lambda w: ["tunnel", "-i", str(w.inventory), "--port", "-1"],
        2,
        ("Invalid value for '--port'",),
        "provisioner tunnel --help",
    ),
    Case(
        "tunnel --port 70000 --json",
        lambda w: ["tunnel", "-i", str(w.inventory), "--port", "70000", "--json"],
        2,
        ("Invalid value for '--port'",),
        "provisioner tunnel --help",
        json=True,
    ),
    Case(
        "PROVISIONER_SSH_CONFIG naming a missing file",
        lambda w: ["status", "-i", str(w.inventory)],
        2,
        ("error: PROVISIONER_SSH_CONFIG: names ", "no-such-config, which is not a file"),
        "unset it",
        env=lambda w: {"PROVISIONER_SSH_CONFIG": str(w.tmp / "no-such-config")},
    ),
    Case(
        "a missing key file, at the line and field that name it",
        lambda w: ["status", "-i", str(_with_key(w, "missing-key"))],
        2,
        ("keyless.yaml:9: ssh.key: key file", "missing-key does not exist"),
        "ssh-keygen",
    ),
    Case(
        "submit --resume of a job unknown here (head refusing)",
        lambda w: ["submit", "-i", str(w.inventory), "--resume", "raysubmit_NOSUCH", str(PLAYBOOK)],
        1,
        ("--resume raysubmit_NOSUCH: no such job is known here", "nor could the head be asked"),
        "check the job id",
        untouched=lambda w: _absent(w.tmp / "results" / "raysubmit_NOSUCH"),
    ),
    Case(
        "down on a cluster never up (nodes refusing)",
        lambda w: ["down", "-i", str(w.inventory)],
        1,
        ("h1: connection refused by lab@127.0.0.1", "w1: connection refused by lab@127.0.0.2"),
        "",
        untouched=_no_logs_kept,
    ),
    Case(
        "logs of nodes refusing",
        lambda w: ["logs", "-i", str(w.inventory), "-o", str(w.tmp / "logs-here")],
        1,
        ("h1: connection refused by lab@127.0.0.1", "w1: connection refused by lab@127.0.0.2"),
        "",
        untouched=lambda w: _absent(w.tmp / "logs-here"),
    ),
]


def _absent(path: Path) -> None:
    assert not path.exists(), _files(path) if path.is_dir() else path


def _only(folder: Path, names: list[str]) -> None:
    assert _files(folder) == names  # no temporary file, no 0-byte file left


def _with_key(w: World, key: str) -> Path:
    path = w.tmp / "keyless.yaml"
    path.write_text(w.inventory.read_text().replace("key: id_ed25519", f"key: {key}"))
    return path


@pytest.fixture
def refusing_port() -> Iterator[int]:
    """A port bound and never listened on: every connection to it is refused."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        yield held.getsockname()[1]


def _mount(target: Path, *options: str) -> None:
    target.mkdir()
    options_ = ",".join(options)
    subprocess.run(["mount", "-t", "tmpfs", "-o", options_, "tmpfs", str(target)], check=True)


@pytest.fixture
def world(tmp_path: Path, refusing_port: int) -> Iterator[World]:
    key = tmp_path / "id_ed25519"
    key.write_text("not a real key\n")
    key.chmod(0o600)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(INVENTORY.format(port=refusing_port, key="id_ed25519"))
    full, readonly = tmp_path / "full", tmp_path / "readonly"
    _mount(full, "size=64k")
    try:
        with (full / "filler").open("wb") as f, pytest.raises(OSError):
            f.write(b"\0" * 128 * 1024)  # no space left
        _mount(readonly, "size=64k")
        subprocess.run(["mount", "-o", "remount,ro", str(readonly)], check=True)
        env = {**os.environ, "PROVISIONER_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "200"}
        pin = tmp_path / "image.lock.json"
        write_pin(
            Pin(
                image_id="sha256:" + "c" * 64,
                layers=("sha256:" + "d" * 64,),
                base_image="debian",
                base_image_id="sha256:" + "e" * 64,
                requirements_sha256="f" * 64,
                versions=Versions("3.11", "2.60.0", "2.13.0", "1.0"),
                size=1,
            ),
            pin,
        )
        yield World(tmp_path, inventory, tmp_path / "state", full, readonly, pin, env)
    finally:
        for mount in (readonly, full):
            subprocess.run(["umount", str(mount)], check=False)


def check(case: Case, ran: Ran) -> None:
    assert ran.code == case.code, (ran.code, ran.stderr[-2000:])
    err = ran.stderr
    assert "Traceback" not in err and "please report it" not in err, err
    errors = [line for line in err.splitlines() if line.lower().startswith("error:")]
    if case.code == 2 or case.json:
        assert len(errors) == 1, err  # one message
        message = errors[0]
    else:  # an operation that failed on its nodes: one line each, no doubled node names
        message = err + ran.stdout
        assert "h1: h1:" not in message and "w1: w1:" not in message, message
    for part in case.says:
        assert part in message, (part, message)
    assert case.fix in err + ran.stdout, err
    if case.fix and errors:
        fixes = [line for line in err.splitlines() if line.startswith(("fix:", "Try "))]
        assert fixes, err
    if case.json:
        doc = json.loads(ran.stdout)  # one JSON document, nothing else on stdout
        assert doc["ok"] is False and doc["error"]["exit_code"] == case.code, doc
        assert doc["error"]["message"] and doc["error"]["where"] and doc["error"]["fix"], doc


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, world: World) -> None:
    ran = world.run(case.argv(world), case.env(world))
    check(case, ran)
    case.untouched(world)


def test_positive_control_the_same_render_writes_where_it_can(world: World) -> None:
    """The inventory and the command of the render cases work: written whole, mode as a
    plain write's, no temporary file beside it; a second render replaces it."""
    target = world.tmp / "ok" / "cluster.yaml"
    target.parent.mkdir()
    for _ in range(2):
        ran = world.run(["render", "-i", str(world.inventory), "-o", str(target)])
        assert ran.code == 0, ran.stderr
        assert target.read_text().startswith("# Ray cluster launcher config")
        assert _files(target.parent) == ["cluster.yaml"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_down_json_names_each_node_once_and_no_logs_folder(world: World) -> None:
    """`down --json` of the refusing nodes: each node's error keyed by its name and not
    prefixed with it again; no logs folder named where none was kept."""
    ran = world.run(["down", "-i", str(world.inventory), "--json"])
    doc = json.loads(ran.stdout)
    assert ran.code == 1
    assert doc["errors"]["h1"].startswith("connection refused by lab@127.0.0.1"), doc
    assert doc["logs"]["directory"] is None and doc["logs"]["nodes"] == [], doc
