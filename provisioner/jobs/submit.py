"""Submit a playbook as a Ray job, follow it, bring its results home.

The job outlives the client: Ctrl-C (or a killed `submit`, a dropped connection) only
stops following, never the job; `provisioner jobs logs JOB --follow` picks it up again
and `jobs stop JOB` stops it. Nothing here prints: lines of the job's log go to the
handlers, progress to `report`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provisioner.errors import InputError, OperationError
from provisioner.jobs.client import JOB_LOG_CAP, job_log, refused
from provisioner.jobs.home import Results, bring_home, finish, tail
from provisioner.jobs.link import Link, Target
from provisioner.jobs.spec import EXCLUDES, JobSpec
from provisioner.jobs.stream import Followed, Handlers, follow
from provisioner.jobs.upload import Upload, plan_upload
from provisioner.local import state_root
from provisioner.node import layout

SUCCEEDED = "SUCCEEDED"
STOPPED = "STOPPED"
TAIL_LINES = 20


@dataclass
class JobOutcome:
    """How a job ended (or where it was when we stopped following) and what came home."""

    job_id: str
    status: str
    results: Results
    log_tail: list[str] = field(default_factory=list)
    message: str = ""
    interrupted: bool = False
    detached: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    upload: Upload | None = None  # what was sent of the playbook's directory
    lost_node: bool = False  # the job's log shows a node, worker or head going away
    # an experiment file's evaluation after it (its job, status and eval.json's figures)
    evaluation: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED or (self.detached and not self.interrupted)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "ok": self.ok,
            "detached": self.detached,
            "interrupted": self.interrupted,
            "message": self.message,
            **self.results.to_json(),
            "log_tail": self.log_tail,
            "attempts": self.attempts,
            "upload": self.upload.to_json() if self.upload else None,
            **({"evaluation": self.evaluation} if self.evaluation is not None else {}),
        }


SUBMITTED_FILE = "submitted.json"  # in results/JOB/: the job as it was handed over


def keep_submitted(results_root: Path, spec: JobSpec, nodes: int | None = None) -> None:
    """results/JOB/submitted.json: the playbook (or experiment file) and its arguments as
    handed to the cluster, kept with the run's results here (a run repeated from them),
    and the number of nodes the cluster had (the inventory's; `compare`'s node-hours)."""
    import json

    from provisioner.remote.receive import ensure_directory, write_file

    home = results_root / spec.job_id
    ensure_directory(home)
    body = {
        "job_id": spec.job_id,
        "playbook": spec.playbook.name,
        "args": list(spec.args),
        "runner": spec.runner or None,
        "attempt": spec.attempt,
        "resumed_from": spec.resumed_from or None,
        "nodes": nodes,
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_file(home, SUBMITTED_FILE, (json.dumps(body, indent=1) + "\n").encode())


def upload_for(spec: JobSpec) -> Upload:
    """What Ray will send of the playbook's directory (obvious secrets left out)."""
    return plan_upload(spec.working_dir, [*EXCLUDES, *spec.excludes], state_root())


def upload_line(upload: Upload) -> str:
    """One line saying what is sent: counts, and every file left out as a secret."""
    line = f"sending {len(upload.files)} file(s), {upload.size / 1e6:.1f} MB of {upload.directory}"
    if upload.secrets:
        line += f"; left out as secrets: {', '.join(upload.secrets)}"
    return line


