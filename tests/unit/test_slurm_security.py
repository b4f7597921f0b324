"""SLURM against other users and a hostile login node (pure parts, and the sbatch
script's private directory run by a real local bash).

- node names and addresses from the login node are host names, checked where they are
  parsed (`parse_nodes`, `check_nodelist`) and where they are read back (`slurm.json`,
  the logs folder);
- only this cluster's job (name, user, comment) is reused or cancelled;
- the sbatch script's directories are made by `mktemp -d`, private and checked; its
  comment and arguments cannot turn into commands.

The end-to-end counterparts, on the SLURM lab, are in tests/e2e/test_slurm_security.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from provisioner.errors import InputError, InventoryError, ReceiveError
from provisioner.inventory.allocation import (
    AllocatedNode,
    Allocation,
    read_allocation,
    write_allocation,
)
from provisioner.inventory.models import Slurm
from provisioner.runtime import runtime_for
from provisioner.slurm import commands
from provisioner.slurm.sbatch import (
    JOB_DIR_MAX,
    SbatchJob,
    check_job_text,
    comment_text,
    private_dir_function,
    render_sbatch,
)
from tests.unit.test_slurm import SLURM_INV, load


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not checked here\n")
    os.chmod(path, 0o600)
    return path


HOSTILE_NAMES = (
    "../../x",
    "..",
    ".",
    "/etc/cron.d/x",
    "a/b",
    "n-1\n",
    "n\x1b[2J",
    "-oProxyCommand=x",
    ".hidden",
    "a b",
    "x" * 64,
    "",
)
HOSTILE_ADDRESSES = ("../x", "/x", "10.0.0.1;id", "-oProxyCommand=x", "a\nb", ".x", "", "x" * 254)


def test_node_names_and_addresses_from_the_login_node_are_host_names() -> None:
    assert AllocatedNode("n-1.ib_0", "10.0.0.1").name == "n-1.ib_0"  # positive controls
    assert AllocatedNode("n1", "fd00::5").address == "fd00::5"
    assert AllocatedNode("n1", "n1.hpc.example").address == "n1.hpc.example"
    for name in HOSTILE_NAMES:
        with pytest.raises(InputError, match="not a host name") as info:
            AllocatedNode(name, "10.0.0.1")
        assert info.value.exit_code == 2 and "login node" in (info.value.fix or "")
    for address in HOSTILE_ADDRESSES:
        with pytest.raises(InputError, match="neither an IP address nor a DNS name"):
            AllocatedNode("n-1", address)


def test_a_hostile_answer_of_scontrol_is_refused_whole() -> None:
    good = "n-1 n-1 10.0.0.1\nn-2 n-2 10.0.0.2\n"
    assert [n.name for n in commands.parse_nodes(good)] == ["n-1", "n-2"]
    for bad in ("../../x n-2 10.0.0.2", "/root/.config/autostart n 10.0.0.2", "n-2 n-2 ../x"):
        with pytest.raises(InputError):
            commands.parse_nodes(good + bad + "\n")
    assert commands.check_nodelist("n-[1-3],gpu.ib_4", 5) == "n-[1-3],gpu.ib_4"
    for bad in ("n-1;id", "../x", "n-1\n", "n/1", "$(id)"):
        with pytest.raises(InputError, match="not a list of host names"):
            commands.check_nodelist(bad, 5)
    assert commands.parse_job_id("42;cluster\n") == 42
    assert commands.parse_job_id("²") is None and commands.parse_job_id("4 2") is None


def test_a_tampered_record_is_refused_where_it_is_read_back(
    tmp_path: Path,
    key: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = load(tmp_path, SLURM_INV)
    write_allocation(inv, Allocation(42, (AllocatedNode("n-1", "10.1.0.21"),), "ab12"))  # type: ignore[arg-type]
    assert read_allocation(inv) == Allocation(  # type: ignore[arg-type]
        42, (AllocatedNode("n-1", "10.1.0.21"),), "ab12"
    )  # positive control: a record of plain names reads back, with its tag
    record = inv.state_dir / "slurm.json"  # type: ignore[attr-defined]
    for name, address in (("../../x", "10.1.0.21"), ("n-1", "/etc"), ("/abs", "10.1.0.21")):
        data = {"job_id": 42, "tag": "ab12", "nodes": [{"name": name, "address": address}]}
        record.write_text(json.dumps(data))
        with pytest.raises(InputError, match="recorded SLURM allocation") as info:
            read_allocation(inv)  # type: ignore[arg-type]
        assert info.value.where == str(record) and "scancel 42" in (info.value.fix or "")
        with pytest.raises(InputError):  # every command that loads the inventory: exit 2
            load(tmp_path, SLURM_INV)
    record.write_text(json.dumps({"job_id": 42, "tag": "x'y", "nodes": []}))
    assert read_allocation(inv) is None  # type: ignore[arg-type]


def test_logs_never_land_outside_their_folder(tmp_path: Path) -> None:
    from provisioner.cluster.logs import node_logs_dir

    logs = tmp_path / "logs"
    logs.mkdir()
    assert node_logs_dir(logs, "n-1") == logs.resolve() / "n-1"  # positive control
    assert node_logs_dir(logs, "fd00::5") == logs.resolve() / "fd00::5"
    outside = tmp_path / "outside"
    outside.mkdir()
    (logs / "planted").symlink_to(outside)  # a link already in the logs folder
    for name in ("../outside", "/tmp/x", "a/b", ".", "..", "./n-1", "planted", "n\n1"):
        with pytest.raises(ReceiveError):
            node_logs_dir(logs, name)
    assert list(outside.iterdir()) == []


def test_collect_refuses_a_node_name_before_running_anything(tmp_path: Path) -> None:
    from dataclasses import replace

    from provisioner.cluster.logs import collect
    from tests.unit.test_security import inventory

    inv = inventory(tmp_path, {}, {})
    bad = replace(inv.workers[0], name="../escape")
    inv = replace(inv, workers=(bad,))
    ran: list[str] = []

    class Pool:  # records what would run; the head's answer is an empty archive
        def session(self, node: object) -> object:
            class Session:
                def run(self, command: str, **_: object) -> object:
                    ran.append(command)

                    class Done:
                        stdout, dropped = "", False

                        def check(self) -> None:
                            pass

                    return Done()

            return Session()

    runtime = runtime_for(inv)
    out = collect(inv, Pool(), directory=tmp_path / "logs", runtime=runtime)  # type: ignore[arg-type]
    assert out.nodes == ["h"] and "../escape" in out.errors, out
    assert "refused the logs of node" in out.errors["../escape"]
    assert len(ran) == 1 and not (tmp_path / "escape").exists()


def me(tag: str = "ab12") -> commands.Owner:
    return commands.Owner("provisioner-c1", tag)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("RUNNING|None|n-1|9:00|30:00|provisioner-c2|alice|provisioner-ab12", "another name"),
        ("RUNNING|None|n-1|9:00|30:00|provisioner-c1|bob|provisioner-ab12", "another user"),
        ("RUNNING|None|n-1|9:00|30:00|provisioner-c1|alice|provisioner-ff00", "another tag"),
        ("RUNNING|None|n-1|9:00|30:00|train|alice|", "the user's own training job"),
    ],
)
def test_a_job_id_that_names_another_job_is_not_ours(line: str, why: str) -> None:
    ours = "RUNNING|None|n-1|9:00|30:00|provisioner-c1|alice|provisioner-ab12"
    assert commands.parse_queue(f"alice\n==\n{ours}\n==\n", 9, me()).state == "RUNNING"
    state = commands.parse_queue(f"alice\n==\n{line}\n==\n", 9, me())
    assert state.gone and state.other, why
    assert "another job" in state.describe()


def test_a_record_without_tag_matches_name_and_user_only() -> None:
    old = "RUNNING|None|n-1|9:00|30:00|provisioner-c1|alice|"
    assert commands.parse_queue(f"alice\n==\n{old}\n==\n", 9, me("")).state == "RUNNING"
    assert commands.parse_queue(f"bob\n==\n{old}\n==\n", 9, me("")).gone
    assert commands.parse_queue(f"\n==\n{old}\n==\n", 9, me("")).gone  # no user: not ours
    banner = f"Welcome to the cluster\nalice\n==\n{old}\n==\n"  # a login shell's banner first
    assert commands.parse_queue(banner, 9, me("")).state == "RUNNING"


class Login:
    """A login node that answers squeue with a given job line (logic only: the real
    slurmctld runs these commands in the e2e)."""

    def __init__(self, line: str) -> None:
        self.line = line
        self.ran: list[str] = []

    def run(self, command: str, **_: object) -> object:
        self.ran.append(command)
        stdout = ""
        if command.startswith("id -un"):
            stdout = f"alice\n==\n{self.line}\n==\n"
            if any(c.startswith("scancel") for c in self.ran):
                stdout = "alice\n==\n\n==\n"

        class Done:
            ok = True

        done = Done()
        done.stdout = stdout  # type: ignore[attr-defined]
        return done


def test_cancel_leaves_a_job_that_is_not_ours(
    tmp_path: Path,
    key: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from provisioner.slurm.allocate import cancel

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = load(tmp_path, SLURM_INV.replace("cluster: hpc", "cluster: c1"))
    ours = Login("RUNNING|None|n-1|9:00|30:00|provisioner-c1|alice|provisioner-ab12")
    assert cancel(ours, inv, 9, "ab12", wait_s=5)  # type: ignore[arg-type]
    assert [c.split()[0] for c in ours.ran] == ["id", "scancel", "id"]  # positive control
    theirs = Login("RUNNING|None|n-1|9:00|30:00|train|alice|")
    assert cancel(theirs, inv, 9, "ab12", wait_s=5)  # type: ignore[arg-type]
    assert not any(c.startswith("scancel") for c in theirs.ran)


def test_extra_sbatch_args_cannot_take_the_jobs_name_or_comment(
    tmp_path: Path,
    key: Path,
) -> None:
    for arg in ("--job-name=x", "--comment=provisioner-ab12", "--comment"):
        text = SLURM_INV.replace("[--qos=debug, --constraint=ib]", f"[{arg}]")
        with pytest.raises(InventoryError, match="set by provisioner"):
            load(tmp_path, text)
    for text in (
        SLURM_INV.replace("partition: gpu", 'partition: "gpu\\n"'),
        SLURM_INV.replace("[--qos=debug, --constraint=ib]", '["--qos=debug\\n"]'),
    ):
        with pytest.raises(InventoryError):  # `$` would have let the newline through
            load(tmp_path, text)


def sbatch_job(**changes: object) -> SbatchJob:
    base = SbatchJob(name="hpc", slurm=Slurm(nodes=2), playbook="p.py", args=(), payload="QUJD")
    return SbatchJob(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_a_newline_in_an_argument_never_becomes_a_command(tmp_path: Path) -> None:
    for bad in ("a\ntouch /tmp/pwned", "a\rb", "\x1b[2J", "a\x00b"):
        with pytest.raises(InputError, match="control characters") as info:
            render_sbatch(sbatch_job(args=("--name", bad)))
        assert info.value.exit_code == 2
        with pytest.raises(InputError):
            check_job_text(sbatch_job(playbook=f"p{bad}.py"))
    # a name that reaches only the comment is shown escaped there
    text = render_sbatch(sbatch_job(source="inv\ntouch /tmp/pwned.yaml", args=("it's",)))
    assert "# Rendered by `provisioner render --slurm` from inv\\ntouch /tmp/pwned.yaml:" in text
    assert not any(line.startswith("touch") for line in text.splitlines())
    assert "#   p.py 'it'\"'\"'s'\n" in text  # positive control: quoting as before
    script = tmp_path / "t.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert comment_text("a\tb\x7f") == "a\\tb\\x7f"


def run_private_dir(tmpdir: str | None, job_id: str = "4242") -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id}
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    return subprocess.run(
        ["bash", "-c", f"set -eu\n{private_dir_function()}\nprivate_dir"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


@pytest.fixture
def made() -> list[Path]:
    """Directories the tests' private_dir made (removed afterwards, /tmp's included)."""
    paths: list[Path] = []
    yield paths
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()


def test_the_job_directory_is_fresh_private_and_never_a_known_path(
    tmp_path: Path, made: list[Path]
) -> None:
    short = Path("/tmp") / f"t{os.getpid() % 100}"  # a $TMPDIR short enough for Ray's sockets
    short.mkdir(mode=0o700, exist_ok=True)
    try:
        first, second = (run_private_dir(str(short)) for _ in range(2))
        for done in (first, second):
            assert done.returncode == 0, done.stderr
            path = Path(done.stdout.strip())
            made.append(path)
            assert path.parent == short and path.name.startswith("rayjob-4242.")
            st = path.lstat()
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            assert stat.S_IMODE(st.st_mode) == 0o700
        assert first.stdout != second.stdout  # a fresh name every time, never reused
        assert len(first.stdout.strip()) <= JOB_DIR_MAX
    finally:
        for path in made[:]:
            path.rmdir()
            made.remove(path)
        short.rmdir()


@pytest.mark.parametrize("kind", ["others-write", "too-long", "relative", "link"])
def test_an_unsafe_or_unfit_tmpdir_falls_back_to_tmp(
    tmp_path: Path, made: list[Path], kind: str
) -> None:
    base = Path("/tmp") / f"u{os.getpid() % 100}"
    target = tmp_path / "elsewhere"
    target.mkdir()
    if kind == "link":
        base.symlink_to(target)
    elif kind != "relative":
        base.mkdir()
    try:
        if kind == "others-write":
            base.chmod(0o777)  # writable by all, not sticky: another user could swap names
        tmpdir = {"too-long": str(tmp_path), "relative": "tmp"}.get(kind, str(base))
        done = run_private_dir(tmpdir)
        assert done.returncode == 0, done.stderr
        path = Path(done.stdout.strip())
        made.append(path)
        assert path.parent == Path("/tmp") and stat.S_IMODE(path.stat().st_mode) == 0o700
        assert list(target.iterdir()) == [] and (kind == "relative" or not any(base.iterdir()))
    finally:
        if base.is_symlink():
            base.unlink()
        elif base.is_dir():
            base.rmdir()
