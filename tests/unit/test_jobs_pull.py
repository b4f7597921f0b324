"""Pure parts of long runs: the results listing and hashes, what is sent again (nothing
already home), safe landing of fetched files, the jobs list's progress, the live line,
and a resumed run's steps/s."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli.cluster import ray_env_lines
from provisioner.cli.jobs import duration_text, progress_text
from provisioner.errors import InputError, ReceiveError
from provisioner.jobs.control import parse_progress, progress_command
from provisioner.jobs.home import Results, capped_log, finish, tail
from provisioner.jobs.resume import (
    EXISTS_EXIT,
    find_source,
    head_copy_command,
    latest_checkpoint,
    place_command,
    stage_command,
)
from provisioner.jobs.submit import JobOutcome, lost_a_node, shows_a_lost_node
from provisioner.node import layout
from provisioner.remote.pull import (
    UNBOUNDED,
    Pulled,
    RemoteFile,
    hash_command,
    list_command,
    needed,
    parse_hashes,
    parse_listing,
)
from provisioner.remote.receive import Limits, Receiver, ensure_directory, write_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "playbooks"))

import rlrun

ROOT_WORD = '"$HOME"/.provisioner/clusters/c/results'
LIMITS = Limits(
    members=UNBOUNDED, file_bytes=UNBOUNDED, total_bytes=UNBOUNDED, compressed_bytes=UNBOUNDED
)


def results(cluster: str) -> str:
    return layout.node_results_dir(cluster)


def on(root: Path, command: str) -> str:
    """A head-side command run against `root` standing for the cluster's results root."""
    return command.replace(ROOT_WORD, shlex.quote(str(root)))


def test_listing_commands_are_quoted_and_skip_files_being_written() -> None:
    cmd = list_command(results("demo"), "ppo-1")
    assert cmd.startswith(
        'root=$(cd -P "$HOME"/.provisioner/clusters/demo/results 2>/dev/null && pwd -P) '
        '|| exit 3; cd -P "$HOME"/.provisioner/clusters/demo/results/ppo-1 2>/dev/null || exit 3'
    )
    assert "! -path '*/.tmp*'" in cmd
    hashed = hash_command(results("demo"), "ppo-1", ["a b", "c;d"])
    assert hashed.endswith("sha256sum -z -- 'a b' 'c;d'")


def test_the_listing_matches_what_find_prints(tmp_path: Path) -> None:
    job = tmp_path / "j"
    (job / "checkpoints" / "iter-000002").mkdir(parents=True)
    (job / "checkpoints" / "iter-000002" / "state.pkl").write_bytes(b"x" * 10)
    (job / "checkpoints" / ".tmp-iter-000004").mkdir()
    (job / "checkpoints" / ".tmp-iter-000004" / "half.pkl").write_bytes(b"y")
    (job / "odd name.csv").write_text("1\n")
    shell = on(tmp_path, list_command(results("c"), "j"))
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    found = {f.path: f.size for f in parse_listing(out.stdout)}
    assert found == {"checkpoints/iter-000002/state.pkl": 10, "odd name.csv": 2}
    hashed = subprocess.run(
        [
            "bash",
            "-c",
            on(tmp_path, hash_command(results("c"), "j", list(found))),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    digests = parse_hashes(hashed.stdout)
    assert digests["odd name.csv"] == hashlib.sha256(b"1\n").hexdigest()


def test_names_that_would_leave_the_results_are_never_listed() -> None:
    names = ["../../.bashrc", "/etc/passwd", "a/./b", "a//b", "ok.txt"]
    listing = "".join(f"5 1.0 {name}\x00" for name in names)
    assert [f.path for f in parse_listing(listing)] == ["ok.txt"]


def test_a_file_already_home_with_the_same_size_and_mtime_is_not_sent_again(
    tmp_path: Path,
) -> None:
    (tmp_path / "m.csv").write_bytes(b"12345")
    manifest = {"m.csv": {"size": 5, "mtime": "1.5", "sha256": "x"}}
    same = RemoteFile("m.csv", 5, "1.5")
    assert needed([same], manifest, tmp_path) == []
    assert needed([RemoteFile("m.csv", 5, "2.0")], manifest, tmp_path) != []
    (tmp_path / "m.csv").write_bytes(b"1234")  # cut short here: fetched again
    assert needed([same], manifest, tmp_path) == [same]


def test_received_files_are_placed_privately_and_never_through_a_link(tmp_path: Path) -> None:
    root = tmp_path / "home"
    ensure_directory(root)
    with Receiver(root / ".incoming", limits=LIMITS, what="results", where="test") as rx:
        got = rx.add_file("a/b/c.bin", [b"ab", b"cd"], size=4)
        assert (got.size, got.sha256) == (4, hashlib.sha256(b"abcd").hexdigest())
        rx.place(got.name, root)
    assert (root / "a" / "b" / "c.bin").read_bytes() == b"abcd"
    assert (root / "a" / "b" / "c.bin").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in root.iterdir()) == ["a"]  # the staging directory is gone
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, root / "link")
    with Receiver(root / ".incoming", limits=LIMITS, what="results", where="test") as rx:
        got = rx.add_file("link/x.txt", [b"x"])
        with pytest.raises(ReceiveError):
            rx.place(got.name, root)
    with pytest.raises(ReceiveError):
        write_file(root, "link/y.txt", b"y")
    with pytest.raises(ReceiveError):
        write_file(root, "../y.txt", b"y")
    assert list(outside.iterdir()) == []