def local_help(spec: JobSpec) -> str | None:
    """`-- --help`: the playbook's usage, read on this machine in a second instead of a
    cluster job. None when the playbook cannot start here (then the cluster answers)."""
    import subprocess
    import sys

    try:
        done = subprocess.run(
            [sys.executable, spec.playbook.name, *spec.args],
            cwd=spec.working_dir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def start(link: Link, spec: JobSpec) -> None:
    """Hand `spec` to the cluster's Jobs API."""
    from ray.exceptions import AuthenticationError

    try:
        link.client.submit_job(
            entrypoint=spec.entrypoint(),
            submission_id=spec.job_id,
            runtime_env=spec.runtime_env(),
            metadata=spec.metadata(),
        )
    except AuthenticationError as exc:
        raise refused(link.url, True) from exc
    except (RuntimeError, ValueError) as exc:
        raise OperationError(
            f"the cluster did not accept job {spec.job_id}: {exc}",
            "check the playbook directory (it travels as the working_dir, at most 500 MiB)",
        ) from exc


def prepare_results(link: Link, job_id: str) -> None:
    """Make the job's results directory on the head as the SSH user, so that this tool
    can add to it later (a recorded status, a checkpoint to resume from)."""
    assert link.inventory is not None
    directory = layout.node_results_dir(link.inventory.cluster, job_id)
    link.head().run(f"mkdir -p {directory}", timeout=60).check()


def submit(
    target: Target,
    spec: JobSpec,
    results_root: Path,
    *,
    handlers: Handlers | None = None,
    detach: bool = False,
    prepare: Callable[[Link], None] | None = None,
) -> JobOutcome:
    """Run `spec` on the cluster; follow it unless `detach`; return how it ended.

    `prepare(link)` runs before the job is handed over (e.g. to put a checkpoint to
    resume from on the head)."""
    h = handlers or Handlers()
    home = results_root / spec.job_id
    upload = hand_over(target, spec, h, prepare)
    keep_submitted(results_root, spec, target.node_count)
    if detach:
        return JobOutcome(spec.job_id, "PENDING", Results(home), detached=True, upload=upload)
    outcome = follow_to_end(target, spec.job_id, results_root, h)
    outcome.upload = upload
    return outcome


def hand_over(
    target: Target,
    spec: JobSpec,
    handlers: Handlers | None = None,
    prepare: Callable[[Link], None] | None = None,
) -> Upload:
    """Hand `spec` to the cluster (its results directory on the head made first, then
    `prepare(link)`); return what was sent of the playbook's directory."""
    h = handlers or Handlers()
    upload = upload_for(spec)
    spec = replace(spec, excludes=tuple(upload.excludes[len(EXCLUDES) :]))
    if spec.storage:  # an attempt of --retries: a folder of the storage of its own
        from provisioner.cluster.storage import job_env

        spec = replace(spec, storage=job_env(target.inventory, spec.job_id))
    with target.link() as link:
        if link.pool is not None:  # the job's directory, owned by the SSH user, made first
            prepare_results(link, spec.job_id)
        if prepare is not None:
            prepare(link)
        h.report(
            f"submitting {spec.playbook.name} as job {spec.job_id} (working_dir {spec.working_dir})"
        )
        h.report(upload_line(upload))
        start(link, spec)
    return upload


def follow_to_end(
    target: Target, job_id: str, results_root: Path, handlers: Handlers | None = None
) -> JobOutcome:
    """Follow a job (already running) until it ends, then bring everything home.

    Ctrl-C stops following only: the outcome says the job goes on."""
    h = handlers or Handlers()
    home = results_root / job_id
    try:
        followed = follow(target, job_id, h, home=home if target.inventory else None)
    except KeyboardInterrupt:
        return JobOutcome(
            job_id,
            "RUNNING",
            finish(home, None),
            message=f"detached; the job goes on: provisioner jobs logs {job_id} --follow",
            interrupted=True,
            detached=True,
        )
    return collect(target, job_id, results_root, followed, h)


def collect(
    target: Target, job_id: str, results_root: Path, followed: Followed, h: Handlers
) -> JobOutcome:
    """After following: the whole log (if the Jobs API still answers) and the results."""
    home = results_root / job_id
    status, message = followed.status, followed.message
    log: str | None = None
    try:
        with target.link() as link:
            log = job_log(link.client, job_id)
            if log is None:
                h.report(
                    f"the job's log is over {JOB_LOG_CAP >> 20} MiB: not brought here "
                    f"(`provisioner jobs logs {job_id} --follow` streams it)"
                )
            if not followed.terminal:
                info = link.client.get_job_info(job_id)
                status, message = str(info.status.value), str(info.message or "")
    except Exception as exc:  # the cluster may be gone (down): the head's disk still has it
        h.report(
            f"the job's log is not available ({type(exc).__name__}); results from the head's disk"
        )
    h.report(f"job {job_id}: {status}; bringing results home")
    results = bring_home_patiently(target, job_id, home, log, h)
    if status == "UNKNOWN":
        status = recorded_status(home) or status
    return JobOutcome(
        job_id=job_id,
        status=status,
        results=results,
        log_tail=[] if status == SUCCEEDED or log is None else tail(log, TAIL_LINES),
        # the whole end of the log, not just the tail shown: Ray prints a dead raylet's
        # last 20 log lines after the error that names it
        lost_node=status != SUCCEEDED and log is not None and shows_a_lost_node(log[-LOST_SCAN:]),
        message=message,
    )


# When the job has ended, its results must come home: a head whose sshd is restarting, or
# a link that dropped, is waited for this long before the error is the outcome.
HOME_WAITS_S = (2.0, 4.0, 8.0, 15.0, 30.0, 30.0)


def bring_home_patiently(
    target: Target, job_id: str, home: Path, log: str | None, h: Handlers
) -> Results:
    """`bring_home`, trying again while the head refuses or drops SSH connections."""
    from provisioner.errors import ConnectError

    for wait in (*HOME_WAITS_S, None):
        try:
            return bring_home(target, job_id, home, log=log)
        except ConnectError as exc:
            if wait is None:
                raise
            h.report(f"results of {job_id}: {exc}; trying again in {wait:.0f} s")
            time.sleep(wait)
    raise AssertionError("unreachable")


def recorded_status(home: Path) -> str | None:
    """The status `down --yes` recorded on the head when it stopped the job, if it did."""
    import json

    from provisioner.jobs.home import STATUS_FILE

    try:
        data = json.loads((home / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    value = data.get("status") if isinstance(data, dict) else None
    return str(value) if value else None


def wait_until_done(client: Any, job_id: str, *, timeout: float) -> tuple[str, str]:
    """Poll until the job is in a terminal state; return (status, Ray's message)."""
    deadline = time.monotonic() + timeout
    while True:
        info = client.get_job_info(job_id)
        if info.status.is_terminal():
            return str(info.status.value), str(info.message or "")
        if time.monotonic() > deadline:
            raise OperationError(
                f"job {job_id} is still {info.status.value} after {timeout:.0f}s",
                f"stop it with `provisioner jobs stop {job_id}`",
            )
        time.sleep(0.5)


# Signs in a failed job's message or log that the cluster, not the playbook, failed.
LOST = (
    "ActorDiedError",
    "RayActorError",
    "ActorUnavailableError",
    "NodeDiedError",
    "WorkerCrashedError",
    "OwnerDiedError",
    "node died",
    "was lost",
    "GcsRpcError",
    "RaySystemError",
    "unexpectedly exited",
    "Raylet is terminated",
)


LOST_SCAN = 256 * 1024  # how much of the log's end is searched for the signs above


def shows_a_lost_node(text: str) -> bool:
    return any(sign in text for sign in LOST)


def lost_a_node(outcome: JobOutcome) -> bool:
    """True when the job failed because a node, a worker or the head went away."""
    if outcome.status == "UNKNOWN":
        return True
    if outcome.status != "FAILED":
        return False
    return outcome.lost_node or shows_a_lost_node("\n".join([outcome.message, *outcome.log_tail]))


def attempt_record(outcome: JobOutcome, spec: JobSpec) -> dict[str, Any]:
    summary = outcome.results.summary or {}
    return {
        "attempt": spec.attempt,
        "job_id": outcome.job_id,
        "status": outcome.status,
        "message": outcome.message[-500:],
        "resumed_from": spec.resumed_from or None,
        "iterations": summary.get("iterations"),
        "results_dir": str(outcome.results.directory),
    }


def write_attempts(outcome: JobOutcome, homes: list[Path]) -> None:
    """attempts.json in every attempt's results directory."""
    import json

    from provisioner.remote.receive import ensure_directory, write_file

    body = json.dumps(outcome.attempts, indent=1).encode()
    for home in homes:
        ensure_directory(home)
        write_file(home, "attempts.json", body)


RETRY_FILE = ".retry.json"  # in an attempt's results home: what a reattaching client needs


def remember(
    results_root: Path, spec: JobSpec, retries: int, attempts: list[dict[str, Any]]
) -> None:
    """What `jobs logs JOB --follow --retries N` needs to take over this run's retries if
    this client dies: the playbook, its arguments and the attempts so far (beside the
    attempt's results, on this machine only)."""
    import json

    from provisioner.remote.receive import ensure_directory, write_file

    home = results_root / spec.job_id
    ensure_directory(home)
    body = {
        "playbook": str(spec.playbook),
        "args": list(spec.args),
        "runner": spec.runner,
        "env": spec.env,
        "run": spec.run,
        "attempt": spec.attempt,
        "resumed_from": spec.resumed_from,
        "retries": retries,
        "attempts": attempts,
    }
    write_file(home, RETRY_FILE, json.dumps(body, indent=1).encode())


def retry_spec(results_root: Path, job_id: str) -> tuple[JobSpec, int]:
    """The spec of a running attempt that this machine submitted with --retries, and the
    retries it was given; an InputError when this machine has no record of it."""
    import json

    from provisioner.jobs.spec import make_spec

    path = results_root / job_id / RETRY_FILE
    try:
        body = json.loads(path.read_text())
        args = [str(a) for a in body["args"]]
        if body.get("runner"):  # an experiment file's job: its runner, the file's folder
            spec = JobSpec(Path(body["playbook"]), tuple(args), job_id, runner=str(body["runner"]))
        else:
            spec = make_spec(Path(body["playbook"]), args, job_id=job_id)
        env = {str(k): str(v) for k, v in dict(body["env"]).items()}
        spec = replace(
            spec,
            env=env,
            run=str(body["run"]),
            attempt=int(body["attempt"]),
            resumed_from=str(body["resumed_from"]),
        )
        return spec, int(body["retries"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(
            f"no retry record of job {job_id} under {results_root} ({type(exc).__name__})",
            f"give the --results folder it was submitted with, or follow it without --retries "
            f"(then continue it with `provisioner submit --resume {job_id} --retries N`)",
        ) from exc


def spec_attempts(results_root: Path, spec: JobSpec) -> list[dict[str, Any]]:
    """The attempts before `spec`'s, as its retry record lists them."""
    import json

    try:
        body = json.loads((results_root / spec.job_id / RETRY_FILE).read_text())
        return [a for a in body.get("attempts", []) if isinstance(a, dict)]
    except (OSError, ValueError):
        return []


def submit_with_retries(
    target: Target,
    spec: JobSpec,
    results_root: Path,
    *,
    retries: int,
    repair: Callable[[], None],
    handlers: Handlers | None = None,
    prepare: Callable[[Link], None] | None = None,
    resume_prepare: Callable[[JobSpec, Path], tuple[JobSpec, Callable[[Link], None] | None]],
    attach: bool = False,
) -> JobOutcome:
    """Run `spec`; when it fails because a node was lost or the head restarted, repair
    the cluster (`repair`, i.e. `up`) and resubmit from the latest checkpoint, at most
    `retries` times. Every attempt is listed in the outcome and in attempts.json.

    `attach`: `spec` is a job already running (read back with `retry_spec`, as `jobs logs
    JOB --follow --retries N` does after the client that submitted it died): it is
    followed, not submitted, and the run's earlier attempts count."""
    import dataclasses

    h = handlers or Handlers()
    env = {**spec.env, "PROVISIONER_RETRIES": str(retries)}
    current = dataclasses.replace(spec, env=env, run=spec.run or spec.job_id)
    records: list[dict[str, Any]] = list(spec_attempts(results_root, current)) if attach else []
    homes = [results_root / r["job_id"] for r in records]

    def run(step: Callable[[Link], None] | None, *, follow_only: bool = False) -> JobOutcome:
        remember(results_root, current, retries, records)
        if follow_only:
            return follow_to_end(target, current.job_id, results_root, h)
        return submit(target, current, results_root, handlers=h, prepare=step)

    outcome = run(prepare, follow_only=attach)
    records.append(attempt_record(outcome, current))
    homes.append(results_root / current.job_id)
    while not outcome.ok and not outcome.interrupted and lost_a_node(outcome):
        if current.attempt > retries:
            break
        h.report(f"job {outcome.job_id} {outcome.status}: a node was lost; repairing (up)")
        repair()
        following = dataclasses.replace(
            current, job_id=f"{current.run}-r{current.attempt}", attempt=current.attempt + 1
        )
        following, step = resume_prepare(following, results_root / current.job_id)
        h.report(f"attempt {following.attempt}: job {following.job_id}")
        current = following
        outcome = run(step)
        records.append(attempt_record(outcome, current))
        homes.append(results_root / current.job_id)
    outcome.attempts = records
    write_attempts(outcome, homes)
    return outcome
