"""`train`: the training image's SageMaker entry point (`docker run IMAGE train`).

On `hosts[0]` it starts Ray's head, waits until every host has joined, and runs the
playbook on it through the same `rlrun` loop as a cluster job, with its results directory
in the checkpoint directory (`/opt/ml/checkpoints`, which SageMaker syncs): metrics.csv,
progress.json, runners.json, checkpoints/iter-NNNNNN every `--checkpoint-every` iterations,
job.log. A checkpoint already there (SageMaker puts the checkpoint location's contents
back before a job starts) is continued from. At the end the final checkpoint and the
metrics go to /opt/ml/model; a failure's reason to /opt/ml/output/failure, and the exit
status is 1.

Every other host joins the head by its host name (no S3 rendezvous) and stays until the
head's Ray is gone.

SIGTERM (SageMaker's stop; it waits 120 s before SIGKILL) goes to the playbook, which
finishes its iteration, saves a checkpoint and exits (`PROVISIONER_CHECKPOINT_ON_SIGTERM`);
a worker given SIGTERM keeps its Ray node up until the head is gone, so the checkpoint can
still reach its env runners, for at most STOP_GRACE_S.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import FrameType

from . import contract

RAY_PORT = 6379
JOIN_TIMEOUT_S = float(os.environ.get("PROVISIONER_SM_JOIN_TIMEOUT_S", "300"))
STOP_GRACE_S = 110.0  # within SageMaker's 120 s between SIGTERM and SIGKILL
HEAD_LOST_CHECKS = 3  # the head's port refused this many times in a row: the head is gone
MODEL_FILES = ("metrics.csv", "metrics.json", "summary.json", "runners.json", "learners.json")
LOG_FILE = "job.log"
TAIL_LINES = 40
NODES_SNIPPET = (
    "import ray; ray.init(address='auto', logging_level='ERROR', log_to_driver=False); "
    "print(sum(1 for n in ray.nodes() if n['Alive']))"
)


class Stop:
    """SIGTERM's arrival, and the process to pass it to."""

    def __init__(self) -> None:
        self.requested_at: float | None = None
        self.child: subprocess.Popen[bytes] | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()
            log(f"SIGTERM: stopping (at most {STOP_GRACE_S:.0f} s)")
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)


def log(message: str) -> None:
    print(f"[train] {message}", flush=True)


def read_text(path: Path) -> str | None:
    return path.read_text() if path.is_file() else None


def node_address(host: str) -> str:
    """This host's address as the other hosts reach it (its name resolved)."""
    return socket.gethostbyname(host)


def reachable(host: str, port: int, timeout: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ray_start_args(env: Mapping[str, str]) -> list[str]:
    """Options both kinds of node take: resources and the object store's size, if set."""
    out = ["--disable-usage-stats"]
    for var, flag in (
        ("PROVISIONER_SM_NUM_CPUS", "--num-cpus"),
        ("PROVISIONER_SM_NUM_GPUS", "--num-gpus"),
        ("PROVISIONER_SM_OBJECT_STORE_BYTES", "--object-store-memory"),
    ):
        if env.get(var):
            out.append(f"{flag}={int(env[var])}")
    return out


def alive_nodes() -> int:
    done = subprocess.run(
        [sys.executable, "-c", NODES_SNIPPET], capture_output=True, text=True, timeout=60
    )
    lines = done.stdout.strip().splitlines()
    return int(lines[-1]) if done.returncode == 0 and lines and lines[-1].isdigit() else 0


def wait_for_hosts(expected: int, stop: Stop) -> None:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    seen = 0
    while stop.requested_at is None:
        seen = alive_nodes()
        if seen >= expected:
            log(f"all {expected} host(s) in the Ray cluster")
            return
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"only {seen} of {expected} hosts joined Ray's head within "
                f"{JOIN_TIMEOUT_S:.0f} s; see the other hosts' logs"
            )
        time.sleep(2)


def latest_checkpoint(results: Path) -> Path | None:
    found = sorted(p for p in (results / "checkpoints").glob("iter-*") if p.is_dir())
    return found[-1] if found else None


