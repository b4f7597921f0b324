"""Pure logic of `provisioner submit`: the job spec, the results shipment, the log stream."""

from __future__ import annotations

import base64
import hashlib
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.jobs import provisioner_results as pr
from provisioner.jobs.client import auth_headers, read_token
from provisioner.jobs.results import bring_home, tail
from provisioner.jobs.spec import RESULTS_ENV, job_id_for, make_spec
from provisioner.jobs.stream import LineSplitter, visible


def _playbook(tmp_path: Path, name: str = "train me.py") -> Path:
    path = tmp_path / name
    path.write_text("print('hi')\n")
    return path


def test_entrypoint_quotes_arguments_and_keeps_the_playbooks_exit_status(tmp_path: Path) -> None:
    spec = make_spec(_playbook(tmp_path), ["--x", "a b; rm -rf /"], job_id="j1")
    run, rest = spec.entrypoint().split("; rc=$?; ")
    assert shlex.split(run) == ["python3", "-u", "train me.py", "--x", "a b; rm -rf /"]
    assert rest == "python3 -m provisioner_results pack results/j1; exit $rc"


def test_runtime_env_ships_the_playbook_directory_and_the_results_packer(tmp_path: Path) -> None:
    env = make_spec(_playbook(tmp_path), job_id="j1").runtime_env()
    assert env["working_dir"] == str(tmp_path.resolve())
    assert Path(env["py_modules"][0]).name == "provisioner_results"
    assert (Path(env["py_modules"][0]) / "__main__.py").is_file()
    assert env["env_vars"][RESULTS_ENV] == "results/j1"
    assert "results/" in env["excludes"]


def test_each_job_writes_and_ships_its_own_results_directory(tmp_path: Path) -> None:
    # Ray gives jobs with the same working_dir content the same directory on the head:
    # a shared results/ would ship one job's checkpoint and metrics with the next job.
    book = _playbook(tmp_path)
    first, second = make_spec(book, job_id="a-1"), make_spec(book, job_id="a-2")
    assert first.working_dir == second.working_dir
    dirs = {s.runtime_env()["env_vars"][RESULTS_ENV] for s in (first, second)}
    assert dirs == {"results/a-1", "results/a-2"}
    for spec in (first, second):
        assert spec.entrypoint().endswith(f"pack {spec.results_dir}; exit $rc")


def test_missing_or_non_python_playbook_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        make_spec(tmp_path / "nope.py")
    other = tmp_path / "x.sh"
    other.write_text("")
    with pytest.raises(InputError, match=r"not a \.py file"):
        make_spec(other)


def test_job_id_is_readable_and_timestamped() -> None:
    assert job_id_for(Path("/a/PPO_CartPole.py"), now=0) == "ppo-cartpole-19700101-000000"


def _results_dir(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "checkpoint").mkdir(parents=True)
    (src / "checkpoint" / "state.pkl").write_bytes(bytes(range(256)) * 100)
    (src / "metrics.csv").write_text(
        "iteration,env_steps,episode_return_mean,time_s,env_steps_per_s\n"
        "1,500,20.5,1.0,500\n2,1000,35.0,2.0,500\n"
    )
    (src / "summary.json").write_text('{"episode_return_mean": 35.0}')
    return src


def test_results_survive_the_trip_through_a_noisy_log(tmp_path: Path) -> None:
    lines = list(pr.pack(_results_dir(tmp_path)))
    log = "\n".join(["iter 1", *lines[:3], "a warning in between", *lines[3:], "done"])
    found = bring_home(log, tmp_path / "home")
    assert (tmp_path / "home" / "checkpoint" / "state.pkl").read_bytes() == bytes(range(256)) * 100
    assert found.summary == {"episode_return_mean": 35.0}
    assert [p.name for p in found.plots] == ["training.png"]
    assert (tmp_path / "home" / "training.png").stat().st_size > 1000
    assert (tmp_path / "home" / "job.log").read_text() == "iter 1\na warning in between\ndone\n"


def test_corrupt_or_cut_results_are_reported_not_extracted(tmp_path: Path) -> None:
    lines = list(pr.pack(_results_dir(tmp_path)))
    with pytest.raises(pr.ResultsError, match="cut short"):
        pr.unpack(lines[:-1])
    bad = [lines[0], *(line.replace("A", "B") for line in lines[1:])]
    with pytest.raises(pr.ResultsError, match="digest"):
        pr.unpack(bad)
    found = bring_home("Traceback\nValueError: boom\n", tmp_path / "failed")
    assert found.missing == "the job log carries no results"
    assert found.files == []


