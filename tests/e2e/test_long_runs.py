"""Long runs on the two-network lab: jobs that outlive `submit`, results from the head's
disk over SSH, checkpoints home during the run, resume after the head's Ray container died,
`down` with a job running.

`submit` runs as a real process here when the test kills it (SIGKILL, as when a laptop
sleeps). Budgets stay small: the lab's nodes share two cores.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.inventory import load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container
from tests.e2e.faults.lab import edited_inventory
from tests.e2e.helpers import (  # noqa: F401 (the fixtures lab, inventory)
    data_cluster_for_module,
    data_lab_for_module,
    record_returns,
    ssh,
)
from tests.e2e.test_jobs import PLAYBOOKS, cli

SMALL = ["--env-runners", "2", "--train-batch", "200", "--checkpoint-every", "2"]
# Enough learning before a resume point that a fresh policy would show: with 1000 steps
# an iteration, CartPole's mean return climbs from about 20 to 150 or more within 8.
LEARN = ["--env-runners", "2", "--train-batch", "1000", "--checkpoint-every", "2"]
LEARN += ["--target-return", "1e9", "--max-env-steps", "10000000"]


def returns_of(home: Path) -> dict[int, float]:
    """A results directory's mean return per iteration (metrics.csv)."""
    rows = (home / "metrics.csv").read_text().splitlines()[1:]
    return {int(r.split(",")[0]): float(r.split(",")[2] or "nan") for r in rows}


def returns_around(returns: dict[int, float], at: int, path: str) -> tuple[float, float, float]:
    """(fresh, before, after): the mean return of a fresh policy (iterations 1-2), of the
    3 iterations up to the resume point `at` and of the first 3 after it; recorded in
    build/resume-returns.jsonl under `path`, the resume path the test shows."""

    def mean(iterations: range) -> float:
        got = [returns[i] for i in iterations if i in returns and not math.isnan(returns[i])]
        assert got, (iterations, returns)
        return sum(got) / len(got)

    fresh, before, after = (
        mean(range(1, 3)),
        mean(range(at - 2, at + 1)),
        mean(range(at + 1, at + 4)),
    )
    record_returns(path, at, fresh, before, after)
    return fresh, before, after


def assert_learning_goes_on(returns: dict[int, float], at: int, path: str) -> tuple[float, float]:
    """The mean return of the first iterations after the resume point `at` stays near the
    mean just before it: (before, after).

    The positive control is in the same run: its first iterations are a fresh policy's
    return, far below the one reached before `at`, so a resume that restarted the policy
    (keeping only the counters) fails here."""
    fresh, before, after = returns_around(returns, at, path)
    assert before > 3 * fresh, f"the run had not learned before {at}: {returns}"
    assert after > 0.5 * before and after > 2.5 * fresh, (
        f"resumed at {at}: mean return {before:.1f} before, {after:.1f} after, a fresh "
        f"policy's {fresh:.1f}: {returns}"
    )
    return before, after


def resume_point(home: Path) -> int:
    """The iteration a resumed job's log says it continued from."""
    found = re.search(r"resumed from \S+ at iteration (\d+)", (home / "job.log").read_text())
    assert found, (home / "job.log").read_text()[-2000:]
    return int(found.group(1))


def latest_home(home: Path) -> int:
    found = checkpoints_home(home)
    return int(found[-1].split("-")[1]) if found else 0


# These run on the two-network lab (conftest.data_lab: SSH on one network, Ray's traffic on
# the other), in the second e2e process beside the `e2e` lab's tests: the longest module,
# and the user's whole path (jobs that outlive submit, results, resume, repair) on a
# cluster whose Ray addresses are not its SSH addresses (`lab` and `inventory`: helpers).


def provisioner_process(*args: str, log: Path) -> subprocess.Popen[bytes]:
    """`provisioner ARGS` as its own process: stderr into `log`, stdout into LOG.out."""
    with open(log, "wb") as err, open(log.with_suffix(".out"), "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "provisioner", *args], stdout=out, stderr=err
        )


def drop_ssh_sessions(lab: LabInfo) -> subprocess.CompletedProcess[str]:
    """Kill the sshd processes serving the control machine's connections to the head (all
    but the one running this command): every tunnel and SSH channel through them drops."""
    head = lab.nodes[0]
    # the unprivileged sshd of each connection: `sshd: USER` (forwarding only) or
    # `sshd: USER@notty` (commands); the `[priv]` monitors are left alone
    pattern = f"^sshd: {head.user}(@notty)?$"
    return ssh(
        lab,
        head,
        f"for p in $(pgrep -f '{pattern}'); do "
        '[ "$p" = "$PPID" ] || sudo kill -KILL "$p"; done; true',
    )


JOB_LINE = re.compile(r"\biter +(\d+) +steps +\d+ +return")


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def job_reached(log: Path, iteration: int) -> bool:
    """The job's own lines (echoed with --json or --verbose) reached `iteration`."""
    found = map(JOB_LINE.search, log.read_text(errors="replace").splitlines())
    return any(int(m.group(1)) >= iteration for m in found if m)