def test_unreadable_result_files_are_named_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "metrics.csv").write_bytes(b"env_steps\xff,x\n\xfe\x00,1\n")
    (tmp_path / "summary.json").write_bytes(b"[1,")
    found = finish(tmp_path, None)
    assert found.summary is None and found.refused is None
    assert any(u.startswith("summary.json") for u in found.unreadable)


def test_what_did_not_come_home_is_said_a_line_each(tmp_path: Path) -> None:
    """`problems()` (what a retry reports of the lost attempt's second pull): unreadable
    files, files the pull refused, why nothing came; none for a whole pull (the control)."""
    (tmp_path / "summary.json").write_bytes(b"[1,")
    found = finish(tmp_path, None)
    found.pulled = Pulled(tmp_path, refused=["big.bin: 70 GiB, over the 64 GiB cap"])
    said = found.problems()
    assert said[0].startswith("could not read summary.json"), said
    assert said[1:] == ["refused: big.bin: 70 GiB, over the 64 GiB cap"], said
    nothing = Results(tmp_path / "none", missing="the head holds no results directory")
    assert nothing.problems() == ["the head holds no results directory"]
    (tmp_path / "summary.json").write_text('{"iterations": 2}')
    assert finish(tmp_path, None).problems() == []


def test_the_log_kept_home_is_capped_and_split_on_newlines_only() -> None:
    assert capped_log(["a\rb", "c"]) == "a\rb\nc\n"
    kept = capped_log(["x" * 50, "end"], limit=10)
    assert kept.endswith("\nxxxxx\nend\n") and "first 45 characters were left out" in kept
    assert tail("1\n2\r3\n4\n", 2) == ["2\r3", "4"]


def test_progress_figures_that_are_not_numbers_show_as_dashes() -> None:
    assert progress_text({"iteration": "[red]x", "env_steps": 5}) == (
        "iter -  steps 5/-  return -  - steps/s  ETA -"
    )


def test_progress_of_every_job_on_the_head(tmp_path: Path) -> None:
    (tmp_path / "job-1").mkdir()
    (tmp_path / "job-1" / "progress.json").write_text('{"iteration": 4}')
    (tmp_path / "job-2").mkdir()
    shell = progress_command("c").replace('"$HOME"/.provisioner/clusters/c/results', str(tmp_path))
    out = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True)
    assert parse_progress(out.stdout) == {"job-1": {"iteration": 4}, "job-2": None}


def test_the_live_line_shows_iteration_budget_return_rate_and_eta() -> None:
    figures = {
        "iteration": 12,
        "env_steps": 24000,
        "max_env_steps": 200000,
        "episode_return_mean": 85.31,
        "env_steps_per_s": 1234.4,
        "eta_s": 142.6,
    }
    assert progress_text(figures) == (
        "iter 12  steps 24000/200000 (12%)  return 85.3  1234 steps/s  ETA 2m23s"
    )
    assert duration_text(None) == "-" and duration_text(7300) == "2h01m"


