"""Pure logic of `provisioner submit`: the job spec, the log stream, the progress lines."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.jobs.client import auth_headers
from provisioner.jobs.home import tail
from provisioner.jobs.spec import (
    META_RESUMED,
    PRICE_ENV,
    RESUME_ENV,
    asks_for_help,
    check_job_id,
    job_id_for,
    make_spec,
    priced,
)
from provisioner.jobs.stream import LineSplitter, progress_of, visible
from provisioner.node.token import read_token_file


def _playbook(tmp_path: Path, name: str = "train me.py") -> Path:
    path = tmp_path / name
    path.write_text("print('hi')\n")
    return path


def test_entrypoint_quotes_arguments_and_runs_in_the_nodes_results_directory(
    tmp_path: Path,
) -> None:
    spec = make_spec(_playbook(tmp_path), ["--x", "a b; rm -rf /"], job_id="j1")
    prepare, run = spec.entrypoint().split(" && exec ")
    assert shlex.split(run) == ["python3", "-u", "train me.py", "--x", "a b; rm -rf /"]
    assert prepare.startswith('export PROVISIONER_RESULTS_DIR="${PROVISIONER_RESULTS_ROOT:?')
    prepare, watch = prepare.split(" && { ")
    assert prepare.endswith('}"/j1 && mkdir -p "$PROVISIONER_RESULTS_DIR"')
    assert watch.startswith("python3 -I -S -c ") and watch.endswith(" $$ & }")  # tune_watch


def test_the_entrypoint_refuses_a_cluster_without_a_results_directory(tmp_path: Path) -> None:
    spec = make_spec(_playbook(tmp_path), job_id="j1")
    shell = [
        "bash",
        "-c",
        spec.entrypoint().split(" && exec ")[0] + ' && echo "$PROVISIONER_RESULTS_DIR"',
    ]
    missing = subprocess.run(shell, capture_output=True, text=True, env={}, check=False)
    assert missing.returncode != 0 and "has no results directory" in missing.stderr
    root = tmp_path / "root"
    given = subprocess.run(
        shell, capture_output=True, text=True, env={"PROVISIONER_RESULTS_ROOT": str(root)}
    )
    assert given.stdout.strip() == f"{root}/j1" and (root / "j1").is_dir()


def test_runtime_env_ships_the_playbook_directory_only(tmp_path: Path) -> None:
    env = make_spec(_playbook(tmp_path), job_id="j1").runtime_env()
    assert env["working_dir"] == str(tmp_path.resolve())
    assert "py_modules" not in env and RESUME_ENV not in env["env_vars"]
    assert "results/" in env["excludes"]


def test_a_resumed_job_points_its_playbook_at_the_checkpoint_it_was_given(tmp_path: Path) -> None:
    spec = replace(make_spec(_playbook(tmp_path), job_id="j2"), resumed_from="j1")
    assert spec.runtime_env()["env_vars"][RESUME_ENV] == "resume/checkpoint"
    assert spec.metadata()[META_RESUMED] == "j1"


def test_the_price_of_a_node_hour_reaches_the_job_flag_first_then_the_inventory(
    tmp_path: Path,
) -> None:
    spec = make_spec(_playbook(tmp_path), job_id="j1")
    assert PRICE_ENV not in priced(spec, None, None).runtime_env()["env_vars"]
    assert priced(spec, None, 0.34).runtime_env()["env_vars"][PRICE_ENV] == "0.34"
    assert priced(spec, 1.5, 0.34).runtime_env()["env_vars"][PRICE_ENV] == "1.5"
    assert priced(spec, 0.0, 0.34).runtime_env()["env_vars"][PRICE_ENV] == "0.0"
    with pytest.raises(InputError, match="not a price"):
        priced(spec, float("nan"), None)


def test_job_ids_that_could_leave_a_directory_are_bad_input() -> None:
    for bad in ("../x", "a/b", ".hidden", "", "a b", "x" * 200):
        with pytest.raises(InputError, match="is not a job id"):
            check_job_id(bad)
    assert check_job_id("ppo-cartpole-20261201-000000") == "ppo-cartpole-20261201-000000"


def test_help_for_the_playbook_is_recognised() -> None:
    assert asks_for_help(["--max-env-steps", "5", "--help"])
    assert asks_for_help(["-h"]) and not asks_for_help(["--helpful"])


def test_missing_or_non_python_playbook_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        make_spec(tmp_path / "nope.py")
    other = tmp_path / "x.sh"
    other.write_text("")
    with pytest.raises(InputError, match=r"not a \.py file"):
        make_spec(other)


def test_job_id_is_readable_and_timestamped() -> None:
    assert job_id_for(Path("/a/PPO_CartPole.py"), now=0, nonce="ab12") == (
        "ppo-cartpole-19700101-000000-ab12"
    )
    one, two = (job_id_for(Path("/a/x.py"), now=0) for _ in range(2))
    assert one != two and re.fullmatch(r"x-19700101-000000-[0-9a-f]{12}", one), (one, two)


def test_line_splitter_joins_chunks_and_progress_lines_stay_out_of_the_log() -> None:
    splitter = LineSplitter()
    mark = 'PROVISIONER-PROGRESS {"iteration": 3}'
    got = splitter.feed("a\nb") + splitter.feed(f"c\n{mark}\nd") + splitter.flush()
    assert got == ["a", "bc", mark, "d"]
    assert visible(got) == ["a", "bc", "d"]
    assert progress_of(mark) == {"iteration": 3}
    assert progress_of("PROVISIONER-PROGRESS {broken") is None
    assert tail(f"1\n2\n{mark}\n3\n", 2) == ["2", "3"]


def test_token_goes_in_a_bearer_header_and_a_missing_file_is_bad_input(tmp_path: Path) -> None:
    assert auth_headers("abc") == {"Authorization": "Bearer abc"}
    assert auth_headers(None) == {}
    with pytest.raises(InputError, match="cannot read the cluster's token"):
        read_token_file(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(InputError, match="empty"):
        read_token_file(empty)
    shared = tmp_path / "shared"
    shared.write_text("abc\n")
    shared.chmod(0o644)
    with pytest.raises(InputError, match="others can read it") as refused:
        read_token_file(shared)
    assert refused.value.fix == f"chmod 600 {shared}"
    shared.chmod(0o600)
    assert read_token_file(shared) == "abc"


def test_the_cli_starts_without_importing_matplotlib() -> None:
    # matplotlib costs ~0.4 s to import; only bringing results home needs it.
    code = "import sys, provisioner.cli; print('matplotlib' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip() == "False"


def test_a_playbooks_help_is_answered_here_without_a_cluster_or_a_job(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from provisioner.cli import run

    playbook = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"
    # no inventory, no address: a job could not even be submitted
    assert run(["submit", str(playbook), "--", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--checkpoint-every" in out and "--resume-from" in out


def test_a_line_without_end_is_passed_on_in_bounded_pieces() -> None:
    splitter = LineSplitter(max_line=10)
    got = splitter.feed("x" * 25) + splitter.feed("y\nz") + splitter.flush()
    assert got == ["x" * 10, "x" * 10, "xxxxxy", "z"]


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
    import zipfile

    from ray._private.runtime_env.packaging import _zip_files

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


def test_a_job_log_is_read_with_a_bound() -> None:
    from provisioner.jobs.client import read_bounded

    assert read_bounded([b"ab", b"cd"], 4) == b"abcd"
    assert read_bounded([], 4) == b""

    def endless() -> Iterator[bytes]:
        while True:  # a log that never ends: reading must stop at the cap
            yield b"x" * 1000

    assert read_bounded(endless(), 10_000) is None
    assert read_bounded([b"abc", b"de"], 4) is None


@contextmanager
def jobs_api(answer: Callable[[str], tuple[int, str] | None]) -> Iterator[str]:
    """A loopback HTTP server answering each GET as `answer(path)` says ((status, JSON
    body), None: 404), as Ray's Jobs API would; yields its URL."""

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            got = answer(self.path)
            if got is None:
                self.send_error(404)
                return
            code, text = got
            data = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_job_log_goes_through_rays_own_client_with_a_bound() -> None:
    """Ray's real JobSubmissionClient against a loopback server answering as the Jobs API
    does (/api/version, /api/jobs/ID/logs): a log under the cap comes back whole; one over
    it is refused after reading at most the cap."""
    from ray.job_submission import JobSubmissionClient

    from provisioner.jobs.client import job_log

    big = "y" * 200_000
    bodies = {
        "/api/version": {"version": "4", "ray_version": "2.60.0", "ray_commit": "x"},
        "/api/jobs/small/logs": {"logs": "line 1\nline 2\n"},
        "/api/jobs/big/logs": {"logs": big},
    }
    with jobs_api(lambda path: (200, json.dumps(bodies[path])) if path in bodies else None) as url:
        client = JobSubmissionClient(url)
        assert job_log(client, "small") == "line 1\nline 2\n"
        assert job_log(client, "big", cap=50_000) is None
        assert job_log(client, "big", cap=1_000_000) == big