def job_id_in(log: Path) -> str | None:
    for line in log.read_text(errors="replace").splitlines():
        if " as job " in line:
            return line.split(" as job ")[1].split()[0]
    return None


def jobs_json(*args: str) -> tuple[int, Any, str]:
    code, out, err = cli("jobs", *args, "--json")
    return code, json.loads(out), err


def test_a_killed_submit_leaves_the_job_running_and_jobs_logs_follow_takes_over(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    log = tmp_path / "submit.log"
    results = tmp_path / "results"
    args = ["--max-iterations", "24", "--max-env-steps", "100000", "--target-return", "1e9"]
    args += SMALL
    proc = provisioner_process(
        "submit", "-i", inventory, "--results", str(results),
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", *args, log=log,
    )  # fmt: skip
    try:
        wait_for(lambda: "iter 1 " in log.read_text(errors="replace"), 240, "the first iteration")
    finally:
        proc.send_signal(signal.SIGKILL)  # as when the laptop sleeps: no goodbye
        proc.wait(30)
    job = job_id_in(log)
    assert job is not None, log.read_text()[-2000:]
    code, listed, err = jobs_json("list", "-i", inventory)
    row = {j["job_id"]: j for j in listed["jobs"]}[job]
    assert code == 0 and row["status"] == "RUNNING", err[-2000:]
    assert row["playbook"] == "ppo_cartpole.py" and row["progress"]["iteration"] >= 1
    assert row["progress"]["max_env_steps"] == 100000
    # Reattach in another process; drop its SSH connection mid-stream: it reconnects.
    follow_log = tmp_path / "follow.log"
    follower = provisioner_process(
        "jobs", "logs", job, "--follow", "-i", inventory, "--results", str(results),
        "--json", log=follow_log,
    )  # fmt: skip
    try:
        wait_for(lambda: "iter" in follow_log.read_text(errors="replace"), 120, "the follower")
        assert drop_ssh_sessions(lab).returncode == 0
        follower.wait(300)
    finally:
        if follower.poll() is None:
            follower.kill()
    text = follow_log.read_text(errors="replace")
    assert follower.returncode == 0, text[-3000:]
    doc = json.loads(follow_log.with_suffix(".out").read_text())
    assert doc["status"] == "SUCCEEDED"
    assert "reconnecting" in text, text[-3000:]
    # every line of the job's output once, in order, across the reconnection
    iters = [int(m.group(1)) for m in map(JOB_LINE.search, text.splitlines()) if m]
    assert iters == list(range(1, 25)), text[-3000:]
    # and each iteration once: not a terminal, so no progress line beside the job's own
    # (without --json or --verbose the progress line is what shows: `submit`'s log above)
    assert "ETA" in log.read_text(errors="replace")
    assert [line for line in text.splitlines() if "ETA" in line] == [], text[-3000:]
    logged = (results / job / "job.log").read_text().splitlines()
    assert [int(m.group(1)) for m in map(JOB_LINE.search, logged) if m] == iters
    home = results / job
    code, got, err = jobs_json("results", job, "-i", inventory, "--results", str(results))
    assert code == 0, err[-2000:]
    assert got["transfer"]["files_sent"] == [] and got["transfer"]["bytes_sent"] == 0
    assert (home / "metrics.csv").read_text().count("\n") == 25
    assert list((home / "tensorboard").glob("events.out.tfevents.*"))
    assert (home / "training.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads((home / "summary.json").read_text())
    final = home / summary["checkpoint"]
    assert summary["checkpoint"].startswith("checkpoints/iter-") and final.is_dir()
    assert any(p.stat().st_size > 0 for p in final.rglob("*") if p.is_file())


BIG = """
import hashlib, json, os
from pathlib import Path
out = Path(os.environ["PROVISIONER_RESULTS_DIR"])
(out / "deep" / "er").mkdir(parents=True, exist_ok=True)
sums = {}
for name, mib in (("big.bin", 150), ("deep/er/part.bin", 50)):
    digest = hashlib.sha256()
    with open(out / name, "wb") as f:
        for _ in range(mib):
            block = os.urandom(1 << 20)
            f.write(block)
            digest.update(block)
    sums[name] = digest.hexdigest()
(out / "tiny.txt").write_text("6 byte")
print("SUMS " + json.dumps(sums), flush=True)
"""


def test_200_mb_of_results_come_home_verified_and_a_second_pull_sends_nothing(
    inventory: str, tmp_path: Path
) -> None:
    book = tmp_path / "book" / "big.py"
    book.parent.mkdir()
    book.write_text(BIG)
    results = tmp_path / "results"
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json", "--verbose", str(book)
    )
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    home = results / doc["job_id"]
    sums = json.loads(err.split("SUMS ")[1].splitlines()[0])
    for name, digest in sums.items():
        data = (home / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest
    assert (home / "big.bin").stat().st_size == 150 << 20
    assert (home / "tiny.txt").read_text() == "6 byte"
    assert doc["results_missing"] is None and doc["transfer"]["files_pending"] == []
    code, again, err = jobs_json(
        "results", doc["job_id"], "-i", inventory, "--results", str(results)
    )
    assert code == 0, err[-2000:]
    assert again["transfer"]["files_sent"] == [] and again["transfer"]["bytes_sent"] == 0
    assert again["transfer"]["files_unchanged"] == 3
    os.remove(home / "tiny.txt")  # lost here: only that file travels again
    code, third, _ = jobs_json("results", doc["job_id"], "-i", inventory, "--results", str(results))
    assert third["transfer"]["files_sent"] == ["tiny.txt"] and third["transfer"]["bytes_sent"] == 6


def checkpoints_home(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "checkpoints").glob("iter-*") if p.is_dir())


def test_head_container_killed_then_up_repairs_and_submit_resume_continues(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--detach", "--json",
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--max-iterations", "60", *LEARN,
    )  # fmt: skip
    job = json.loads(out)["job_id"]
    assert code == 0 and json.loads(out)["detached"], err[-2000:]
    home = results / job
    # Followed: checkpoints come home while the job runs.
    follow_log = tmp_path / "follow.log"
    follower = provisioner_process(
        "jobs", "logs", job, "--follow", "-i", inventory, "--results", str(results),
        log=follow_log,
    )  # fmt: skip
    try:
        wait_for(lambda: latest_home(home) >= 10, 400, "the checkpoint of iteration 10 home")
        code, listed, _ = jobs_json("list", "-i", inventory)
        assert {j["job_id"]: j for j in listed["jobs"]}[job]["status"] == "RUNNING"
        head = lab.nodes[0]
        killed = ssh(lab, head, f"docker kill {ray_container(load_inventory(Path(inventory)))}")
        assert killed.returncode == 0, killed.stderr
    finally:
        follower.kill()
        follower.wait(30)
    # What came home is intact: every file matches the sha256 recorded when it was verified.
    manifest = json.loads((home / ".pulled.json").read_text())
    kept = checkpoints_home(home)
    assert len(kept) >= 2
    for name, entry in manifest.items():
        if name.startswith("checkpoints/") and name.split("/")[1] in kept:
            data = (home / name).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
    # The head's disk outlived its container: `jobs results` brings what it holds now.
    code, _, err = jobs_json("results", job, "-i", inventory, "--results", str(results))
    assert code == 0, err[-2000:]
    latest = latest_home(home)
    code, _, err = cli("up", "-i", inventory)
    assert code == 0, err[-3000:]
    # The restarted head's Ray knows no job; its disk still holds the killed one's progress.
    code, listed, err = jobs_json("list", "-i", inventory)
    assert code == 0, err[-2000:]
    row = {j["job_id"]: j for j in listed["jobs"]}[job]
    assert row["status"] == "UNKNOWN" and row["progress"]["iteration"] >= latest, row
    more = ["--max-iterations", str(latest + 3), *LEARN]
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json", "--resume", job,
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", *more,
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    assert "the head's own copy" in err  # the head's disk survived its container
    resumed = results / doc["job_id"]
    rows = (resumed / "metrics.csv").read_text().splitlines()[1:]
    iterations = [int(r.split(",")[0]) for r in rows]
    assert iterations == list(range(1, latest + 4)), iterations  # metrics appended
    steps = [int(r.split(",")[1]) for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # counters continue
    assert_learning_goes_on(  # and so does the learning
        returns_of(resumed), latest, "--resume JOB, same cluster, after a head kill and up"
    )
    assert "restored weights verified on 2 env runner(s)" in (resumed / "job.log").read_text()
    resumed_rates = [float(r.split(",")[4]) for r in rows[latest:]]
    # this run's own steps over its own time: the same order as before the loss, not the
    # lifetime steps over a short time (bounds only: the lab is noisy)
    before = [float(r.split(",")[4]) for r in rows[1:latest]]
    assert max(resumed_rates) < 5 * max(before), (before, resumed_rates)
    assert doc["summary"]["iterations"] == latest + 3
    assert (resumed / "training.png").is_file()


@dataclass
class Learned:
    """A finished run that learned: its results directory and job id."""

    results: Path
    job: str


@pytest.fixture(scope="module")
def learned(inventory: str, tmp_path_factory: pytest.TempPathFactory) -> Learned:
    """10 iterations of PPO on CartPole with an observation filter, its checkpoint of
    iteration 10 home: what the resume tests below go on from."""
    results = tmp_path_factory.mktemp("learned") / "results"
    first = ["--max-iterations", "10", "--obs-filter", *LEARN]
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json",
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", *first,
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    assert latest_home(results / doc["job_id"]) == 10
    return Learned(results, doc["job_id"])


def test_a_finished_run_resumed_on_its_cluster_and_on_another_goes_on_learning(
    inventory: str, lab: LabInfo, learned: Learned, tmp_path: Path
) -> None:
    """`--resume JOB` on the same cluster (the head's own copy), then `--resume PATH` on a
    cluster of another name whose head holds no copy (the checkpoint is sent from here),
    with an observation filter whose state must come back with the weights."""
    results, job = learned.results, learned.job
    # nothing killed: the same cluster
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json", "--resume", job,
        str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--max-iterations", "13", "--obs-filter",
        *LEARN,
    )  # fmt: skip
    again = json.loads(out)
    assert code == 0 and again["status"] == "SUCCEEDED", err[-3000:]
    assert "the head's own copy" in err
    before, after = assert_learning_goes_on(
        returns_of(results / again["job_id"]), 10, "--resume JOB, same cluster, nothing killed"
    )
    print(f"--resume JOB, same cluster: return {before:.1f} before, {after:.1f} after")
    # a cluster of another name, on other ports: its head has no copy of the job
    other = edited_inventory(
        Path(inventory), tmp_path / "other.yaml", cluster=f"{lab.name}-r", ray={"port_base": 21000}
    )
    try:
        code, _, err = cli("up", "-i", str(other))
        assert code == 0, err[-3000:]
        source = results / job
        code, out, err = cli(
            "submit", "-i", str(other), "--results", str(tmp_path / "r"), "--json",
            "--resume", str(source), str(PLAYBOOKS / "ppo_cartpole.py"), "--",
            "--max-iterations", "13", "--obs-filter", *LEARN,
        )  # fmt: skip
        moved = json.loads(out)
        assert code == 0 and moved["status"] == "SUCCEEDED", err[-3000:]
        assert "the head's own copy" not in err and "sent" in err, err[-3000:]
        home = tmp_path / "r" / moved["job_id"]
        before, after = assert_learning_goes_on(
            returns_of(home), 10, "--resume PATH, a cluster of another name, sent from here"
        )
        print(f"--resume PATH, another cluster: return {before:.1f} before, {after:.1f} after")
        assert "restored weights verified on 2 env runner(s)" in (home / "job.log").read_text()
    finally:
        cli("down", "-i", str(other), "--no-logs", "--yes")


def test_the_cells_playbook_resumed_onto_a_remote_learner_goes_on_learning(
    inventory: str, tmp_path: Path
) -> None:
    """`ppo_cells.py` (this project's own environment) submitted, then `--resume JOB` with
    the learner in an actor of its own (`--num-learners 1`), as a GPU learner is: the
    restored weights and optimizer come from a remote learner, not the driver's. On CPU:
    the lab's GPU nodes are simulated (no CUDA for torch), and the device is not the path
    the state takes on a resume."""
    results = tmp_path / "results"
    cells = ["--env-runners", "2", "--train-batch", "1000", "--checkpoint-every", "2"]
    cells += ["--max-env-steps", "10000000"]
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json",
        str(PLAYBOOKS / "ppo_cells.py"), "--", "--max-iterations", "8", *cells,
    )  # fmt: skip
    first = json.loads(out)
    assert code == 0 and first["status"] == "SUCCEEDED", err[-3000:]
    assert latest_home(results / first["job_id"]) == 8
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json", "--resume",
        first["job_id"], str(PLAYBOOKS / "ppo_cells.py"), "--", "--max-iterations", "11",
        "--num-learners", "1", *cells,
    )  # fmt: skip
    again = json.loads(out)
    assert code == 0 and again["status"] == "SUCCEEDED", err[-3000:]
    home = results / again["job_id"]
    assert "restored weights verified on 2 env runner(s)" in (home / "job.log").read_text()
    # the learner was a remote one this time (the first run's was the driver's own)
    learners = [
        json.loads((h / "learners.json").read_text()) for h in (results / first["job_id"], home)
    ]
    assert [[d["remote"] for d in found] for found in learners] == [[False], [True]], learners
    returns = returns_of(home)
    assert sorted(returns) == list(range(1, 12)), returns  # metrics appended
    # CellNetwork's return rises from a fresh policy's by about half (not CartPole's 10x):
    # the resumed run keeps at least half of what the run had learned over a fresh policy
    path = "ppo_cells.py: --resume JOB onto a remote learner (--num-learners 1)"
    fresh, before, after = returns_around(returns, 8, path)
    assert before > 1.2 * fresh, f"the run had not learned before 8: {returns}"
    assert after - fresh > 0.5 * (before - fresh), (
        f"resumed at 8: mean return {before:.2f} before, {after:.2f} after, a fresh "
        f"policy's {fresh:.2f}: {returns}"
    )


