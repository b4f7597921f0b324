"""Bring a job's results home into results/JOB/: its files from the head's disk (over
SSH, incrementally, verified), its log from the Jobs API, the plots drawn here.

Everything here comes from the job, so it is treated as hostile: files land through
provisioner.remote.receive (`provisioner.remote.pull`), the log written home is capped, split on
newlines only and without escape sequences (colours included: `console.plain`), and a file
the client cannot read (a non-UTF-8 CSV, bad JSON) is named in `unreadable` instead of
ending the command.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.console import plain
from provisioner.errors import ProvisionerError, ReceiveError
from provisioner.jobs.head_folder import pull
from provisioner.jobs.link import Target
from provisioner.jobs.plots import plot_results
from provisioner.jobs.stream import visible
from provisioner.jobs.tables import read_json
from provisioner.remote.pull import Pulled
from provisioner.remote.receive import ensure_directory, write_file
from provisioner.remote.session import Session

if TYPE_CHECKING:
    from provisioner.cluster.storage import Sync

LOG_FILE = "job.log"
STATUS_FILE = "job-status.json"  # written on the head by `down --yes` when it stops a job
FINAL_TRIES = 3  # a file still changing at the end is fetched again, this many times
LOG_BYTES = 64 * 1024 * 1024  # the most of a job's log kept in job.log (its end is kept)


@dataclass
class Results:
    """What came home for one job."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    missing: str | None = None  # why no files came, when none did
    pulled: Pulled | None = None
    refused: ReceiveError | None = None  # files refused as unsafe
    unreadable: list[str] = field(default_factory=list)  # files that could not be read

    def problems(self) -> list[str]:
        """What did not come home, a line each: files that could not be read, files refused
        (over the caps or this disk), and why none came (a refusal as unsafe included)."""
        said = [f"could not read {problem}" for problem in self.unreadable]
        said += [f"refused: {line}" for line in (self.pulled.refused if self.pulled else [])]
        return [*said, *([self.missing] if self.missing else [])]

    def to_json(self) -> dict[str, Any]:
        return {
            "results_dir": str(self.directory),
            "files": [str(p) for p in self.files],
            "plots": [str(p) for p in self.plots],
            "summary": self.summary,
            "results_missing": self.missing,
            "results_refused": self.refused.to_json() if self.refused else None,
            "results_unreadable": self.unreadable,
            "transfer": self.pulled.to_json() if self.pulled else None,
        }


def pull_all(session: Session, cluster: str, job_id: str, home: Path) -> Pulled:
    """Pull until nothing is pending (files rewritten mid-transfer are fetched again)."""
    total = pull(session, cluster, job_id, home)
    for _ in range(FINAL_TRIES):
        if not total.pending:
            break
        again = pull(session, cluster, job_id, home)
        total.sent += again.sent
        total.bytes_sent += again.bytes_sent
        total.pending = again.pending
    return total


def lines_of(log: str) -> list[str]:
    """A log's lines, split on newlines only (`\r` and other separators stay inside)."""
    return log.split("\n")


def capped_log(lines: list[str], limit: int = LOG_BYTES) -> str:
    """The log's text, at most `limit` characters: its end, after a line saying so."""
    text = "\n".join(lines) + "\n"
    if len(text) <= limit:
        return text
    return (
        f"[provisioner: the first {len(text) - limit} characters were left out]\n" + text[-limit:]
    )


def write_log(log: str, home: Path) -> None:
    ensure_directory(home)
    text = capped_log([plain(line) for line in visible(lines_of(log.rstrip("\n")))])
    write_file(home, LOG_FILE, text.encode("utf-8", "replace"))


def plots(home: Path) -> list[Path]:
    """training.png (and scaling.png) from the metrics home, drawn in a private folder and
    written into `home` with `write_file` (0600; a link there is replaced, never followed)."""
    import tempfile

    made: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        for drawn in plot_results(home, Path(tmp)):
            write_file(home, drawn.name, drawn.read_bytes())
            made.append(home / drawn.name)
    return made


def finish(home: Path, pulled: Pulled | None) -> Results:
    """Plots and summary from what is home now: the finishing step of a job wherever it
    ran (`provisioner.jobs.place`)."""
    found = Results(directory=home, pulled=pulled)
    if pulled is not None and not pulled.found:
        found.missing = "the head holds no results directory for this job"
    if home.is_dir():
        found.files = sorted(
            p for p in home.rglob("*") if p.is_file() and not p.name.startswith(".")
        )
        try:
            found.plots = plots(home)
        except (ValueError, OSError, csv.Error, ReceiveError) as exc:
            found.unreadable.append(f"plots: {exc}")
        summary = home / "summary.json"
        if summary.is_file():
            try:
                value = read_json(summary)
            except (ValueError, OSError) as exc:
                found.unreadable.append(f"summary.json: {exc}")
            else:
                if isinstance(value, dict):
                    found.summary = value
                else:
                    found.unreadable.append("summary.json: not a JSON object")
    if not found.files and found.missing is None:
        found.missing = "the job wrote no results"
    return found


def from_store(
    session: Session, target: Target, job_id: str, sync: Sync | None = None
) -> str | None:
    """Tune's folder of the job in the cluster's store, copied into its results on the
    head first (cluster.storage.Sync: every time unless `sync` limits it); a failure is told
    (the message), never a reason to leave the rest of the results where they are."""
    from provisioner.cluster.storage import Sync

    try:
        (sync or Sync())(session, target.runtime, target.inventory, job_id, force=sync is None)
    except ProvisionerError as exc:
        return str(exc)
    return None


def bring_home(target: Target, job_id: str, home: Path, *, log: str | None = None) -> Results:
    """Everything of `job_id` that is on the head now, plus its log when given."""
    if log is not None:
        write_log(log, home)
    pulled = None
    refused = None
    unsynced = None
    if target.inventory is not None:
        try:
            with target.ssh() as session:
                unsynced = from_store(session, target, job_id)
                pulled = pull_all(session, target.cluster, job_id, home)
        except ReceiveError as exc:
            refused = exc
    found = finish(home, pulled)
    if unsynced is not None:
        found.unreadable.append(unsynced)
    if refused is not None:
        found.refused, found.missing = refused, str(refused)
    if target.inventory is None:
        found.missing = "results come home over SSH: give -i INVENTORY"
    return found


def tail(log: str, lines: int = 20) -> list[str]:
    """The last visible lines of a log (a failed job's traceback)."""
    return visible(lines_of(log.rstrip("\n")))[-lines:]
