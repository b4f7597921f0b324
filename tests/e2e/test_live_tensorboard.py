"""Live TensorBoard: `provisioner tunnel` serves the head's results through the tunnel
while a job runs, with that job's scalars as the job writes them; it stops with the
tunnel."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from provisioner.cluster.tunnel import tensorboard_port
from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from tests.e2e.faults.lab import sigint_as_at_a_terminal
from tests.e2e.helpers import cli, ssh
from tests.e2e.test_long_runs import SMALL

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
TAG = "ppo/episode_return_mean"


@pytest.fixture(scope="module")
def inventory(cluster_inventory: Path) -> str:
    code, _, err = cli("up", "-i", str(cluster_inventory))
    assert code == 0, err[-3000:]
    return str(cluster_inventory)


def points(board: str, run: str) -> list[list[float]]:
    """TensorBoard's scalars of TAG in `run` ([wall time, step, value]); none yet: []."""
    query = urllib.parse.urlencode({"run": run, "tag": TAG})
    try:
        with urllib.request.urlopen(
            f"{board}/data/plugin/scalars/scalars?{query}", timeout=30
        ) as r:
            found: list[list[float]] = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return []
    return found


def start_tunnel(inventory: str) -> subprocess.Popen[str]:
    """`provisioner tunnel --json` in a process of its own (read its document with
    `read_document`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "provisioner", "tunnel", "-i", inventory, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # the tests end it with Ctrl-C's SIGINT, which a suite run in the background
        # (`nohup .ci/run &`) would hand down ignored: the tunnel then never ended (CI)
        preexec_fn=sigint_as_at_a_terminal,
    )


def read_document(proc: subprocess.Popen[str]) -> Any:
    """The one JSON document `tunnel --json` prints once its tunnels are up."""
    assert proc.stdout is not None
    text = ""
    while True:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        text += line
        if line.rstrip() == "}":
            return json.loads(text)


def head_listens(lab: LabInfo, port: int) -> bool:
    """Whether something listens on the head's 127.0.0.1:PORT (its socket table)."""
    table = f"grep -q '0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp"
    return ssh(lab, lab.nodes[0], table).returncode == 0


def test_a_tunnel_ended_by_sigterm_stops_its_tensorboard(inventory: str, lab: LabInfo) -> None:
    """SIGTERM (a service manager, `kill`) ends the tunnel as Ctrl-C does: TensorBoard on
    the head stops with it (it was left running before)."""
    head_port = tensorboard_port(load_inventory(Path(inventory)).ports)
    tunnel = start_tunnel(inventory)
    try:
        opened = read_document(tunnel)["tensorboard"]
        assert opened["state"] == "started", opened
        assert head_listens(lab, head_port)  # positive control: it serves while the tunnel runs
    finally:
        tunnel.terminate()
        try:
            tunnel.wait(60)
        except subprocess.TimeoutExpired:
            tunnel.kill()
    assert not head_listens(lab, head_port), listening_story(lab, head_port, tunnel)


def listening_story(lab: LabInfo, port: int, tunnel: subprocess.Popen[str]) -> str:
    """What holds the head's PORT (the TensorBoard processes in the node's and in its
    containers' process lists) and the tunnel's exit code and stderr's tail."""
    seen = ssh(
        lab,
        lab.nodes[0],
        "ps -eo pid,ppid,stat,etime,args | grep -i [t]ensorboard; "
        "docker ps --format '{{.Names}}' | while read c; do echo \"== $c\"; "
        "docker exec $c ps -eo pid,ppid,stat,etime,args 2>/dev/null | grep -i [t]ensorboard; done",
    )
    err = tunnel.stderr.read() if tunnel.stderr is not None else ""
    return f"port {port}: {seen.stdout[-1500:]} | tunnel exit {tunnel.returncode}: {err[-1500:]}"


def job_story(inventory: str, job: str) -> str:
    """The job's status and the tail of its log, for a failure's message."""
    code, out, err = cli("jobs", "list", "-i", inventory, "--json")
    status = (
        {j["job_id"]: j["status"] for j in json.loads(out)["jobs"]}.get(job, "not listed")
        if code == 0
        else f"jobs list failed: {err[-500:]}"
    )
    _, log, log_err = cli("jobs", "logs", job, "-i", inventory)
    return f"job {job}: {status}\n{(log or log_err)[-3000:]}"


