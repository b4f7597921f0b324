"""The directory pull of provisioner/remote/pull.py as a whole: its commands run with bash
against a temporary directory standing for the node's folder (a stand-in session, no
SSH), its files received here through remote.receive. What it brings, what it sends
again (nothing already home), what it refuses by name, and that no link is followed on
either side; and the job's folder that jobs/head_folder.py names."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import ReceiveError, RemoteError
from provisioner.jobs import head_folder as job_pull
from provisioner.node import layout
from provisioner.remote import pull
from provisioner.remote.results import Result


class BashSession:
    """Runs each command with bash on this machine, as the node's SSH session would."""

    host = "head-0"

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float) -> Result:
        self.commands.append(command)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
        return Result(self.host, command, done.stdout, done.stderr, done.returncode)

    def stream(self, command: str, *, idle_timeout: float) -> Iterator[bytes]:
        self.commands.append(command)
        done = subprocess.run(["bash", "-c", command], capture_output=True)
        if done.returncode:
            raise RemoteError(self.host, f"exit {done.returncode}", kind="read")
        yield done.stdout


def source(root: Path, rel: str = "j") -> pull.Source:
    return pull.Source(
        root=shlex.quote(str(root)), rel=rel, what="the test's files", where="head-0 (test)"
    )


def run_pull(session: BashSession, root: Path, home: Path, rel: str = "j") -> pull.Pulled:
    return pull.pull(session, source(root, rel), home)  # type: ignore[arg-type]


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """The node's root folder with directory `j`: files, a file being written, links."""
    root = tmp_path / "node"
    job = root / "j"
    (job / "sub").mkdir(parents=True)
    (job / "metrics.csv").write_text("iteration\n1\n")
    (job / "sub" / "plain.txt").write_text("plain\n")
    (job / ".tmp-half.pkl").write_bytes(b"half")
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("SECRET\n")
    os.symlink(secret / "key", job / "key")
    os.symlink(secret, job / "dir")
    return root


def home_files(home: Path) -> dict[str, bytes]:
    return {
        p.relative_to(home).as_posix(): p.read_bytes()
        for p in home.rglob("*")
        if p.is_file() and not p.name.startswith(".")
    }


def test_a_pull_brings_the_regular_files_verified_and_nothing_through_a_link(
    node: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    got = run_pull(BashSession(), node, home)
    assert home_files(home) == {"metrics.csv": b"iteration\n1\n", "sub/plain.txt": b"plain\n"}
    assert sorted(got.sent) == ["metrics.csv", "sub/plain.txt"]
    assert (got.bytes_sent, got.unchanged, got.pending, got.refused) == (18, 0, [], [])
    assert not list(home.glob(".receiving-*"))  # the staging folder is gone
    assert (home / "metrics.csv").stat().st_mode & 0o777 == 0o600
    manifest = json.loads((home / pull.MANIFEST).read_text())
    assert manifest["metrics.csv"]["sha256"] == hashlib.sha256(b"iteration\n1\n").hexdigest()


def test_a_second_pull_sends_only_what_changed(node: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    run_pull(BashSession(), node, home)
    session = BashSession()
    again = run_pull(session, node, home)
    assert (again.sent, again.unchanged) == ([], 2)
    assert len(session.commands) == 1  # the listing only: nothing hashed or read
    (node / "j" / "metrics.csv").write_text("iteration\n1\n2\n")
    os.utime(node / "j" / "metrics.csv", (1, 1))
    third = run_pull(BashSession(), node, home)
    assert (third.sent, third.unchanged) == (["metrics.csv"], 1)
    assert (home / "metrics.csv").read_text() == "iteration\n1\n2\n"


def test_a_file_over_the_cap_is_refused_by_name_and_the_rest_comes(
    node: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (node / "j" / "big.bin").write_bytes(b"x" * 100)
    monkeypatch.setenv(pull.PULL_MAX_ENV, "50")
    session = BashSession()
    got = run_pull(session, node, tmp_path / "home")
    (refused,) = got.refused
    assert refused.startswith("big.bin: ") and pull.PULL_MAX_ENV in refused
    assert sorted(got.sent) == ["metrics.csv", "sub/plain.txt"]
    assert not any("big.bin" in c for c in session.commands)  # never hashed nor read


def test_a_file_that_changed_while_it_travelled_waits_for_the_next_pull(
    node: Path, tmp_path: Path
) -> None:
    class Changing(BashSession):
        def stream(self, command: str, *, idle_timeout: float) -> Iterator[bytes]:
            data = b"".join(super().stream(command, idle_timeout=idle_timeout))
            yield data.upper() if b"iteration" in data else data

    home = tmp_path / "home"
    got = run_pull(Changing(), node, home)
    assert (got.pending, got.sent) == (["metrics.csv"], ["sub/plain.txt"])
    assert not (home / "metrics.csv").exists()
    assert "metrics.csv" not in json.loads((home / pull.MANIFEST).read_text())


def test_an_absent_directory_is_not_found_and_a_linked_one_is_refused(
    node: Path, tmp_path: Path
) -> None:
    assert run_pull(BashSession(), node, tmp_path / "a", rel="absent").found is False
    os.symlink(tmp_path / "secret", node / "evil")
    with pytest.raises(ReceiveError, match="is a link"):
        run_pull(BashSession(), node, tmp_path / "e", rel="evil")
    assert not (tmp_path / "e").exists()


def test_a_link_planted_at_home_is_never_written_through(node: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, home / "sub")
    with pytest.raises(ReceiveError, match="in the way"):
        run_pull(BashSession(), node, home)
    assert list(outside.iterdir()) == []


def test_a_jobs_results_are_pulled_from_its_folder_under_the_clusters_results() -> None:
    got = job_pull.source("demo", "ppo-1", "head-0")
    assert (got.root, got.rel) == (layout.node_results_dir("demo"), "ppo-1")
    assert got.again == "provisioner jobs results ppo-1" and "ppo-1" in got.what
    assert job_pull.enter_command("demo", "ppo-1") == pull.enter_command(
        layout.node_results_dir("demo"), "ppo-1"
    )


def test_to_json_keeps_the_transfer_fields(tmp_path: Path) -> None:
    shown: dict[str, Any] = pull.Pulled(directory=tmp_path, sent=["a"], bytes_sent=3).to_json()
    assert shown["files_sent"] == ["a"] and shown["found_on_head"] is True
    assert shown["results_dir"] == str(tmp_path)
