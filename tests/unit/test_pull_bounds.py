"""Issue 27 (5, 6): what comes home is bounded, and nothing on the head follows a link.

The head-side commands run here with bash against a temporary directory standing for the
cluster's results root, with links planted as a hostile job would plant them; the
receiver and the bounded readers run against real files.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from provisioner.errors import InputError, ReceiveError, TooLargeError
from provisioner.jobs.control import progress_command, record_status_command
from provisioner.jobs.resume import head_copy_command
from provisioner.jobs.tables import read_json, read_rows
from provisioner.jobs.upload import sendable_files
from provisioner.node import layout
from provisioner.remote.pull import (
    LINK_EXIT,
    PULL_MAX_BYTES,
    limits,
    list_command,
    parse_listing,
    pull_limit,
    read_command,
)
from provisioner.remote.receive import Limits, Receiver

ROOT_WORD = '"$HOME"/.provisioner/clusters/c/results'
RESULTS = layout.node_results_dir("c")


def sh(root: Path, command: str) -> subprocess.CompletedProcess[bytes]:
    shell = command.replace(ROOT_WORD, shlex.quote(str(root)))
    return subprocess.run(["bash", "-c", shell], capture_output=True, check=False)


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path]:
    """A results root with job `j` holding plain files and links to a secret outside."""
    secret_dir = tmp_path / "home" / ".ssh"
    secret_dir.mkdir(parents=True)
    (secret_dir / "id_ed25519").write_text("SECRET KEY\n")
    (secret_dir / "authorized_keys").write_text("ssh-ed25519 AAAA owner\n")
    root = tmp_path / "results"
    job = root / "j"
    (job / "sub").mkdir(parents=True)
    (job / "metrics.csv").write_text("iteration\n1\n")
    (job / "sub" / "plain.txt").write_text("plain\n")
    os.symlink(secret_dir, job / "ssh")  # a directory link
    os.symlink(secret_dir / "id_ed25519", job / "key")  # a file link
    os.symlink(secret_dir / "authorized_keys", job / "job-status.json")
    os.symlink(secret_dir, root / "evil")  # a whole job directory that is a link
    return root, secret_dir


def test_the_listing_holds_regular_files_only_and_never_enters_a_link(
    planted: tuple[Path, Path],
) -> None:
    root, secret = planted
    assert (root / "j" / "key").read_text() == "SECRET KEY\n"  # the link works: a control
    listed = sh(root, list_command(RESULTS, "j"))
    assert listed.returncode == 0, listed.stderr
    names = {f.path for f in parse_listing(listed.stdout.decode())}
    assert names == {"metrics.csv", "sub/plain.txt"}, names
    assert sh(root, list_command(RESULTS, "evil")).returncode == LINK_EXIT
    assert sh(root, list_command(RESULTS, "absent")).returncode == 3
    assert sorted(p.name for p in (root / "evil").iterdir()) == sorted(  # a control
        p.name for p in secret.iterdir()
    )


def test_a_read_is_bounded_by_the_listed_size_and_never_follows_a_link(
    planted: tuple[Path, Path],
) -> None:
    root, _ = planted
    plain = sh(root, read_command(RESULTS, "j", "sub/plain.txt", 6))
    assert (plain.returncode, plain.stdout) == (0, b"plain\n")
    cut = sh(root, read_command(RESULTS, "j", "metrics.csv", 4))
    assert (cut.returncode, cut.stdout) == (0, b"iter")  # at most the listed size
    for name in ("key", "ssh/id_ed25519", "job-status.json"):
        got = sh(root, read_command(RESULTS, "j", name, 100))
        assert got.returncode != 0 and b"SECRET" not in got.stdout, (name, got)
    through_dir = sh(root, read_command(RESULTS, "j", "ssh/id_ed25519", 100))
    assert through_dir.returncode == LINK_EXIT


def test_down_writes_the_status_without_following_a_planted_link(
    planted: tuple[Path, Path],
) -> None:
    root, secret = planted
    before = (secret / "authorized_keys").read_bytes()
    body = json.dumps({"status": "STOPPED"}).encode()
    shell = record_status_command("c", "j").replace(ROOT_WORD, shlex.quote(str(root)))
    done = subprocess.run(["bash", "-c", shell], input=body, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr
    assert (secret / "authorized_keys").read_bytes() == before
    status = root / "j" / "job-status.json"
    assert not status.is_symlink() and status.read_bytes() == body
    assert not [p for p in (root / "j").iterdir() if p.name.startswith(".tmp")]
    evil = record_status_command("c", "evil").replace(ROOT_WORD, shlex.quote(str(root)))
    refused = subprocess.run(["bash", "-c", evil], input=body, capture_output=True, check=False)
    assert refused.returncode == LINK_EXIT
    assert sorted(p.name for p in secret.iterdir()) == ["authorized_keys", "id_ed25519"]


def test_jobs_list_reads_no_progress_through_a_link(planted: tuple[Path, Path]) -> None:
    root, secret = planted
    os.symlink(secret / "id_ed25519", root / "j" / "progress.json")
    out = sh(root, progress_command("c")).stdout
    assert b"SECRET" not in out and out.split(b"\0")[0] == b"j", out
    (root / "j" / "progress.json").unlink()
    (root / "j" / "progress.json").write_text('{"iteration": 3}')
    assert b'{"iteration": 3}' in sh(root, progress_command("c")).stdout  # a control


def test_a_resume_on_the_head_copies_links_as_links(planted: tuple[Path, Path]) -> None:
    root, secret = planted
    (root / "j" / "checkpoints" / "iter-000001").mkdir(parents=True)
    (root / "j" / "checkpoints" / "iter-000001" / "state.pkl").write_bytes(b"w")
    os.symlink(secret / "id_ed25519", root / "j" / "checkpoints" / "iter-000001" / "k")
    done = sh(root, head_copy_command("c", "j", "checkpoints/iter-000001", "n"))
    assert done.returncode == 0, done.stderr
    copied = root / "n" / "resume" / "checkpoint"
    assert (copied / "state.pkl").read_bytes() == b"w"
    assert (copied / "k").is_symlink()  # a link stays a link: no secret was read
    assert sh(root, head_copy_command("c", "evil", "x", "n2")).returncode == 3


def test_the_resume_upload_leaves_out_links_and_secrets(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "state.pkl").write_bytes(b"w")
    (ckpt / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (ckpt / "notes").write_text("-----BEGIN RSA PRIVATE KEY-----\n")
    os.symlink(outside / "secret.txt", ckpt / "link.txt")
    os.symlink(outside, ckpt / "dirlink")
    going, left = sendable_files(ckpt)
    assert [p.name for p in going] == ["state.pkl"]
    assert {"id_ed25519", "notes", "link.txt"} <= set(left), left


def test_a_file_over_the_cap_or_the_free_space_is_refused_before_a_byte(tmp_path: Path) -> None:
    with Receiver(tmp_path / "in", limits=limits(1000), what="r", where="t") as rx:
        with pytest.raises(TooLargeError, match=r"big\.bin"):
            rx.add_file("big.bin", iter([b"x" * 10]), size=4 * 2**40)
        assert not (rx.staging / "big.bin").exists()
        ok = rx.add_file("ok.bin", iter([b"abc"]), size=3)  # the rest still comes
        assert ok.sha256 == hashlib.sha256(b"abc").hexdigest()
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    roomy = Limits(file_bytes=2**62, total_bytes=2**62, reserve_bytes=free)
    with (
        Receiver(tmp_path / "in2", limits=roomy, what="r", where="t") as rx,
        pytest.raises(TooLargeError, match="free"),
    ):
        rx.add_file("a.bin", iter([b"x"]), size=1)
    assert not list(tmp_path.glob(".receiving-*"))


def test_a_file_that_grows_past_its_listed_size_is_refused(tmp_path: Path) -> None:
    with Receiver(tmp_path / "in", limits=limits(10**6), what="r", where="t") as rx:
        with pytest.raises(ReceiveError, match="grew past"):
            rx.add_file("g.bin", iter([b"1234", b"5678"]), size=5)
        assert not (rx.staging / "g.bin").exists()
        rx.add_file("same.bin", iter([b"12", b"345"]), size=5)  # exactly: a control


def test_the_total_cap_is_the_setting_and_a_bad_value_says_the_fix(tmp_path: Path) -> None:
    assert pull_limit({}) == PULL_MAX_BYTES
    assert pull_limit({"PROVISIONER_PULL_MAX_BYTES": "1234"}) == 1234
    with pytest.raises(InputError) as err:
        pull_limit({"PROVISIONER_PULL_MAX_BYTES": "lots"})
    assert err.value.fix and "PROVISIONER_PULL_MAX_BYTES" in err.value.fix
    with Receiver(tmp_path / "cap", limits=limits(5), what="r", where="t") as rx:
        rx.add_file("a", iter([b"123"]), size=3)
        with pytest.raises(TooLargeError, match="in all"):
            rx.add_file("b", iter([b"123"]), size=3)


def test_tables_and_json_are_read_within_a_bound(tmp_path: Path) -> None:
    big = tmp_path / "metrics.csv"
    big.write_text("iteration,x\n" + "".join(f"{i},{i}\n" for i in range(1000)))
    rows = read_rows(big, limit=100)
    assert 0 < len(rows) < 1000 and rows[0] == {"iteration": 0.0, "x": 0.0}
    assert len(read_rows(big, max_rows=7)) == 7
    assert len(read_rows(big)) == 1000  # a control: unbounded enough for real tables
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"k": "v" * 100}))
    with pytest.raises(ValueError, match="over 50 bytes"):
        read_json(summary, limit=50)
    assert read_json(summary)["k"] == "v" * 100
    os.symlink(summary, tmp_path / "link.json")
    with pytest.raises(OSError):
        read_json(tmp_path / "link.json")