def test_a_followed_job_ends_at_once_when_its_heads_ray_is_gone_or_not_running() -> None:
    from provisioner.jobs.stream import head_verdict
    from provisioner.runtime.docker.runtime import parse_container_facts
    from provisioner.runtime.protocol import RayState

    # what `docker inspect` says of a head container that `docker kill` stopped
    killed = parse_container_facts(
        '{"running": false, "status": "exited", "image": "sha256:ab", "started_at": "x", '
        '"restarts": 0, "exit_code": 137, "oom_killed": false, "cluster_id": "c1", '
        '"gpus": ""}',
        "c1",
    )
    assert head_verdict(killed) == (
        "the head's Ray is not running (exited): the job was lost with it"
    )
    assert head_verdict(RayState(status="restarting")) is not None
    assert head_verdict(RayState()) == "the cluster was taken down"
    # the control: a running (or paused, or unknown) head is waited for, never given up
    for status in ("running", "paused", "unknown"):
        assert head_verdict(RayState(status=status)) is None, status


@pytest.mark.parametrize(
    "status, body",
    [
        (200, '{"version": "4"}'),  # JSON without "ray_version" (seen from a busy head)
        (200, "<html>not Ray</html>"),  # another server on the dashboard's port
        (503, '{"ray_version": "2.60.0"}'),  # an HTTP error
        (404, "{}"),  # Ray's own "Version check returned 404"
    ],
)
def test_an_answer_rays_client_cannot_read_is_an_operation_error_with_a_fix(
    status: int, body: str
) -> None:
    """Ray's real JobSubmissionClient against a loopback server answering its version probe
    badly: `connect` says so with a fix (once a crash: KeyError 'ray_version'); the control,
    a server answering as Ray's does, connects."""
    from provisioner.errors import OperationError
    from provisioner.jobs.client import connect

    answers = {"bad": (status, body), "good": (200, '{"ray_version": "2.60.0"}')}
    which: list[str] = ["bad"]
    with jobs_api(lambda path: answers[which[0]] if path == "/api/version" else (200, "[]")) as url:
        with pytest.raises(OperationError) as caught:
            connect(url, None)
        assert url in str(caught.value) and "dashboard port" in (caught.value.fix or "")
        which[0] = "good"
        assert connect(url, None) is not None
