"""The playbook under SageMaker's training contract, run by the SageMaker SDK's own local
mode (`ModelTrainer`, `Mode.LOCAL_CONTAINER`: docker compose on this machine's dockerd).

No lab for the SageMaker runs: the SDK's containers are this machine's; the host-mode lab
is the cluster runs move to and from. Runs move both ways and learning goes on: PPO
CartPole with 1000 steps an iteration (test_long_runs's LEARN) learns within 10
iterations, so each resume point is past a fresh policy's return, and the 3 iterations
after it are compared with the 3 before (`assert_learning_goes_on`). The chain:

1. 2 instances, stopped by SIGTERM past iteration 10 (a checkpoint home);
2. SageMaker -> SageMaker: that checkpoint, 2 instances, run to completion;
3. SageMaker -> cluster: `submit --resume PATH` on the lab (priced by the inventory);
4. cluster -> SageMaker: `sagemaker run --resume JOB` with that cluster job's id, its
   checkpoint from this machine's results folder through the checkpoint channel.
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
from provisioner.sagemaker.local import ca_label
from tests.e2e.faults.lab import edited_inventory
from tests.e2e.test_long_runs import assert_learning_goes_on, resume_point, returns_of

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"
# test_long_runs's LEARN, the env runners given per run
LEARN = ["--train-batch", "1000", "--checkpoint-every", "2", "--target-return", "1e9"]
LEARN += ["--max-env-steps", "10000000"]
STOP_AFTER = 10  # the SIGTERM goes once the checkpoint of this iteration is home


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


def _iterations(home: Path) -> list[int]:
    return [int(r["iteration"]) for r in _rows(home / "metrics.csv")]


def _returns(label: str, home: Path, at: int) -> tuple[float, float]:
    """Learning goes on past the resume point `at` (the log's own), figures printed."""
    assert resume_point(home) == at
    before, after = assert_learning_goes_on(returns_of(home), at, label)
    print(f"{label}: resumed at {at}, mean return {before:.1f} before, {after:.1f} after")
    return before, after


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
    SageMaker stops a job: SIGTERM to every training container once the run has learned
    (the checkpoint of iteration STOP_AFTER is in)."""
    results = tmp_path_factory.mktemp("sagemaker") / "results"
    started = time.monotonic()
    proc = subprocess.Popen(
        _run_args(results, image_pin, "--instance-count", "2", "--", "--max-iterations",
                  "200", "--env-runners", "3", *LEARN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        home = _job_dir(results, time.monotonic() + 120)
        deadline = time.monotonic() + 900
        while not (home / "checkpoints" / f"iter-{STOP_AFTER:06d}").is_dir():
            assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, f"no checkpoint {STOP_AFTER} within 900 s"
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
    assert stopped_at >= STOP_AFTER
    assert (home / summary["checkpoint"]).is_dir() and summary["checkpoint"].endswith(
        f"iter-{stopped_at:06d}"
    )
    # the final checkpoint and the metrics also came out through /opt/ml/model
    assert (home / "model" / summary["checkpoint"] / "rllib_checkpoint.json").is_file()
    assert _iterations(home / "model") == list(range(1, stopped_at + 1))
    # env runners on both containers (the Ray head on algo-1, the worker joined by name)
    runners = json.loads((home / "runners.json").read_text())
    assert len({r["host"] for r in runners}) == 2, runners
    assert summary["cluster_nodes"] == 2
    assert summary["sagemaker"]["instance_count"] == 2
    assert summary["sagemaker"]["instance_hours"] > 0
    assert (home / "training.png").is_file() and (home / "job.log").is_file()
    assert _containers(home.name, all_=True) == [], "the job's containers are gone"


def test_the_stopped_run_continues_on_two_instances_to_the_end_and_goes_on_learning(
    stopped: Stopped, image_pin: Path, tmp_path: Path
) -> None:
    """SageMaker -> SageMaker, `sagemaker run --resume PATH` through the checkpoint
    channel: 2 instances to completion, env runners on both, the checkpoints and metrics
    home, the return where it was, and the cost of the instance-hours at the price given."""
    assert stopped.doc["status"] == "stopped", stopped.err[-3000:]
    stopped_at = stopped.doc["summary"]["iterations"]
    more = stopped_at + 3
    code, doc, err = _finish(
        subprocess.Popen(
            _run_args(tmp_path / "results", image_pin, "--instance-count", "2", "--resume",
                      str(stopped.home), "--price-per-hour", "0.5", "--", "--max-iterations",
                      str(more), "--env-runners", "3", *LEARN),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        600,
    )  # fmt: skip
    assert code == 0 and doc["status"] == "completed", (code, doc, err[-3000:])
    again = Path(doc["results"])
    summary = doc["summary"]
    assert summary["iterations"] == more and summary["stopped_by"] == "max_iterations"
    assert _iterations(again) == list(range(1, more + 1))
    steps = [int(r["env_steps"]) for r in _rows(again / "metrics.csv")]
    assert steps == sorted(steps) and steps[stopped_at] > steps[stopped_at - 1]
    _returns("SageMaker -> SageMaker (2 instances)", again, stopped_at)
    # this run's env runners on both hosts (runners.json is its own, not the seeded run's)
    runners = json.loads((again / "runners.json").read_text())
    assert len({r["host"] for r in runners}) == 2 and summary["cluster_nodes"] == 2, runners
    # checkpoints home while it ran, and the final one with the metrics through the model
    assert summary["checkpoint"] == f"checkpoints/iter-{more:06d}"
    assert (again / summary["checkpoint"] / "rllib_checkpoint.json").is_file()
    assert (again / "model" / summary["checkpoint"] / "rllib_checkpoint.json").is_file()
    assert _iterations(again / "model") == list(range(1, more + 1))
    # cost: every instance for the whole job, at the price given
    billed = summary["sagemaker"]
    assert billed["instance_count"] == 2 and billed["price_per_instance_hour"] == 0.5
    assert summary["cost"] == {
        "unit": "instance-hour",
        "hours": billed["instance_hours"],
        "price_per_hour": 0.5,
        "cost": round(billed["instance_hours"] * 0.5, 5),
    }
    assert billed["instance_hours"] > 0
    assert _containers(again.name, all_=True) == [], "the job's containers are gone"


@dataclass
class OnCluster:
    results: Path  # this machine's results folder of the cluster job
    doc: Any
    at: int  # the SageMaker run's iteration it continued from


@pytest.fixture(scope="module")
def on_cluster(
    stopped: Stopped, host_lab: LabInfo, tmp_path_factory: pytest.TempPathFactory
) -> OnCluster:
    """`submit --resume PATH` with a SageMaker job's results directory, on the host-mode
    lab (Ray from the nodes' own Python: the same Ray and RLlib as the image), its
    inventory giving a price per node-hour."""
    from tests.e2e.helpers import cli

    assert stopped.doc["status"] == "stopped", stopped.err[-3000:]
    stopped_at = stopped.doc["summary"]["iterations"]
    tmp = tmp_path_factory.mktemp("cluster")
    inventory = str(
        edited_inventory(host_lab.inventory, tmp / "priced.yaml", price_per_node_hour=0.25)
    )
    code, _, err = cli("up", "-i", inventory)
    assert code == 0, err[-3000:]
    more = ["--max-iterations", str(stopped_at + 3), "--env-runners", "2", *LEARN]
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(tmp / "results"), "--json",
        "--resume", str(stopped.home), str(PLAYBOOK), "--", *more,
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    return OnCluster(tmp / "results", doc, stopped_at)


def test_the_stopped_run_continues_on_the_lab_cluster_and_goes_on_learning(
    on_cluster: OnCluster,
) -> None:
    """SageMaker -> cluster: the same checkpoint format and metrics, so the cluster run
    goes on from the SageMaker run's iteration and return; its cost is its node-hours at
    the inventory's price, in the shape of a SageMaker job's."""
    at, doc = on_cluster.at, on_cluster.doc
    resumed = on_cluster.results / doc["job_id"]
    assert _iterations(resumed) == list(range(1, at + 4))
    assert "restored weights verified on 2 env runner(s)" in (resumed / "job.log").read_text()
    _returns("SageMaker -> cluster", resumed, at)
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["node_hours"] > 0
    assert summary["cost"] == {
        "unit": "node-hour",
        "hours": summary["node_hours"],
        "price_per_hour": 0.25,
        "cost": round(summary["node_hours"] * 0.25, 5),
    }


def test_a_cluster_job_continues_on_sagemaker_and_goes_on_learning(
    on_cluster: OnCluster, image_pin: Path
) -> None:
    """cluster -> SageMaker: `sagemaker run --resume JOB` with the cluster job's id; its
    latest checkpoint and metrics from this machine's results folder go in through the
    checkpoint channel, and the run goes on from the cluster's iteration and return."""
    job = on_cluster.doc["job_id"]
    at = on_cluster.doc["summary"]["iterations"]
    cluster_home = on_cluster.results / job
    assert (cluster_home / "checkpoints" / f"iter-{at:06d}").is_dir()
    code, doc, err = _finish(
        subprocess.Popen(
            _run_args(on_cluster.results, image_pin, "--instance-count", "1", "--resume", job,
                      "--", "--max-iterations", str(at + 3), "--env-runners", "1", *LEARN),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        600,
    )  # fmt: skip
    assert code == 0 and doc["status"] == "completed", (code, doc, err[-3000:])
    assert doc["resumed_from"] == job
    home = Path(doc["results"])
    assert home.parent == on_cluster.results and home.name != job
    assert doc["summary"]["iterations"] == at + 3
    assert _iterations(home) == list(range(1, at + 4))
    # the channel held the cluster's own checkpoint
    assert f"checkpoints/iter-{at:06d}" in (home / "job.log").read_text()
    _returns("cluster -> SageMaker", home, at)


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


HOSTILE = """\
import argparse, os, sys
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--outside", required=True)
out = Path(parser.parse_args().outside)  # a folder of the machine that runs the job
results = Path(os.environ["PROVISIONER_RESULTS_DIR"])  # the checkpoint channel
model = Path(os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
(results / "kept.txt").write_text("a normal result\\n")
os.symlink(out / "victim.txt", results / "failure")
os.symlink(out / "summary.json", results / "summary.json")
os.symlink(out / "victim-dir", results / "model")
os.mkfifo(results / "pipe")
model.mkdir(parents=True, exist_ok=True)
(model / "weights.txt").write_text("model weights\\n")
os.symlink(out / "secret.txt", model / "stolen.txt")
os.symlink(out, model / "stolen-dir")
print("HOSTILE-JOB-FAILS-ON-PURPOSE", flush=True)
sys.exit(3)
"""


def test_a_hostile_jobs_links_write_nothing_outside_its_results(
    image_pin: Path, tmp_path: Path
) -> None:
    """A job's code runs as root over the folders its containers mount. This one plants
    links to this machine's files where the tool writes after the run (`failure`,
    `summary.json`, `model` in its results; links and a FIFO in /opt/ml/model) and fails:
    nothing outside is written or read into the results, and what it wrote as plain files
    (a result, the model) and its failure still come home."""
    outside = tmp_path / "outside"
    (outside / "victim-dir").mkdir(parents=True)
    (outside / "victim.txt").write_text("the user's own file\n")
    (outside / "summary.json").write_text('{"iterations": 7}')
    (outside / "secret.txt").write_text("SECRET-OF-THIS-MACHINE\n")
    before = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    job = tmp_path / "job"
    job.mkdir()
    (job / "hostile.py").write_text(HOSTILE)
    results = tmp_path / "results"
    args = _run_args(results, image_pin, "--instance-count", "1", "--", "--outside", str(outside))
    args[args.index(str(PLAYBOOK))] = str(job / "hostile.py")
    code, doc, err = _finish(
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), 300
    )
    # nothing outside changed: no failure text, summary or model written through a link
    after = {p.name: p.read_bytes() for p in outside.iterdir() if p.is_file()}
    assert after == before, (after, doc, err[-3000:])
    assert list((outside / "victim-dir").iterdir()) == [], (doc, err[-3000:])
    assert code == 1 and doc.get("status") == "failed", (code, doc, err[-3000:])
    home = Path(doc["results"])
    # and nothing outside was read into the results
    assert not [p for p in home.rglob("*") if p.is_symlink()]
    files = [p for p in home.rglob("*") if p.is_file()]
    assert not [p for p in files if b"SECRET-OF-THIS-MACHINE" in p.read_bytes()]
    assert not (home / "summary.json").exists() and doc["summary"] is None
    # positive controls: the job's plain files came home, and its failure is reported
    assert (home / "kept.txt").read_text() == "a normal result\n"
    assert (home / "model" / "weights.txt").read_text() == "model weights\n"
    assert "HOSTILE-JOB-FAILS-ON-PURPOSE" in doc["failure"]
    assert "exited with status 3" in doc["failure"]
    failure = home / "failure"
    assert not failure.is_symlink() and "HOSTILE-JOB-FAILS-ON-PURPOSE" in failure.read_text()
    assert _containers(home.name, all_=True) == []


PROBE = """\
import json, os, time
from pathlib import Path

import ray

ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
results = Path(os.environ["PROVISIONER_RESULTS_DIR"])
(results / "nodes.txt").write_text(str(sum(1 for n in ray.nodes() if n["Alive"])))
release = Path("/tmp/release")  # made by the test once it has tried the head's Ray
deadline = time.monotonic() + 600
while not release.exists() and time.monotonic() < deadline:
    time.sleep(1)
(results / "summary.json").write_text(json.dumps({"iterations": 0}))
"""
# a driver of the head's Ray (its GCS by the head's name), as anyone on the job's network
CLIENT = (
    "import ray; ray.init(address='algo-1:6379', logging_level='ERROR', log_to_driver=False); "
    "print('NODES', sum(1 for n in ray.nodes() if n['Alive']))"
)
RAY_PYTHON = "/opt/ray/bin/python3"  # the image's Python, with its Ray
QUICK_GIVE_UP = ["RAY_py_gcs_connect_timeout_s=5", "RAY_gcs_rpc_server_reconnect_timeout_s=5"]
TOKEN_ENV = ["RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN_PATH=/opt/ml/input/data/auth/token"]
TLS = "/run/provisioner/tls"  # the node's own certificate and key, issued at its start
TLS_ENV = [
    "RAY_USE_TLS=1",
    f"RAY_TLS_SERVER_CERT={TLS}/node.crt",
    f"RAY_TLS_SERVER_KEY={TLS}/node.key",
    f"RAY_TLS_CA_CERT={TLS}/ca.crt",
]


def _names(job_id: str) -> dict[str, str]:
    """The job's running containers by host: algo-1 -> its container's name."""
    out = subprocess.run(
        ["docker", "ps", "--filter", f"name=sm-{job_id}_", "--format", "{{.Names}}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return {h: n for n in out for h in ("algo-1", "algo-2") if h in n}


def _exec(container: str, *argv: str, limit: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", "exec", container, "timeout", str(limit), *argv],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_jobs_ray_refuses_a_driver_without_its_token_or_tls(
    image_pin: Path, tmp_path: Path
) -> None:
    """Ray in a job's containers has a token and TLS of the job's own: its GCS port answers
    a TLS handshake with a certificate of the job's CA; a driver on the job's network with
    the token but without TLS is refused, and one with TLS but without the token too; with
    both (the positive control) the same driver sees both hosts, and the job completes on
    both. The token is in no log, no variable and no output of the run."""
    job = tmp_path / "probe"
    job.mkdir()
    (job / "probe.py").write_text(PROBE)
    results = tmp_path / "results"
    args = _run_args(results, image_pin, "--instance-count", "2")
    args[args.index(str(PLAYBOOK))] = str(job / "probe.py")
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        home = None
        while home is None or not (home / "nodes.txt").is_file():
            assert proc.poll() is None, f"the run ended early: {proc.communicate()[1][-3000:]}"
            assert time.monotonic() < deadline, "the job's playbook did not start in 600 s"
            found = [p for p in results.glob("probe-*") if p.is_dir()]
            home = found[0] if found else None
            time.sleep(1)
        names = _names(home.name)
        assert set(names) == {"algo-1", "algo-2"}, names
        networks = {
            n: json.loads(
                subprocess.run(
                    ["docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}", name],
                    capture_output=True,
                    text=True,
                ).stdout
            ).keys()
            for n, name in names.items()
        }
        token = _exec(names["algo-1"], "cat", "/opt/ml/input/data/auth/token").stdout.strip()
        env = _exec(names["algo-2"], "env").stdout
        handshake = _exec(
            names["algo-2"], "sh", "-c", "openssl s_client -connect algo-1:6379 -CAfile "
            "/opt/ml/input/data/auth/ca.crt -no-CApath -no-CAstore -verify_return_error "
            "</dev/null 2>&1",
        )  # fmt: skip
        modes = _exec(names["algo-2"], "stat", "-c", "%n %a", TLS, f"{TLS}/node.key").stdout
        without = _exec(
            names["algo-2"], "env", "-u", "RAY_AUTH_MODE", "-u", "RAY_AUTH_TOKEN_PATH",
            *TLS_ENV, RAY_PYTHON, "-c", CLIENT,
        )  # fmt: skip
        # a cleartext client's handshake never completes: Ray's client tries again until
        # its GCS timeouts (here 5 s each), or is stopped after 40 s: refused either way
        # (the positive control below connects in seconds)
        without_tls = _exec(
            names["algo-2"], "env", "-u", "RAY_USE_TLS", *TOKEN_ENV, *QUICK_GIVE_UP,
            RAY_PYTHON, "-c", CLIENT, limit=40,
        )  # fmt: skip
        with_both = _exec(names["algo-2"], "env", *TLS_ENV, *TOKEN_ENV, RAY_PYTHON, "-c", CLIENT)
        _exec(names["algo-1"], "touch", "/tmp/release")
        code, doc, err = _finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the head's GCS port speaks TLS, with a certificate of the job's own CA for algo-1
    shown = handshake.stdout
    assert "Verify return code: 0 (ok)" in shown, shown[-3000:]
    assert f"{ca_label(home.name)} CA" in shown and "CN = algo-1" in shown, shown[-3000:]
    assert modes.split() == [TLS, "700", f"{TLS}/node.key", "600"], modes
    refused = without.stdout + without.stderr
    assert without.returncode != 0 and "NODES" not in without.stdout, refused[-3000:]
    assert "InvalidAuthToken" in refused or "nauthenticated" in refused, refused[-3000:]
    cleartext = without_tls.stdout + without_tls.stderr
    assert without_tls.returncode != 0 and "NODES" not in without_tls.stdout, cleartext[-3000:]
    # positive controls: with the job's token and TLS the same driver sees both hosts, and
    # the job completes on both
    assert with_both.returncode == 0, (with_both.stdout + with_both.stderr)[-3000:]
    assert "NODES 2" in with_both.stdout, with_both.stdout
    assert code == 0 and doc["status"] == "completed", (code, doc, err[-3000:])
    assert (home / "nodes.txt").read_text() == "2"
    # on a network of the job's own (not the `sagemaker-local` every local-mode job
    # shares), taken down with the job
    own = f"sagemaker-local-{home.name}"
    assert {n: set(v) for n, v in networks.items()} == {"algo-1": {own}, "algo-2": {own}}
    left = subprocess.run(
        ["docker", "network", "ls", "-q", "--filter", f"name=^{own}$"],
        capture_output=True,
        text=True,
    )
    assert left.returncode == 0 and left.stdout.strip() == "", left
    # the token: 64 hex digits, given by file only (not in the containers' variables, the
    # run's output or its log)
    assert len(token) == 64 and all(c in "0123456789abcdef" for c in token), len(token)
    assert token not in env and token not in err and token not in json.dumps(doc)
    assert token not in (home / "sagemaker.log").read_text()