def run_playbook(job: contract.Job, code: Path, results: Path, stop: Stop) -> tuple[int, str]:
    """The playbook on this (the head) node, its output to stdout and job.log; its exit
    status and its last lines."""
    env = dict(os.environ)
    env.update(
        PROVISIONER_RESULTS_DIR=str(results),
        PROVISIONER_CHECKPOINT_ON_SIGTERM="1",
        RAY_ADDRESS="auto",
        PYTHONUNBUFFERED="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    resume = latest_checkpoint(results)
    if resume is not None:
        env["PROVISIONER_RESUME_FROM"] = str(resume)
        log(f"continuing from {resume}")
    command = [sys.executable, "-u", job.playbook, *job.args]
    log("running " + " ".join(command))
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    with open(results / LOG_FILE, "ab") as out:
        child = subprocess.Popen(
            command, cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        stop.child = child
        if stop.requested_at is not None:
            child.send_signal(signal.SIGTERM)
        assert child.stdout is not None
        for line in child.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.flush()
            out.write(line)
            out.flush()
            tail.append(line.decode(errors="replace").rstrip())
        rc = child.wait()
    return rc, "\n".join(tail)


def export_model(results: Path, model: Path) -> None:
    """The final checkpoint and the metrics into the model directory."""
    model.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (results / name).is_file():
            shutil.copy2(results / name, model / name)
    summary = json.loads((results / "summary.json").read_text())
    if summary.get("checkpoint"):
        src = results / summary["checkpoint"]
        shutil.copytree(src, model / summary["checkpoint"], dirs_exist_ok=True)


def head(res: contract.Resources, env: Mapping[str, str], stop: Stop) -> int:
    hyper = contract.parse_hyperparameters(
        read_text(Path(contract.CONFIG_DIR / "hyperparameters.json")), env
    )
    job = contract.job_of(hyper)
    code = Path(contract.channel_dir(contract.CODE_CHANNEL, env))
    if not (code / job.playbook).is_file():
        raise contract.ContractError(f"{job.playbook} is not in the code channel ({code})")
    results = Path(contract.checkpoint_dir(env))
    results.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "ray",
            "start",
            "--head",
            f"--port={RAY_PORT}",
            f"--node-ip-address={node_address(res.current_host)}",
            "--include-dashboard=false",
            *ray_start_args(env),
        ],
        check=True,
    )
    try:
        wait_for_hosts(len(res.hosts), stop)
        if stop.requested_at is not None:
            log("stopped before training began")
            return 0
        rc, tail = run_playbook(job, code, results, stop)
        if rc != 0 and stop.requested_at is not None and not (results / "summary.json").is_file():
            log(f"stopped before the playbook could checkpoint (status {rc})")
            return 0
        if rc != 0:
            raise RuntimeError(f"playbook {job.playbook} exited with status {rc}:\n{tail}")
        export_model(results, Path(contract.model_dir(env)))
        log(f"done; model and metrics in {contract.model_dir(env)}")
        return 0
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True)


def worker(res: contract.Resources, env: Mapping[str, str], stop: Stop) -> int:
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while not reachable(res.head, RAY_PORT):
        if stop.requested_at is not None:
            return 0
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the head {res.head}:{RAY_PORT} did not answer within {JOIN_TIMEOUT_S:.0f} s"
            )
        time.sleep(1)
    subprocess.run(
        [
            "ray",
            "start",
            f"--address={res.head}:{RAY_PORT}",
            f"--node-ip-address={node_address(res.current_host)}",
            *ray_start_args(env),
        ],
        check=True,
    )
    log(f"joined the head {res.head}")
    lost = 0
    try:
        while lost < HEAD_LOST_CHECKS:
            if (
                stop.requested_at is not None
                and time.monotonic() - stop.requested_at > STOP_GRACE_S
            ):
                log("the head is still up after the grace period; leaving")
                break
            lost = 0 if reachable(res.head, RAY_PORT) else lost + 1
            time.sleep(1)
        log("the head's Ray is gone; leaving")
        return 0
    finally:
        subprocess.run(["ray", "stop", "--force"], capture_output=True)


def write_failure(env: Mapping[str, str], reason: str) -> None:
    out = Path(contract.output_dir(env))
    out.mkdir(parents=True, exist_ok=True)
    (out / contract.FAILURE_FILE).write_text(contract.failure_text(reason))


def use_token(environ: MutableMapping[str, str]) -> None:
    """Every Ray process of this host (`ray start`, the playbook, the node count) with the
    job's token: refused (ContractError) when the `auth` channel holds none, since a Ray
    without one runs the code of anyone who reaches its port."""
    token = contract.token_path(environ)
    if not Path(token).is_file():
        raise contract.ContractError(
            f"no Ray token at {token} (the `{contract.AUTH_CHANNEL}` channel); Ray is not "
            "started without one"
        )
    environ.update(contract.ray_auth_env(token))


def main(argv: list[str] | None = None) -> int:
    stop = Stop()
    signal.signal(signal.SIGTERM, stop.handle)
    env = dict(os.environ)
    try:
        use_token(os.environ)  # inherited by every process started here
        env = dict(os.environ)
        res = contract.parse_resources(
            read_text(Path(contract.CONFIG_DIR / "resourceconfig.json")), env
        )
        log(f"{res.current_host} of {list(res.hosts)} ({res.instance_type or 'instance'})")
        return head(res, env, stop) if res.is_head else worker(res, env, stop)
    except (contract.ContractError, RuntimeError, OSError, subprocess.SubprocessError) as e:
        reason = f"{type(e).__name__}: {e}" if not isinstance(e, RuntimeError) else str(e)
        log(f"failed: {reason}")
        write_failure(env, reason)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