def test_tunnel_prints_the_lines_rays_own_cli_needs(inventory: str, tmp_path: Path) -> None:
    log = tmp_path / "tunnel.log"
    tunnel = provisioner_process("tunnel", "-i", inventory, log=log)
    try:
        out = log.with_suffix(".out")
        text = wait_for(
            lambda: "RAY_AUTH_TOKEN_PATH" in out.read_text() and out.read_text(), 60, "the lines"
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        for line in text.splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                env[key] = shlex.split(value)[0]
        assert env["RAY_AUTH_MODE"] == "token"
        ray = Path(sys.executable).with_name("ray")
        listed = subprocess.run(
            [str(ray), "job", "list"], env=env, capture_output=True, text=True, timeout=120
        )
        assert listed.returncode == 0, listed.stderr[-2000:]
        assert "submission_id" in listed.stdout  # Ray's own listing of this cluster's jobs
        without = {k: v for k, v in env.items() if k != "RAY_AUTH_MODE"}
        refused = subprocess.run(
            [str(ray), "job", "list"], env=without, capture_output=True, text=True, timeout=120
        )
        assert refused.returncode != 0  # the auth mode line is needed, not decoration
    finally:
        tunnel.terminate()
        tunnel.wait(30)


def lose_worker(
    lab: LabInfo,
    worker: LabNode | list[LabNode],
    inventory: str,
    proc: subprocess.Popen[bytes],
    when: Any,
    what: str,
    wait: float = 420,
) -> None:
    """Once `when()` holds, the worker's Ray container killed at once (a lost node, mid
    run); then the submit `proc` to its end; the container started again in any case.
    `worker` a list: the one `when()` put in it as it held."""
    name = ray_container(load_inventory(Path(inventory)))
    chosen: list[LabNode] = worker if isinstance(worker, list) else [worker]
    try:
        wait_for(when, 600, what)
        stopped = ssh(lab, chosen[0], f"docker kill {name}")
        assert stopped.returncode == 0, stopped.stderr
        proc.wait(wait)
    finally:
        if proc.poll() is None:
            proc.kill()
        for node in chosen[:1]:
            ssh(lab, node, f"docker start {name}")  # undone in any case


def test_a_worker_stopped_mid_run_with_retries_1_is_repaired_and_resumed(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    results = tmp_path / "results"
    log = tmp_path / "submit.log"
    # Five runners on three nodes of two CPUs: every worker holds at least one.
    args = [*LEARN, "--env-runners", "5"]
    proc = provisioner_process(
        "submit", "-i", inventory, "--results", str(results), "--json", "--verbose",
        "--retries", "1", str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--max-iterations", "16",
        *args, log=log,
    )  # fmt: skip
    # a checkpoint at iteration 8 is on the head: the retry resumes from what the failed
    # attempt left there (its results come home when it ends)
    lose_worker(lab, lab.nodes[1], inventory, proc, lambda: job_reached(log, 9), "iteration 9")
    text = log.read_text(errors="replace")
    doc = json.loads(log.with_suffix(".out").read_text())
    assert proc.returncode == 0 and doc["status"] == "SUCCEEDED", text[-4000:]
    attempts = json.loads((results / doc["job_id"] / "attempts.json").read_text())
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["status"] == "FAILED" and attempts[1]["status"] == "SUCCEEDED"
    assert attempts[1]["resumed_from"] == attempts[0]["job_id"]
    rows = (results / doc["job_id"] / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, 17))  # resumed, not restarted
    resumed_at = resume_point(results / doc["job_id"])
    assert resumed_at >= 8, resumed_at
    assert_learning_goes_on(
        returns_of(results / doc["job_id"]), resumed_at, "--retries 1 after a worker loss"
    )
    code, listed, err = jobs_json("list", "-i", inventory)
    assert code == 0, err[-2000:]
    tries = {j["job_id"]: j["attempt"] for j in listed["jobs"]}
    assert tries[attempts[0]["job_id"]] == 1 and tries[attempts[1]["job_id"]] == 2


def test_down_during_a_followed_job_asks_for_yes_then_stops_it_and_brings_results_home(
    inventory: str, learned: Learned, tmp_path: Path
) -> None:
    results = learned.results
    log = tmp_path / "submit.log"
    # a resumed run: the earlier one's ten iterations and checkpoint, then this one's
    args = ["--max-iterations", "200", "--obs-filter", *LEARN]
    follower = provisioner_process(
        "submit", "-i", inventory, "--results", str(results), "--json", "--resume",
        learned.job, str(PLAYBOOKS / "ppo_cartpole.py"), "--", *args, log=log,
    )  # fmt: skip
    try:
        wait_for(lambda: job_reached(log, 13), 400, "three iterations more")
        job = job_id_in(log)
        assert job is not None
        code, _, err = cli("down", "-i", inventory, "--no-logs")
        assert code == 1 and job in err and "--yes" in err, err[-2000:]
        code, out, err = cli(
            "down", "-i", inventory, "--no-logs", "--yes", "--json", "--results", str(results)
        )
        assert code == 0, err[-3000:]
        assert json.loads(out)["jobs_stopped"][0]["status"] == "STOPPED"
        follower.wait(200)
    finally:
        if follower.poll() is None:
            follower.kill()
    text = log.read_text(errors="replace")
    assert "unexpected" not in text and "Traceback" not in text, text[-3000:]
    doc = json.loads(log.with_suffix(".out").read_text())
    assert follower.returncode == 1 and doc["status"] == "STOPPED", text[-3000:]
    home = results / job
    rows = (home / "metrics.csv").read_text().splitlines()[1:]
    iterations = [int(r.split(",")[0]) for r in rows]
    assert iterations[:13] == list(range(1, 14)), iterations  # nothing lost, counters go on
    assert (home / "progress.json").is_file()
    # the job's own lines, as its follower showed them
    assert re.search(r"resumed from \S+ at iteration 10\b", text), text[-3000:]
    assert "restored weights verified on 2 env runner(s)" in text, text[-3000:]
    assert_learning_goes_on(returns_of(home), 10, "--resume JOB, then down --yes during the run")


SWEEP = """\
cartpole-sweep:
    env: CartPole-v1
    run: PPO
    stop: {training_iteration: 6}
    config:
        lr: {grid_search: [0.0001, 0.0003]}
        train_batch_size_per_learner: {grid_search: [200, 400]}
        minibatch_size: 100
        num_epochs: 1
    seeds: [1, 2]
    checkpoint_frequency: 1
    resources: {env_runners: 0}
"""


def hparams_of(trial: Path) -> dict[str, Any]:
    """The hyperparameters TensorBoard's HParams view shows for a trial: Tune's TBX logger
    writes them into the trial's event file (its session start) at the trial's end. The
    event file is a TFRecord stream; tensorboardX's protobufs read it."""
    import struct

    from tensorboardX.proto import event_pb2, plugin_hparams_pb2

    found: dict[str, Any] = {}
    for path in sorted(trial.glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            record = data[at + 12 : at + 12 + length]
            at += 12 + length + 4
            for value in event_pb2.Event.FromString(record).summary.value:
                if value.metadata.plugin_data.plugin_name != "hparams":
                    continue
                got = plugin_hparams_pb2.HParamsPluginData.FromString(
                    value.metadata.plugin_data.content
                )
                if got.HasField("session_start_info"):
                    for key, v in got.session_start_info.hparams.items():
                        found[key] = (
                            v.number_value if v.HasField("number_value") else v.string_value
                        )
    return found


def running_on(lab: LabInfo, container: str, address: str) -> int:
    """The most iterations a trial still running on the node at Ray `address` has reported:
    the last line of each trial's result.json in the head's Tune staging folder."""
    found = ssh(
        lab,
        lab.nodes[0],
        f"docker exec {container} sh -c 'for f in /tmp/ray/session_latest/artifacts/*/"
        'cartpole-asha/driver_artifacts/*/result.json; do tail -n 1 "$f"; echo; done\'',
    )
    most = 0
    for line in found.stdout.splitlines():
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if isinstance(result, dict) and result.get("node_ip") == address and not result.get("done"):
            most = max(most, int(result.get("training_iteration") or 0))
    return most


def test_a_sweep_under_asha_survives_a_lost_worker_and_names_the_best(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """2 learning rates x 2 batch sizes x 2 seeds from an experiment file under ASHA (max_t
    6, grace 1, halving), at most 4 at once, with --retries 1; a worker's Ray container
    killed once a trial on it has passed its first checkpoint. Every trial ends well:
    those below the median at a rung early (said in sweep.json), at least one with six
    iterations; those the lost worker held go on from their latest checkpoints on the
    nodes that remain (Tune's retry: said in sweep.json and in the progress), the others
    run once; trials ran on all three nodes; the best is named; TensorBoard's HParams and
    `compare` show the sweep. The progress, not a terminal: a line per change of the
    sweep's counts, the last one all 8 done; `jobs list` the same."""
    book = tmp_path / "book"
    book.mkdir()
    asha = SWEEP.replace("cartpole-sweep:", "cartpole-asha:") + (
        "    scheduler: {type: asha, max_t: 6, grace_period: 1, reduction_factor: 2}\n"
    )
    (book / "cartpole-asha.yaml").write_text(asha)
    code, _, err = cli("up", "-i", inventory)  # the test before takes the cluster down
    assert code == 0, err[-3000:]
    results = tmp_path / "r"
    log = tmp_path / "submit.log"
    proc = provisioner_process(
        "submit", "-i", inventory, "--results", str(results), "--retries", "1",
        "--max-concurrent", "4", str(book / "cartpole-asha.yaml"), log=log,
    )  # fmt: skip
    name = ray_container(load_inventory(Path(inventory)))
    # the worker lost: the first one found running a trial past its first checkpoint (it
    # has one to go on from). Where Tune places the trials and which ones ASHA keeps past
    # its first rungs is the run's own: either worker may be the one.
    found: list[LabNode] = []

    def trial_on_a_worker() -> bool:
        for node in lab.nodes[1:]:
            if running_on(lab, name, node.data_address or node.address) >= 2:
                found.append(node)
                return True
        return False

    lose_worker(lab, found, inventory, proc, trial_on_a_worker, "a trial on a worker", 900)
    worker = found[0]
    address = worker.data_address or worker.address  # where its Ray ran
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-4000:]
    job = job_id_in(log)
    assert job is not None, text[-3000:]
    home = results / job
    sweep = json.loads((home / "sweep.json").read_text())
    trials = sweep["trials"]
    assert len(trials) == 8 and all(t["status"] == "TERMINATED" for t in trials), trials
    early = [t for t in trials if t["stopped_early"]]
    assert early and all(t["iterations"] < 6 for t in early), trials
    assert any(t["iterations"] == 6 for t in trials), trials
    assert sweep["best"] == max(trials, key=lambda t: t["final"])["trial"]
    assert sum(t["best_trial"] for t in trials) == 1
    combos = {(t["params"]["lr"], t["params"]["train_batch_size_per_learner"], t["seed"])
              for t in trials}  # fmt: skip
    assert len(combos) == 8 and all(None not in c for c in combos), combos
    # every trial home in its own folder; the nodes they ran on: all three
    nodes: set[str] = set()
    iterations: dict[str, list[int]] = {}
    for path in home.glob("ray_results/cartpole-asha/*/result.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        nodes |= {r["node_ip"] for r in rows}
        iterations[path.parent.name] = [r["training_iteration"] for r in rows]
    assert set(iterations) == {t["trial"] for t in trials}, sorted(iterations)
    assert len(nodes) == 3, nodes
    # TensorBoard's HParams view of the sweep (`tunnel` serves the head's results, these
    # files): each trial's own values of the swept keys
    for t in trials:
        hp = hparams_of(home / "ray_results" / "cartpole-asha" / t["trial"])
        # (RLlib keeps a settable property under its stored name: `_train_batch_...`)
        swept = {k: hp.get(k, hp.get(f"_{k}")) for k in ("lr", "train_batch_size_per_learner")}
        assert swept == {k: t["params"][k] for k in swept}, (t["trial"], hp)
    # `compare` draws the sweep: one group per grid point, its two seeds the band
    png = tmp_path / "sweep.png"
    code, out, err = cli(
        "compare", "--results", str(results), job, "-o", str(png), "--json"
    )  # fmt: skip
    assert code == 0, err[-2000:]
    groups = json.loads(out)["groups"]
    assert len(groups) == 4 and all(sorted(g["seeds"]) == [1, 2] for g in groups), groups
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # cut off by the lost worker: on from its latest checkpoint (at most the iteration in
    # flight again; from the start when it had none yet); the others ran once, each
    # iteration once, and a trial that went on from a checkpoint had run on the worker
    restored = [t["trial"] for t in trials if t["restored"]]
    assert restored, trials
    on_worker = {
        path.parent.name
        for path in home.glob("ray_results/cartpole-asha/*/result.json")
        if address in path.read_text()
    }
    assert set(restored) <= on_worker, (restored, on_worker)
    for trial, seen in iterations.items():
        back = [i for i, (a, b) in enumerate(itertools.pairwise(seen)) if b <= a]
        if trial not in on_worker:
            assert seen == list(range(1, len(seen) + 1)), (trial, seen)
            continue
        assert len(back) <= 1, (trial, seen)  # one restart
        assert all(seen[i] - seen[i + 1] <= 1 for i in back), (trial, seen)
        assert seen[-1] == max(seen), (trial, seen)
    assert (home / "trials.csv").read_text().count("\n") == 9
    # the progress a person read: one line per change of the sweep, the last one every
    # trial done, with the trials run again; each trial's own lines beside them
    lines = [line for line in text.splitlines() if "trials 8: " in line]
    assert len(lines) >= 3 and "8 done" in lines[-1] and "run again" in lines[-1], lines
    said = [line.split("trials 8: ", 1)[1] for line in lines]
    assert all(a != b for a, b in itertools.pairwise(said)), said  # each line a change
    assert re.search(r"trial \d/8 +iter \d", text), text[-3000:]
    # `jobs list`: the same figures, from the job's progress.json on the head
    code, listed, err = jobs_json("list", "-i", inventory)
    assert code == 0, err[-2000:]
    progress = {j["job_id"]: j for j in listed["jobs"]}[job]["progress"]["sweep"]
    counts = [progress[k] for k in ("trials", "done", "running", "pending", "failed")]
    assert counts == [8, 8, 0, 0, 0] and progress["repeated"] >= 1, progress
    assert progress["best"]["value"] == pytest.approx(max(t["final"] for t in trials)), progress


STORED = """\
import json, os, pyarrow.fs as pafs
fs, base = pafs.FileSystem.from_uri(os.environ["RAY_STORAGE"])
where = pafs.FileSelector(base + "/" + os.environ["EXPERIMENT"], allow_not_found=True)
found = fs.get_file_info(where)
states = sorted(i.path for i in found if i.base_name.startswith("experiment_state-"))
out = []
if states:
    with fs.open_input_stream(states[-1]) as stream:
        state = json.loads(stream.read())
    for meta, run in state["trial_data"]:
        meta = json.loads(meta) if isinstance(meta, str) else meta
        run = json.loads(run) if isinstance(run, str) else run
        last = run.get("last_result") or {}
        out.append([meta["trial_id"], meta["status"], last.get("training_iteration", 0)])
print(json.dumps(out))
"""


def stored_trials(
    lab: LabInfo, inventory: str, container: str, job: str, experiment: str
) -> list[tuple[str, str, int]]:
    """(trial id, status, iterations) of each trial in the newest experiment state Tune
    saved in the store: what a restore of the job's experiment starts from."""
    from provisioner.cluster.storage import job_env

    env = {**job_env(load_inventory(Path(inventory)), job), "EXPERIMENT": experiment}
    flags = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    got = ssh(
        lab, lab.nodes[0], f"docker exec {flags} {container} python3 -c {shlex.quote(STORED)}"
    )
    if got.returncode != 0:
        return []
    return [(t, status, int(i)) for t, status, i in json.loads(got.stdout.splitlines()[-1])]


def test_a_sweep_whose_head_is_lost_goes_on_in_the_next_attempt_and_reruns_no_finished_trial(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """2 learning rates x 2 seeds, 10 iterations of at least 3 s each, at most 2 at once,
    with --retries 1; the head's Ray container killed once the experiment state Tune keeps
    in the store (the state a restore starts from) has a trial finished and another past
    its second checkpoint. The attempt is lost with the head's Ray; the next one repairs
    the cluster (`up`), brings the lost attempt's Tune folder home again from the store
    every node shares (it runs beside Ray on the head, not in its container) and restores
    Tune's experiment from it: every trial ends with its 10 iterations; a trial that had
    finished is not run again (each iteration once in its results); a trial cut off goes
    on from its latest checkpoint (`restored`, at most the iteration in flight again);
    the trials not started run once."""
    book = tmp_path / "book"
    book.mkdir()
    text = (
        SWEEP.replace("cartpole-sweep:", "cartpole-head:")
        .replace("training_iteration: 6", "training_iteration: 10")
        .replace(
            "        train_batch_size_per_learner: {grid_search: [200, 400]}\n",
            "        train_batch_size_per_learner: 200\n        min_time_s_per_iteration: 3\n",
        )
    )
    (book / "cartpole-head.yaml").write_text(text)
    results = tmp_path / "r"
    log = tmp_path / "submit.log"
    name = ray_container(load_inventory(Path(inventory)))
    proc = provisioner_process(
        "submit", "-i", inventory, "--results", str(results), "--retries", "1", "--json",
        "--max-concurrent", "2", str(book / "cartpole-head.yaml"), log=log,
    )  # fmt: skip
    at_kill: list[list[tuple[str, str, int]]] = []

    def one_done_one_past_two() -> bool:
        job = job_id_in(log)
        if job is None:
            return False
        stored = stored_trials(lab, inventory, name, job, "cartpole-head")
        done = [t for t in stored if t[1] == "TERMINATED"]
        going = [t for t in stored if t[1] == "RUNNING" and 3 <= t[2] < 10]
        if done and going:
            at_kill.append(stored)
        return bool(at_kill)

    try:
        wait_for(one_done_one_past_two, 600, "a trial done and another past iteration 2")
        killed = ssh(lab, lab.nodes[0], f"docker kill {name}")
        assert killed.returncode == 0, killed.stderr
        proc.wait(900)
    finally:
        if proc.poll() is None:
            proc.kill()
            cli("up", "-i", inventory)  # undone: the module's later tests need the cluster
    said = log.read_text(errors="replace")
    doc = json.loads(log.with_suffix(".out").read_text())
    assert proc.returncode == 0 and doc["status"] == "SUCCEEDED", said[-4000:]
    home = results / doc["job_id"]
    attempts = json.loads((home / "attempts.json").read_text())
    # the head's Ray forgot the job with its container: the attempt's status is unknown
    assert [a["status"] for a in attempts] == ["UNKNOWN", "SUCCEEDED"], attempts
    assert "head" in attempts[0]["message"], attempts
    assert attempts[1]["resumed_from"] == attempts[0]["job_id"]
    assert "Tune's experiment restored from" in said, said[-4000:]
    sweep = json.loads((home / "sweep.json").read_text())
    trials = sweep["trials"]
    assert len(trials) == 4 and all(t["status"] == "TERMINATED" for t in trials), trials
    assert all(t["iterations"] == 10 for t in trials), trials
    seen: dict[str, list[int]] = {}
    ids: dict[str, str] = {}
    for path in home.glob("ray_results/cartpole-head/*/result.json"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        seen[path.parent.name] = [r["training_iteration"] for r in rows]
        ids[path.parent.name] = rows[0]["trial_id"]
    assert set(seen) == {t["trial"] for t in trials}, sorted(seen)
    state = {t: (status, i) for t, status, i in at_kill[0]}
    finished = {t for t, (status, _) in state.items() if status == "TERMINATED"}
    # (a trial running with no iteration yet has no checkpoint: it starts again, once)
    cut = {t: i for t, (status, i) in state.items() if status == "RUNNING" and i >= 1}
    again = {ids[t["trial"]] for t in trials if t["restored"]}
    assert finished and cut and set(cut) <= again, (state, trials)  # the positive control
    assert not finished & again, (state, trials)
    for trial, iterations in seen.items():
        tid = ids[trial]
        # its checkpoints home (a trial made after the restore: in the new attempt's
        # storage, which is what comes home)
        held = len(list((home / "ray_results" / "cartpole-head" / trial).glob("checkpoint_*")))
        if tid in finished or tid not in cut:  # done before the loss, or not yet started
            assert iterations == list(range(1, 11)), (trial, state.get(tid), iterations)
            assert held == 10, (trial, held)
            continue
        assert held >= 1, (trial, held)
        # on from the checkpoint the state held (not from the start), to the stop
        back = [i for i, (a, b) in enumerate(itertools.pairwise(iterations)) if b <= a]
        assert len(back) <= 1 and iterations[-1] == 10, (trial, cut[tid], iterations)
        assert all(iterations[i] - iterations[i + 1] <= 1 for i in back), (trial, iterations)
        assert sorted(set(iterations)) == list(range(1, 11)), (trial, iterations)
