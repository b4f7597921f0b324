"""The playbook under SageMaker's training contract, run by the SageMaker SDK's own local
mode (`ModelTrainer`, `Mode.LOCAL_CONTAINER`: docker compose on this machine's dockerd).

No lab: the SDK's containers are this machine's. Budgets stay small (two shared cores):
PPO CartPole with a small batch, a checkpoint every iteration.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.lab.nodes import LabInfo

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"
FAST = ["--train-batch", "400", "--checkpoint-every", "1", "--target-return", "1e9"]


def _run_args(results: Path, pin: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "provisioner",
        "sagemaker",
        "run",
        str(PLAYBOOK),
        "--instance-type",
        "local",
        "--results",
        str(results),
        "--lock",
        str(pin),
        "--json",
        *extra,
    ]


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, Any, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, json.loads(out), err


def _job_dir(results: Path, deadline: float) -> Path:
    while time.monotonic() < deadline:
        found = [p for p in results.glob("ppo-cartpole-*") if p.is_dir()]
        if found:
            return found[0]
        time.sleep(1)
    raise AssertionError(f"no job directory appeared in {results}")


def _containers(job_id: str, *, all_: bool = False) -> list[str]:
    cmd = ["docker", "ps", "-q", "--filter", f"name=sm-{job_id}_"]
    out = subprocess.run(cmd + (["-a"] if all_ else []), capture_output=True, text=True)
    return out.stdout.split()


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@dataclass
class Stopped:
    home: Path
    code: int
    doc: Any
    err: str
    seconds: float


@pytest.fixture(scope="module")
def stopped(image_pin: Path, tmp_path_factory: pytest.TempPathFactory) -> Stopped:
    """Two local instances (the head on algo-1, a worker joined by name) stopped as
    SageMaker stops a job: SIGTERM to every training container once checkpoints are in."""
    results = tmp_path_factory.mktemp("sagemaker") / "results"
    started = time.monotonic()
    proc = subprocess.Popen(
        _run_args(results, image_pin, "--instance-count", "2", "--", "--max-iterations",
                  "200", "--env-runners", "3", *FAST),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        home = _job_dir(results, time.monotonic() + 120)
        deadline = time.monotonic() + 240
        while not (home / "checkpoints" / "iter-000002").is_dir():
            assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(1)
        # checkpoints land in RESULTS/JOB while the job runs (the checkpoint channel)
        assert proc.poll() is None
        running = _containers(home.name)
        assert len(running) == 2, f"two training containers, found {running}"
        # SageMaker's stop: SIGTERM to every training container, then 120 s before SIGKILL
        subprocess.run(["docker", "kill", "--signal", "TERM", *running], check=True)
        code, doc, err = _finish(proc, 150)
    finally:
        if proc.poll() is None:
            proc.kill()
    seconds = time.monotonic() - started
    print(f"local mode, 2 instances, start to stopped with a checkpoint: {seconds:.0f}s")
    return Stopped(home, code, doc, err, seconds)


def test_two_instances_stopped_by_sigterm_leave_a_checkpoint(stopped: Stopped) -> None:
    home, code, doc, err = stopped.home, stopped.code, stopped.doc, stopped.err
    assert code == 1 and doc["status"] == "stopped", (code, doc, err[-3000:])
    summary = doc["summary"]
    assert summary["stopped_by"] == "sigterm"
    stopped_at = summary["iterations"]
    assert (home / summary["checkpoint"]).is_dir() and summary["checkpoint"].endswith(
        f"iter-{stopped_at:06d}"
    )
    # the final checkpoint and the metrics also came out through /opt/ml/model
    assert (home / "model" / summary["checkpoint"] / "rllib_checkpoint.json").is_file()
    assert [int(r["iteration"]) for r in _rows(home / "model" / "metrics.csv")] == list(
        range(1, stopped_at + 1)
    )
    # env runners on both containers (the Ray head on algo-1, the worker joined by name)
    runners = json.loads((home / "runners.json").read_text())
    assert len({r["host"] for r in runners}) == 2, runners
    assert summary["cluster_nodes"] == 2
    assert summary["sagemaker"]["instance_count"] == 2
    assert summary["sagemaker"]["instance_hours"] > 0
    assert (home / "training.png").is_file() and (home / "job.log").is_file()
    assert _containers(home.name, all_=True) == [], "the job's containers are gone"


def test_the_stopped_run_continues_under_sagemaker(
    stopped: Stopped, image_pin: Path, tmp_path: Path
) -> None:
    """`sagemaker run --resume PATH`: through the checkpoint channel; learning goes on."""
    assert stopped.doc["status"] == "stopped", stopped.err[-3000:]
    stopped_at = stopped.doc["summary"]["iterations"]
    more = stopped_at + 2
    code, doc, err = _finish(
        subprocess.Popen(
            _run_args(tmp_path / "results", image_pin, "--instance-count", "1", "--resume",
                      str(stopped.home), "--", "--max-iterations", str(more), "--env-runners",
                      "1", *FAST),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        240,
    )  # fmt: skip
    assert code == 0 and doc["status"] == "completed", (code, doc, err[-3000:])
    again = Path(doc["results"])
    assert doc["summary"]["iterations"] == more and doc["summary"]["stopped_by"] == "max_iterations"
    rows = _rows(again / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, more + 1))
    steps = [int(r["env_steps"]) for r in rows]
    assert steps == sorted(steps) and steps[stopped_at] > steps[stopped_at - 1]
    assert "resumed from" in (again / "job.log").read_text()
    assert (again / "model" / doc["summary"]["checkpoint"] / "rllib_checkpoint.json").is_file()


def test_the_stopped_run_continues_on_the_lab_cluster(
    stopped: Stopped, host_lab: LabInfo, tmp_path: Path
) -> None:
    """`submit --resume PATH` with a SageMaker job's results directory: the same checkpoint
    format and metrics, so the cluster run goes on from the SageMaker run's iteration (on
    the host-mode lab, Ray from the nodes' own Python: the same Ray and RLlib as the image)."""
    from tests.e2e.helpers import cli

    assert stopped.doc["status"] == "stopped", stopped.err[-3000:]
    stopped_at = stopped.doc["summary"]["iterations"]
    inventory = str(host_lab.inventory)
    code, _, err = cli("up", "-i", inventory)
    assert code == 0, err[-3000:]
    more = ["--max-iterations", str(stopped_at + 2), "--env-runners", "2", *FAST]
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(tmp_path / "results"), "--json",
        "--resume", str(stopped.home), str(PLAYBOOK), "--", *more,
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    resumed = tmp_path / "results" / doc["job_id"]
    rows = _rows(resumed / "metrics.csv")
    assert [int(r["iteration"]) for r in rows] == list(range(1, stopped_at + 3))
    assert "restored weights verified on 2 env runner(s)" in (resumed / "job.log").read_text()


def test_a_failing_playbook_writes_its_reason_and_the_cli_shows_it(
    image_pin: Path, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    proc = subprocess.Popen(
        _run_args(results, image_pin, "--instance-count", "1", "--", "--train-batch", "many"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    code, doc, err = _finish(proc, 180)
    assert code == 1 and doc["status"] == "failed", (code, doc, err[-2000:])
    # the playbook's own error, through /opt/ml/output/failure
    assert "invalid int value: 'many'" in doc["failure"]
    home = Path(doc["results"])
    assert "invalid int value: 'many'" in (home / "failure").read_text()
    assert _containers(home.name, all_=True) == []
