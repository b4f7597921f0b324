"""`provisioner submit` against a real Ray cluster with token authentication on.

The cluster here is two real Ray nodes (a head and a worker raylet) started on this
machine by the fixture, in a temporary HOME, with RAY_AUTH_MODE=token: real Jobs API,
real token check, real working_dir upload, real env runners on two nodes. Everything it
starts is stopped by process group id at the end. The same CLI path through the SSH
tunnel of a lab cluster is `provisioner submit -i INVENTORY` (see docs/architecture.md).
"""

from __future__ import annotations

import io
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from provisioner.cli import run
from provisioner.cli.common import state
from provisioner.console import Output
from provisioner.jobs import make_spec, submit
from provisioner.jobs.client import AuthRefused

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LocalCluster:
    url: str
    token: Path
    processes: list[subprocess.Popen[bytes]]


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [RAY, "start", "--block", "--disable-usage-stats", *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _node_args() -> list[str]:
    return [
        f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}",
        f"--metrics-export-port={_free_port()}",
        f"--runtime-env-agent-port={_free_port()}",
    ]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A short path: Ray's socket paths under --temp-dir must stay under 107 characters.
    home = Path(tempfile.mkdtemp(prefix="rayjobs-"))
    token = home / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        **os.environ,
        "HOME": str(home),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    gcs, dashboard = _free_port(), _free_port()
    temp = home / "ray"
    head = _start(
        [
            "--head",
            f"--port={gcs}",
            f"--dashboard-port={dashboard}",
            "--num-cpus=1",
            f"--ray-client-server-port={_free_port()}",
            f"--temp-dir={temp}",
            *_node_args(),
        ],
        env,
        home / "head.log",
    )
    procs = [head]
    try:
        _wait_for_dashboard(dashboard, head, home / "head.log")
        worker = _start(
            [
                f"--address=127.0.0.1:{gcs}",
                "--num-cpus=1",
                f"--temp-dir={home / 'w'}",
                *_node_args(),
            ],
            env,
            home / "w.log",
        )
        procs.append(worker)
        _wait_for_nodes(gcs, 2, env)
        yield LocalCluster(f"http://127.0.0.1:{dashboard}", token, procs)
    finally:
        for proc in reversed(procs):
            _stop_group(proc)
        shutil.rmtree(home, ignore_errors=True)


def _wait_for_dashboard(port: int, head: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray head exited: {log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(1)
    raise TimeoutError("the local Ray dashboard did not come up")


def _wait_for_nodes(gcs: int, count: int, env: dict[str, str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        out = subprocess.run(
            [RAY, "status", f"--address=127.0.0.1:{gcs}"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if out.count("node_") >= count:
            return
        time.sleep(2)
    raise TimeoutError(f"fewer than {count} Ray nodes joined")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group this test started (ray start --block stops its Ray)."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    state.output = Output(stdout=out, stderr=err)
    import provisioner.cli.common as common

    original = common.output

    def injected(json_mode: bool) -> Output:
        state.output = Output(json_mode=json_mode, stdout=out, stderr=err)
        return state.output

    common.output = injected
    import provisioner.cli.jobs as jobs_cli

    jobs_cli.output = injected
    try:
        code = run(args)
    finally:
        common.output = original
        jobs_cli.output = original
    return code, out.getvalue(), err.getvalue()


def _submit(
    cluster: LocalCluster, results: Path, playbook: Path, *args: str
) -> tuple[int, dict[str, object], str]:
    code, out, err = _cli(
        [
            "submit",
            "--address",
            cluster.url,
            "--token-file",
            str(cluster.token),
            "--results",
            str(results),
            "--json",
            str(playbook),
            "--",
            *args,
        ]
    )
    return code, json.loads(out), err


def test_ppo_small_budget_brings_metrics_checkpoint_and_plot_home(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    code, doc, err = _submit(
        cluster,
        tmp_path,
        PLAYBOOKS / "ppo_cartpole.py",
        "--env-runners",
        "2",
        "--train-batch",
        "400",
        "--max-iterations",
        "2",
    )
    assert code == 0, err
    job = tmp_path / str(doc["job_id"])
    rows = (job / "metrics.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("iteration,env_steps,episode_return_mean")
    assert any((job / "checkpoint").rglob("*.pkl")) or any((job / "checkpoint").rglob("*.pt"))
    assert (job / "training.png").stat().st_size > 5000
    assert list((job / "tensorboard").glob("events.out.tfevents.*"))
    runners = json.loads((job / "runners.json").read_text())
    assert len(runners) == 2 and len({r["node_id"] for r in runners}) == 2
    assert "iter    2" in err  # the job's output was streamed live (stderr in --json mode)


def test_custom_environment_trains(cluster: LocalCluster, tmp_path: Path) -> None:
    code, doc, err = _submit(
        cluster,
        tmp_path,
        PLAYBOOKS / "ppo_cells.py",
        "--env-runners",
        "2",
        "--train-batch",
        "1000",
        "--max-iterations",
        "5",
        "--seed",
        "1",
    )
    assert code == 0, err
    summary = doc["summary"]
    assert isinstance(summary, dict)
    assert summary["episode_return_mean"] > summary["first_return_mean"] + 1.0


def test_a_playbook_that_raises_exits_1_with_its_traceback(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    bad = tmp_path / "book" / "broken.py"
    bad.parent.mkdir()
    bad.write_text("def train():\n    raise ValueError('reward is NaN')\n\ntrain()\n")
    code, _, err = _cli(
        [
            "submit",
            "--address",
            cluster.url,
            "--token-file",
            str(cluster.token),
            "--results",
            str(tmp_path / "r"),
            str(bad),
        ]
    )
    assert code == 1
    assert "FAILED" in err and "Traceback (most recent call last):" in err
    assert "ValueError: reward is NaN" in err


def test_submit_without_the_token_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    spec = make_spec(PLAYBOOKS / "ppo_cartpole.py")
    with pytest.raises(AuthRefused, match="requires a token"):
        submit(cluster.url, None, spec, tmp_path)
    wrong = tmp_path / "wrong"
    wrong.write_text(secrets.token_hex(32))
    with pytest.raises(AuthRefused, match="refused the token"):
        submit(cluster.url, wrong, spec, tmp_path)
    code, _, err = _cli(
        [
            "submit",
            "--address",
            cluster.url,
            "--token-file",
            str(wrong),
            str(PLAYBOOKS / "ppo_cartpole.py"),
        ]
    )
    assert code == 1 and "refused the token" in err


def test_ctrl_c_stops_the_job(cluster: LocalCluster, tmp_path: Path) -> None:
    book = tmp_path / "book" / "forever.py"
    book.parent.mkdir()
    book.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")

    def press_ctrl_c(line: str) -> None:
        if line == "started":
            raise KeyboardInterrupt

    outcome = submit(cluster.url, cluster.token, make_spec(book), tmp_path, on_line=press_ctrl_c)
    assert outcome.interrupted and outcome.status == "STOPPED"
