"""Submit a playbook as a Ray job, follow it, stop it on Ctrl-C, bring its results home.

The core takes a dashboard URL and a token path; the CLI opens the SSH tunnel that
gives the URL. Nothing here prints: lines of the job's log go to `on_line`, progress
to `report`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError
from provisioner.jobs.client import connect, ray_client_quiet, refused
from provisioner.jobs.results import Results, bring_home, tail
from provisioner.jobs.spec import EXCLUDES, JobSpec
from provisioner.jobs.stream import follow
from provisioner.jobs.upload import Upload, plan_upload
from provisioner.local import state_root

SUCCEEDED = "SUCCEEDED"
STOPPED = "STOPPED"
TAIL_LINES = 20


@dataclass
class JobOutcome:
    """How a job ended and what came home."""

    job_id: str
    status: str
    results: Results
    log_tail: list[str] = field(default_factory=list)
    message: str = ""
    interrupted: bool = False
    upload: Upload | None = None

    @property
    def ok(self) -> bool:
        return self.status == SUCCEEDED

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "ok": self.ok,
            "interrupted": self.interrupted,
            "message": self.message,
            "results_dir": str(self.results.directory),
            "files": [str(p) for p in self.results.files],
            "plots": [str(p) for p in self.results.plots],
            "summary": self.results.summary,
            "results_missing": self.results.missing,
            "results_refused": self.results.refused.to_json() if self.results.refused else None,
            "results_unreadable": self.results.unreadable,
            "log_tail": self.log_tail,
            "upload": self.upload.to_json() if self.upload else None,
        }


def submit(
    dashboard_url: str,
    token_path: Path | None,
    spec: JobSpec,
    results_root: Path,
    *,
    on_line: Callable[[str], None] = quiet,
    report: Reporter = quiet,
    stop_timeout: float = 60.0,
) -> JobOutcome:
    """Run `spec` on the cluster behind `dashboard_url` and return how it ended."""
    upload = upload_for(spec)
    spec = replace(spec, excludes=tuple(upload.excludes[len(EXCLUDES) :]))
    with ray_client_quiet():
        client = connect(dashboard_url, token_path)
        report(
            f"submitting {spec.playbook.name} as job {spec.job_id} (working_dir {spec.working_dir})"
        )
        report(upload_line(upload))
        _submit(client, dashboard_url, token_path is not None, spec)
        interrupted = False
        try:
            follow(client, spec.job_id, on_line)
        except KeyboardInterrupt:
            interrupted = True
            report(f"interrupted: stopping job {spec.job_id}")
            client.stop_job(spec.job_id)
        status, message = wait_until_done(client, spec.job_id, timeout=stop_timeout)
        report(f"job {spec.job_id}: {status}; bringing results home")
        log = client.get_job_logs(spec.job_id)
        results = bring_home(log, results_root / spec.job_id)
        return JobOutcome(
            job_id=spec.job_id,
            status=status,
            results=results,
            log_tail=[] if status == SUCCEEDED else tail(log, TAIL_LINES),
            message=message,
            interrupted=interrupted,
            upload=upload,
        )


def upload_for(spec: JobSpec) -> Upload:
    """What Ray will send of the playbook's directory (secrets left out)."""
    return plan_upload(spec.working_dir, [*EXCLUDES, *spec.excludes], state_root())


def upload_line(upload: Upload) -> str:
    """One line saying what is sent: counts, and every file left out as a secret."""
    line = f"sending {len(upload.files)} file(s), {upload.size / 1e6:.1f} MB of {upload.directory}"
    if upload.secrets:
        line += f"; left out as secrets: {', '.join(upload.secrets)}"
    return line


def _submit(client: Any, dashboard_url: str, had_token: bool, spec: JobSpec) -> None:
    from ray.exceptions import AuthenticationError

    try:
        client.submit_job(
            entrypoint=spec.entrypoint(),
            submission_id=spec.job_id,
            runtime_env=spec.runtime_env(),
        )
    except AuthenticationError as exc:
        raise refused(dashboard_url, had_token) from exc
    except (RuntimeError, ValueError) as exc:
        raise OperationError(
            f"the cluster did not accept job {spec.job_id}: {exc}",
            "check the playbook directory (it travels as the working_dir, at most 500 MiB)",
        ) from exc


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
                f"stop it with `ray job stop {job_id}` through the tunnel",
            )
        time.sleep(0.5)
