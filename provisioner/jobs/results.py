"""Bring a finished job's results home: its log, its files, its plots, in results/JOB/.

Everything here comes from the job, so it is treated as hostile: the files are received
through provisioner.remote.receive (bounded, no links, private modes), the log written
home is capped, and a file the client cannot read (a non-UTF-8 CSV, bad JSON) is named
in `unreadable` instead of ending the command.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import ReceiveError
from provisioner.jobs import provisioner_results
from provisioner.jobs.plots import plot_results
from provisioner.jobs.stream import visible
from provisioner.remote.receive import Limits, receive_tar

LOG_FILE = "job.log"
# What a job's results may bring home (the packer on the head caps the compressed size too).
LIMITS = Limits(
    members=10_000,
    file_bytes=512 * 1024 * 1024,
    total_bytes=1024 * 1024 * 1024,
    compressed_bytes=provisioner_results.MAX_BYTES,
)
LOG_BYTES = 64 * 1024 * 1024  # the most of a job's log kept in job.log (its end is kept)


@dataclass
class Results:
    """What came home for one job."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    missing: str | None = None  # why no files came, when none did
    refused: ReceiveError | None = None  # the files were refused as unsafe or too big
    unreadable: list[str] = field(default_factory=list)  # files that could not be read


def bring_home(log: str, directory: Path, *, limits: Limits = LIMITS) -> Results:
    """Unpack the results the log carries into `directory`, write the visible log to
    directory/job.log, plot what can be plotted."""
    lines = provisioner_results.split_lines(log)
    found = Results(directory=directory)
    try:
        data = provisioner_results.unpack(lines)
        received = receive_tar(
            data,
            directory,
            limits=limits,
            what=f"the results of job {directory.name}",
            where=f"job {directory.name}",
        )
        found.files = received.files
    except provisioner_results.ResultsError as exc:
        found.missing = str(exc)
    except ReceiveError as exc:
        found.refused = exc
        found.missing = str(exc)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(directory / LOG_FILE, capped_log(visible(lines)))
    if found.files:
        _read_results(found)
    return found


def capped_log(lines: list[str], limit: int = LOG_BYTES) -> str:
    """The log's text, at most `limit` characters: its end, after a line saying so."""
    text = "\n".join(lines) + "\n"
    if len(text) <= limit:
        return text
    return (
        f"[provisioner: the first {len(text) - limit} characters were left out]\n" + (text[-limit:])
    )


def write_private(path: Path, text: str) -> None:
    """Write `path` as 0600 without following a link; replaces a regular file."""
    if path.is_symlink() or path.is_dir():
        raise ReceiveError(f"{path} is not a regular file", f"remove {path}, then run again")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)


def _read_results(found: Results) -> None:
    """Plots and the summary; a file that cannot be read is named, never fatal."""
    try:
        found.plots = plot_results(found.directory)
        for plot in found.plots:
            plot.chmod(0o600)
    except (ValueError, OSError, csv.Error) as exc:
        found.unreadable.append(f"plots: {exc}")
    summary = found.directory / "summary.json"
    if summary.is_file():
        try:
            value = json.loads(summary.read_text(encoding="utf-8"))
        except (ValueError, OSError) as exc:
            found.unreadable.append(f"summary.json: {exc}")
        else:
            if isinstance(value, dict):
                found.summary = value
            else:
                found.unreadable.append("summary.json: not a JSON object")


def tail(log: str, lines: int = 20) -> list[str]:
    """The last visible lines of a log (a failed job's traceback)."""
    return visible(provisioner_results.split_lines(log))[-lines:]
