"""Bring a finished job's results home: its log, its files, its plots, in results/JOB/."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.jobs import provisioner_results
from provisioner.jobs.plots import plot_results
from provisioner.jobs.stream import visible

LOG_FILE = "job.log"


@dataclass
class Results:
    """What came home for one job."""

    directory: Path
    files: list[Path] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    missing: str | None = None  # why no files came, when none did


def bring_home(log: str, directory: Path) -> Results:
    """Write the visible log to directory/job.log, unpack the results it carries, plot them."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = log.splitlines()
    (directory / LOG_FILE).write_text("\n".join(visible(lines)) + "\n")
    found = Results(directory=directory)
    try:
        data = provisioner_results.unpack(lines)
    except provisioner_results.ResultsError as exc:
        found.missing = str(exc)
        return found
    found.files = provisioner_results.extract(data, directory)
    found.plots = plot_results(directory)
    summary = directory / "summary.json"
    if summary.is_file():
        found.summary = json.loads(summary.read_text())
    return found


def tail(log: str, lines: int = 20) -> list[str]:
    """The last visible lines of a log (a failed job's traceback)."""
    return visible(log.splitlines())[-lines:]