def points_while_running(
    inventory: str,
    job: str,
    tunnel: subprocess.Popen[str],
    board: str,
    run: str,
    enough: Callable[[list[list[float]]], bool],
) -> list[list[float]]:
    """TensorBoard's points of the job once `enough`; a job or a tunnel that ended before
    (or 600 s without them) fails the test with the job's status and log."""
    deadline, checked = time.monotonic() + 600, time.monotonic()
    while time.monotonic() < deadline:
        if enough(found := points(board, run)):
            return found
        if tunnel.poll() is not None:
            err = tunnel.stderr.read() if tunnel.stderr is not None else ""
            raise AssertionError(f"the tunnel ended ({tunnel.returncode}): {err[-2000:]}")
        if time.monotonic() - checked > 20:
            checked = time.monotonic()
            code, out, _ = cli("jobs", "list", "-i", inventory, "--json")
            jobs = json.loads(out)["jobs"] if code == 0 else []
            ended = ("SUCCEEDED", "FAILED", "STOPPED")
            if {j["job_id"]: j["status"] for j in jobs}.get(job) in ended:
                raise AssertionError(f"the job ended first: {job_story(inventory, job)}")
        time.sleep(0.5)
    raise AssertionError(f"600 s without the points: {job_story(inventory, job)}")


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def test_tensorboard_answers_through_the_tunnel_with_a_running_jobs_scalars(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    head_port = tensorboard_port(load_inventory(Path(inventory)).ports)
    results = tmp_path / "results"
    code, out, err = cli(
        "submit", "-i", inventory, "--detach", "--json", "--results", str(results),
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--max-iterations", "400",
        "--max-env-steps", "10000000", "--target-return", "1e9", *SMALL,
    )  # fmt: skip
    assert code == 0, err[-3000:]
    job = json.loads(out)["job_id"]
    tunnel = start_tunnel(inventory)
    try:
        opened = read_document(tunnel)["tensorboard"]
        assert opened["serving"] is True and opened["state"] == "started", opened
        assert opened["head_port"] == head_port and head_listens(lab, head_port)
        board, run = opened["url"], f"{job}/tensorboard"
        seen = points_while_running(inventory, job, tunnel, board, run, lambda p: len(p) >= 3)
        code, out, err = cli("jobs", "list", "-i", inventory, "--json")
        assert code == 0, err[-2000:]
        status = {j["job_id"]: j["status"] for j in json.loads(out)["jobs"]}[job]
        assert status == "RUNNING"  # served from the head while the job runs
        # and TensorBoard follows the job: more points come while it runs
        grown = len(seen)
        more = points_while_running(inventory, job, tunnel, board, run, lambda p: len(p) > grown)
    finally:
        tunnel.send_signal(signal.SIGINT)
        try:
            tunnel.wait(60)
        except subprocess.TimeoutExpired:
            tunnel.kill()
        code, _, err = cli("jobs", "stop", job, "-i", inventory)
    assert code == 0, err[-2000:]
    # TensorBoard stopped with the tunnel; if not, say what listens and what the tunnel said
    assert not head_listens(lab, head_port), listening_story(lab, head_port, tunnel)
    # the job's own record, come home: every point TensorBoard served is one of its rows
    code, _, err = cli("jobs", "results", job, "-i", inventory, "--results", str(results))
    assert code == 0, err[-2000:]
    rows = (results / job / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    steps, ret = header.index("env_steps"), header.index("episode_return_mean")
    recorded = {int(r.split(",")[steps]): float(r.split(",")[ret] or "nan") for r in rows[1:]}
    for _, step, value in more:  # TensorBoard's JSON writes a NaN as the string "NaN"
        assert int(step) in recorded and same(float(value), recorded[int(step)]), (step, value)
    print(f"TensorBoard through the tunnel: {len(seen)}, then {len(more)} points of {run}")