def test_a_resumed_runs_steps_per_second_counts_only_its_own_steps_and_time() -> None:
    # 10000 lifetime steps, 9000 of them before the resume, 10 s since: 100 steps/s,
    # not 10000 / 10; the time column goes on from the earlier run's 50 s.
    clock = rlrun.Clock(started=100.0, steps_at_start=9000, time_before=50.0)
    result = {"training_iteration": 9, "num_env_steps_sampled_lifetime": 10000}
    row = rlrun.row_of(result, clock, now=110.0)
    assert (row.iteration, row.env_steps, row.time_s, row.env_steps_per_s) == (
        9,
        10000,
        60.0,
        100.0,
    )
    progress = rlrun.progress_of(row, rlrun.Budget(500, 20000, 1000))
    assert progress["eta_s"] == 100.0 and progress["episode_return_mean"] is None


def test_the_latest_complete_checkpoint_is_the_one_resumed(tmp_path: Path) -> None:
    for name in ("iter-000002", "iter-000010", ".tmp-iter-000012"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "iter-000010"
    source = find_source(str(tmp_path), tmp_path / "unused")
    assert source.checkpoint.name == "iter-000010" and source.results == tmp_path
    with pytest.raises(InputError, match="no checkpoint of job j9"):
        find_source("j9", tmp_path)
    with pytest.raises(InputError, match="neither a directory nor a job id"):
        find_source("../nope", tmp_path)


def test_the_head_seeds_a_resumed_job_from_its_own_copy(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "checkpoints" / "iter-000004").mkdir(parents=True)
    (old / "checkpoints" / "iter-000004" / "state.pkl").write_bytes(b"w")
    (old / "tensorboard").mkdir()
    (old / "tensorboard" / "events.out.tfevents.1").write_bytes(b"e")
    (old / "metrics.csv").write_text("iteration\n1\n")
    cmd = head_copy_command("c", "old", "checkpoints/iter-000004", "new").replace(
        '"$HOME"/.provisioner/clusters/c/results', str(tmp_path)
    )
    subprocess.run(["bash", "-c", cmd], check=True)
    new = tmp_path / "new"
    assert (new / "resume" / "checkpoint" / "state.pkl").read_bytes() == b"w"
    assert (new / "tensorboard" / "events.out.tfevents.1").is_file()
    assert (new / "metrics.csv").read_text() == "iteration\n1\n"
    missing = head_copy_command("c", "gone", "checkpoints/iter-000004", "n2").replace(
        '"$HOME"/.provisioner/clusters/c/results', str(tmp_path)
    )
    assert subprocess.run(["bash", "-c", missing], check=False).returncode == 3


def test_the_resume_uploads_commands_are_quoted_and_rename_without_following_a_link() -> None:
    stage = stage_command("c", "j 1/resume", "check point", ["check point", "check point/a;b"])
    assert stage.startswith(f"mkdir -p {layout.node_results_dir('c', 'j 1/resume')} || exit 1; ")
    assert f"[ ! -e 'check point' ] && [ ! -L 'check point' ] || exit {EXISTS_EXIT}; " in stage
    assert "stage=$(mktemp -d .tmp-upload.XXXXXXXX) || exit 1; " in stage
    assert stage.endswith(
        "cd -P \"$stage\" && mkdir -p -- 'check point' 'check point/a;b' && "
        'printf "%s\\n" "$stage"'
    )
    place = place_command("c", "j 1/resume", ".tmp-upload.ab", "check point")
    assert place.endswith(
        "[ -d .tmp-upload.ab ] && [ ! -L .tmp-upload.ab ] || exit 4; "
        f"[ ! -e 'check point' ] && [ ! -L 'check point' ] || exit {EXISTS_EXIT}; "
        "mv -T -- '.tmp-upload.ab/check point' 'check point' && rmdir -- .tmp-upload.ab"
    )


def test_a_link_planted_at_the_uploads_destination_is_refused_not_followed(
    tmp_path: Path,
) -> None:
    """The upload's staging and its rename, run by bash on a results root here: the files
    go into a fresh private folder; a link planted at the destination meanwhile is
    refused and its target left alone; without it, the checkpoint lands in place."""

    def sh(command: str) -> subprocess.CompletedProcess[str]:
        shell = command.replace(ROOT_WORD, shlex.quote(str(tmp_path / "results")))
        return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=False)

    outside = tmp_path / "outside"
    outside.mkdir()
    for job in ("j1", "j2"):
        made = sh(stage_command("c", f"{job}/resume", "checkpoint", ["checkpoint/sub"]))
        assert made.returncode == 0, made.stderr
        stage = tmp_path / "results" / job / "resume" / made.stdout.strip()
        assert stage.name.startswith(".tmp-upload.") and stage.stat().st_mode & 0o777 == 0o700
        (stage / "checkpoint" / "sub" / "state.pkl").write_bytes(b"weights")
        if job == "j1":  # planted after the stage was made: refused, never followed
            os.symlink(outside, stage.parent / "checkpoint")
        placed = sh(place_command("c", f"{job}/resume", stage.name, "checkpoint"))
        if job == "j1":
            assert placed.returncode == EXISTS_EXIT
            assert list(outside.iterdir()) == []
            assert (stage.parent / "checkpoint").is_symlink()
        else:  # the positive control: the same steps land the checkpoint where it is read
            assert placed.returncode == 0, placed.stderr
            got = tmp_path / "results" / "j2" / "resume" / "checkpoint" / "sub" / "state.pkl"
            assert got.read_bytes() == b"weights"
            assert [p.name for p in got.parents[2].iterdir()] == ["checkpoint"]
    # a destination there before the upload is refused before anything is staged
    again = sh(stage_command("c", "j2/resume", "checkpoint", ["checkpoint"]))
    assert again.returncode == EXISTS_EXIT


