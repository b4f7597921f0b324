"""Jobs after `submit` is gone: list them (with their progress), stop one, read its log.

The list joins what Ray's Jobs API knows (status, times, the metadata `submit` put on
the job) with what the head's disk holds (each job's results directory and its
progress.json): after a head restart Ray forgets its jobs, the disk does not.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.console import Reporter
from provisioner.errors import OperationError
from provisioner.jobs import spec as specs
from provisioner.jobs.head_folder import enter_command
from provisioner.jobs.home import STATUS_FILE, pull_all
from provisioner.jobs.link import Link
from provisioner.jobs.submit import wait_until_done
from provisioner.node import layout

PROGRESS_BYTES = 64 * 1024  # the most of one job's progress.json read by `jobs list`


def progress_command(cluster: str) -> str:
    """Every job directory on the head and its progress.json (NUL-separated pairs); links
    are skipped, never followed, and at most PROGRESS_BYTES of each file are read."""
    root = layout.node_results_dir(cluster)
    return (
        f'cd -P {root} 2>/dev/null || exit 0; for d in */; do d="${{d%/}}"; '
        '{ [ -d "$d" ] && [ ! -L "$d" ]; } || continue; '
        'printf \'%s\\0\' "$d"; dd if="$d/progress.json" iflag=nofollow,count_bytes '
        f"count={PROGRESS_BYTES} status=none 2>/dev/null; printf '\\0'; done"
    )


def parse_progress(stdout: str) -> dict[str, dict[str, Any] | None]:
    """job id -> its progress figures (None when it wrote none yet)."""
    parts = stdout.split("\0")
    found: dict[str, dict[str, Any] | None] = {}
    for name, text in zip(parts[0::2], parts[1::2], strict=False):
        if not specs.JOB_ID.fullmatch(name):
            continue
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = None
        found[name] = data if isinstance(data, dict) else None
    return found


@dataclass
class JobRow:
    job_id: str
    status: str
    playbook: str = ""
    started: float | None = None  # seconds since the epoch
    ended: float | None = None
    attempt: int = 1
    run: str = ""
    progress: dict[str, Any] | None = None
    message: str = ""

    def duration(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended or now) - self.started)

    def to_json(self, now: float) -> dict[str, Any]:
        duration = self.duration(now)
        return {
            "job_id": self.job_id,
            "status": self.status,
            "playbook": self.playbook,
            "started": self.started,
            "ended": self.ended,
            "duration_s": None if duration is None else round(duration, 1),
            "attempt": self.attempt,
            "run": self.run or self.job_id,
            "progress": self.progress,
            "message": self.message,
        }


def _row(details: Any) -> JobRow:
    meta = details.metadata or {}
    start, end = details.start_time, details.end_time
    return JobRow(
        job_id=str(details.submission_id),
        status=str(details.status.value),
        playbook=meta.get(specs.META_PLAYBOOK, ""),
        started=start / 1000 if start else None,
        ended=end / 1000 if end else None,
        attempt=int(meta.get(specs.META_ATTEMPT, "1") or 1),
        run=meta.get(specs.META_RUN, ""),
        message=str(details.message or ""),
    )


def list_jobs(link: Link) -> list[JobRow]:
    """Every submitted job the cluster knows, and every job whose results are on the head."""
    rows = {
        str(d.submission_id): _row(d)
        for d in link.client.list_jobs()
        if d.submission_id is not None
    }
    if link.inventory is not None:
        result = link.head().run(progress_command(link.inventory.cluster), timeout=60)
        for job_id, figures in parse_progress(result.stdout).items():
            row = rows.setdefault(job_id, JobRow(job_id=job_id, status="UNKNOWN"))
            row.progress = figures
    return sorted(rows.values(), key=lambda r: (r.started or 0, r.job_id))


def stop(link: Link, job_id: str, *, timeout: float = 60.0) -> tuple[str, str]:
    """Ask Ray to stop the job and wait until it has; (status, message)."""
    link.client.stop_job(job_id)
    return wait_until_done(link.client, job_id, timeout=timeout)


def running(link: Link) -> list[str]:
    """The ids of the jobs that are PENDING or RUNNING now."""
    return [
        str(d.submission_id)
        for d in link.client.list_jobs()
        if d.submission_id is not None and not d.status.is_terminal()
    ]


def record_status_command(cluster: str, job_id: str) -> str:
    """Shell: stdin written as the job's STATUS_FILE, never through a link: the job's
    directory entered as a pull does (exit 4 when it is a link), the text written to a
    fresh file made there by mktemp, then renamed over the name (a link planted under
    that name is replaced, its target untouched)."""
    temp = shlex.quote(f".tmp-{STATUS_FILE}.XXXXXX")
    return (
        f"{enter_command(cluster, job_id)}; t=$(mktemp {temp}) && "
        f'cat > "$t" && mv -f -- "$t" {shlex.quote(STATUS_FILE)} || {{ rm -f -- "$t"; exit 1; }}'
    )


def record_status(link: Link, job_id: str, status: str) -> None:
    """Write the job's final status beside its results on the head (`down --yes` does, so
    that a follower that lost the cluster still learns how the job ended)."""
    assert link.inventory is not None
    body = json.dumps({"job_id": job_id, "status": status, "by": "down"}).encode()
    command = record_status_command(link.inventory.cluster, job_id)
    link.head().run(command, timeout=60, stdin=body).check(
        "the job's results directory on the head is missing or a link (a hostile job?)"
    )


class JobsRunning(OperationError):
    """`down` found jobs running and was not told to stop them."""


@dataclass
class Stopped:
    job_id: str
    status: str
    results: str
    files: int

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "results_dir": self.results,
            "files": self.files,
        }


def stop_for_down(link: Link, results_root: Path, *, yes: bool, report: Reporter) -> list[Stopped]:
    """Before `down`: the running jobs stopped (with `yes`) and their results brought home;
    without `yes`, an error naming them."""
    active = running(link)
    if not active:
        return []
    if not yes:
        raise JobsRunning(
            f"{len(active)} job(s) running on the cluster: {', '.join(active)}",
            "`provisioner down --yes` stops them and brings their results home first "
            "(or stop one with `provisioner jobs stop JOB`)",
        )
    assert link.inventory is not None
    done: list[Stopped] = []
    for job_id in active:
        report(f"stopping job {job_id} before down")
        status, _ = stop(link, job_id)
        record_status(link, job_id, status)
        home = results_root / job_id
        pulled = pull_all(link.head(), link.inventory.cluster, job_id, home)
        report(f"job {job_id}: {status}; {len(pulled.sent)} file(s) brought home to {home}")
        done.append(Stopped(job_id, status, str(home), len(pulled.sent)))
    return done