def _block(files: dict[str, bytes], links: dict[str, str] | None = None) -> list[str]:
    """A results block as a hostile job could print it (any archive, its own digest)."""
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    data = buffer.getvalue()
    text = base64.b64encode(data).decode()
    return [
        f"{pr.BEGIN} {len(data)} {hashlib.sha256(data).hexdigest()}",
        f"{pr.DATA} {text}",
        pr.END,
    ]


def test_a_forged_block_cannot_write_outside_the_job_directory(tmp_path: Path) -> None:
    forged = _block({"../../.venv/lib/evil.pth": b"import os"}, {"link": "/etc"})
    found = bring_home("\n".join(["training...", *forged]), tmp_path / "results" / "j1")
    assert found.refused is not None and "climbs out" in found.refused.message
    assert found.files == []
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")} == {
        "results",
        "results/j1",
        "results/j1/job.log",
    }
    forged = _block({"ok.txt": b"1"}, {"link": "/etc"})
    found = bring_home("\n".join(forged), tmp_path / "results" / "j2")
    assert found.refused is not None and "symbolic link" in found.refused.message


def test_injected_blocks_are_refused_or_never_seen(tmp_path: Path) -> None:
    real = list(pr.pack(_results_dir(tmp_path)))
    injected = _block({"summary.json": b'{"episode_return_mean": 999}'})
    # a second block anywhere: none is taken
    with pytest.raises(pr.ResultsError, match="more than one results block"):
        pr.unpack(pr.split_lines("\n".join([*injected, "noise", *real])))
    # hidden behind a carriage return or a record separator: not a results line at all
    for sep in ("\r", "\x1e", "\x1c", "\u2028"):
        log = "\n".join([*(f"progress{sep}{line}" for line in injected), *real])
        assert pr.split_lines(log)[0].startswith("progress")
        found = bring_home(log, tmp_path / f"home{ord(sep)}")
        assert found.summary == {"episode_return_mean": 35.0}, sep


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ([f"{pr.BEGIN} 12", f"{pr.DATA} AAAA", pr.END], "bad results header"),
        ([f"{pr.BEGIN} x {'0' * 64}", f"{pr.DATA} AAAA", pr.END], "bad results header"),
        ([f"{pr.BEGIN} 3 {'0' * 64}", f"{pr.DATA} !!notbase64", pr.END], "not valid base64"),
        ([f"{pr.BEGIN} 3 {'0' * 64}", f"{pr.DATA} \u00e9\u00e9", pr.END], "not valid base64"),
        ([f"{pr.BEGIN} 3 {'0' * 64}", f"{pr.DATA} AAAA", pr.END], "digest"),
    ],
)
def test_a_bad_header_or_base64_is_a_clear_error(
    tmp_path: Path, lines: list[str], why: str
) -> None:
    with pytest.raises(pr.ResultsError, match=why):
        pr.unpack(lines)
    found = bring_home("\n".join(lines), tmp_path / "home")
    assert found.missing is not None and why.split()[-1] in found.missing


def test_the_packer_leaves_links_behind_and_the_rest_comes_home(tmp_path: Path) -> None:
    src = _results_dir(tmp_path)
    (src / "passwd").symlink_to("/etc/passwd")
    (src / "up").symlink_to("..")
    skipped: list[str] = []
    lines = list(pr.pack(src, skipped))
    assert sorted(skipped) == ["passwd", "up"]
    found = bring_home("\n".join(lines), tmp_path / "home")
    assert found.refused is None
    assert sorted(p.name for p in found.files) == ["metrics.csv", "state.pkl", "summary.json"]


def test_unreadable_result_files_are_named_not_fatal(tmp_path: Path) -> None:
    lines = _block({"metrics.csv": b"env_steps\xff,x\n\xfe\x00,1\n", "summary.json": b"[1,"})
    found = bring_home("\n".join(lines), tmp_path / "home")
    assert found.refused is None and found.missing is None
    assert found.summary is None
    assert any(u.startswith("summary.json") for u in found.unreadable)