def test_tunnel_prints_what_rays_own_cli_needs(tmp_path: Path) -> None:
    lines = ray_env_lines("http://127.0.0.1:4321", tmp_path / "auth token")
    assert lines == [
        "export RAY_ADDRESS=http://127.0.0.1:4321",
        "export RAY_AUTH_MODE=token",
        f"export RAY_AUTH_TOKEN_PATH='{tmp_path}/auth token'",
    ]


def test_only_a_lost_node_or_head_is_worth_a_retry(tmp_path: Path) -> None:
    def outcome(status: str, *tail: str) -> JobOutcome:
        return JobOutcome("j", status, Results(tmp_path), log_tail=list(tail))

    died = "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing"
    assert lost_a_node(outcome("FAILED", "Traceback (most recent call last):", died))
    assert lost_a_node(outcome("UNKNOWN"))  # the head went away while we followed
    assert not lost_a_node(outcome("FAILED", "ValueError: reward is NaN"))  # the playbook's
    assert not lost_a_node(outcome("STOPPED", died))  # stopped on purpose
    # the error above the 20 lines of a dead raylet's log that Ray prints after it
    far = JobOutcome("j", "FAILED", Results(tmp_path), log_tail=["[raylet] ..."] * 20)
    assert not lost_a_node(far)
    assert lost_a_node(dataclasses.replace(far, lost_node=True))
    assert shows_a_lost_node("(raylet) Raylet is terminated. Termination is unexpected.")


def test_a_retry_record_gives_back_the_spec_a_reattaching_client_resubmits(
    tmp_path: Path,
) -> None:
    from provisioner.jobs.spec import make_spec
    from provisioner.jobs.submit import remember, retry_spec, spec_attempts

    playbook = tmp_path / "play.py"
    playbook.write_text("print(1)\n")
    spec = dataclasses.replace(
        make_spec(playbook, ["--lr", "1e-3", "two words"], job_id="play-r1"),
        env={"PROVISIONER_RETRIES": "3"},
        run="play",
        attempt=2,
        resumed_from="play",
    )
    earlier = [{"attempt": 1, "job_id": "play", "status": "FAILED"}]
    remember(tmp_path / "results", spec, 3, earlier)
    got, retries = retry_spec(tmp_path / "results", "play-r1")
    assert got == spec and retries == 3
    assert spec_attempts(tmp_path / "results", got) == earlier
    with pytest.raises(InputError, match="no retry record of job other"):
        retry_spec(tmp_path / "results", "other")
