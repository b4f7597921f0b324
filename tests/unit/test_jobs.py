"""Pure logic of `provisioner submit`: the job spec, the results shipment, the log stream."""

from __future__ import annotations

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


def test_extract_refuses_paths_outside_the_destination(tmp_path: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.OutsideDestinationError):
        pr.extract(buffer.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()


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