def test_results_and_job_log_are_private(tmp_path: Path) -> None:
    import stat

    found = bring_home("\n".join(pr.pack(_results_dir(tmp_path))), tmp_path / "home")
    modes = {stat.S_IMODE(p.stat().st_mode) for p in found.directory.rglob("*") if p.is_file()}
    assert modes == {0o600}
    assert stat.S_IMODE(found.directory.stat().st_mode) == 0o700


def test_line_splitter_joins_chunks_and_hides_results_lines() -> None:
    splitter = LineSplitter()
    got = (
        splitter.feed("a\nb")
        + splitter.feed("c\nPROVISIONER-RESULTS-DATA xyz\nd")
        + splitter.flush()
    )
    assert got == ["a", "bc", "PROVISIONER-RESULTS-DATA xyz", "d"]
    assert visible(got) == ["a", "bc", "d"]
    assert tail("1\n2\nPROVISIONER-RESULTS-END\n3\n", 2) == ["2", "3"]


def test_token_goes_in_a_bearer_header_and_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    assert auth_headers("abc") == {"Authorization": "Bearer abc"}
    assert auth_headers(None) == {}
    with pytest.raises(InputError, match="cannot read the cluster's token"):
        read_token(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(InputError, match="empty"):
        read_token(empty)


def test_the_cli_starts_without_importing_matplotlib() -> None:
    # matplotlib costs ~0.4 s to import; only bringing results home needs it.
    code = "import sys, provisioner.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def _playbook_dir(tmp_path: Path) -> Path:
    book = tmp_path / "book"
    (book / "data").mkdir(parents=True)
    (book / "train.py").write_text("print('hi')\n")
    (book / "data" / "table.csv").write_text("a\n1\n")
    (book / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n")
    (book / "id_ed25519.pub").write_text("ssh-ed25519 AAAA me\n")
    (book / ".env").write_text("WANDB_API_KEY=secret\n")
    (book / "data" / "deploy").write_text("-----BEGIN RSA PRIVATE KEY-----\nabc\n")
    (book / "state" / "clusters" / "c").mkdir(parents=True)
    (book / "state" / "clusters" / "c" / "known_hosts").write_text("h ssh-ed25519 AAAA\n")
    (book / "ignored.bin").write_text("x")
    (book / ".gitignore").write_text("ignored.bin\n")
    return book


def test_the_upload_leaves_secrets_and_the_state_directory_behind(tmp_path: Path) -> None:
    from provisioner.jobs.spec import EXCLUDES
    from provisioner.jobs.upload import plan_upload

    book = _playbook_dir(tmp_path)
    upload = plan_upload(book, list(EXCLUDES), book / "state")
    assert upload.files == [".gitignore", "data/table.csv", "id_ed25519.pub", "train.py"]
    assert upload.secrets == [
        ".env",
        "data/deploy",  # no telling name, but it starts like a private key
        "id_ed25519",
        "state/clusters/c/known_hosts",
    ]
    assert upload.size == sum((book / f).stat().st_size for f in upload.files)
    # Ray's own packer, given these excludes, sends exactly the listed files
    import zipfile

    from ray._private.runtime_env.packaging import _zip_files

    _zip_files(str(book), upload.excludes, str(tmp_path / "pkg.zip"), include_gitignore=True)
    names = sorted(
        n for n in zipfile.ZipFile(tmp_path / "pkg.zip").namelist() if not n.endswith("/")
    )
    assert names == upload.files


def test_show_upload_lists_what_would_be_sent_without_a_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.cli import cli

    book = _playbook_dir(tmp_path)
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(book / "state"))
    shown = cli("submit", str(book / "train.py"), "--show-upload")
    assert shown.exit_code == 0, shown.stderr
    assert "train.py" in shown.stdout and "left out as secrets: .env, data/deploy" in shown.stdout
    as_json = cli("submit", str(book / "train.py"), "--show-upload", "--json").json()
    assert as_json["files"] == [".gitignore", "data/table.csv", "id_ed25519.pub", "train.py"]
    assert ".env" in as_json["left_out_as_secrets"]


def test_a_line_without_end_is_passed_on_in_bounded_pieces() -> None:
    splitter = LineSplitter(max_line=10)
    got = splitter.feed("x" * 25) + splitter.feed("y\nz") + splitter.flush()
    assert got == ["x" * 10, "x" * 10, "xxxxxy", "z"]
