"""What a job is, as data: the playbook, its arguments, the entrypoint and runtime_env.

Pure functions; `submit` sends what they build to Ray's Jobs API.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.jobs import provisioner_results

# Where playbooks write, relative to the job's working directory on the head: one
# directory per job. Ray extracts a working_dir once per content hash and gives that
# same directory to every job with the same content, so a fixed `results/` would carry
# one job's files (a checkpoint, metrics) into the next job's results.
RESULTS_DIR = "results"
RESULTS_ENV = "PROVISIONER_RESULTS_DIR"
# Files that never travel with the working_dir (besides .gitignore'd ones, which Ray honours).
EXCLUDES = ["results/", "__pycache__/", "*.pyc", ".git/"]


@dataclass(frozen=True)
class JobSpec:
    """One playbook run: `python PLAYBOOK ARGS` in the playbook's directory on the cluster."""

    playbook: Path
    args: tuple[str, ...] = ()
    job_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    excludes: tuple[str, ...] = ()  # beyond EXCLUDES: the secrets found (jobs/upload.py)

    @property
    def working_dir(self) -> Path:
        return self.playbook.parent

    @property
    def results_dir(self) -> str:
        """This job's own results directory, relative to the working directory."""
        return f"{RESULTS_DIR}/{self.job_id}"

    def entrypoint(self) -> str:
        """The shell command the head runs: the playbook, then the results shipment.

        The playbook's exit status is the job's, whatever the shipment does.
        """
        run = shlex.join(["python3", "-u", self.playbook.name, *self.args])
        ship = shlex.join(
            [
                "python3",
                "-m",
                provisioner_results.__name__.rsplit(".", 1)[-1],
                "pack",
                self.results_dir,
            ]
        )
        return f"{run}; rc=$?; {ship}; exit $rc"

    def runtime_env(self) -> dict[str, Any]:
        """working_dir = the playbook's directory; the results shipper as a py_module;
        PROVISIONER_RESULTS_DIR = this job's results directory."""
        return {
            "working_dir": str(self.working_dir),
            "excludes": [*EXCLUDES, *self.excludes],
            "py_modules": [str(Path(provisioner_results.__file__).parent)],
            "env_vars": {RESULTS_ENV: self.results_dir, "PYTHONUNBUFFERED": "1", **self.env},
        }


def job_id_for(playbook: Path, now: float | None = None) -> str:
    """A readable, unique-enough submission id: `<playbook stem>-<UTC timestamp>`."""
    stem = re.sub(r"[^a-z0-9]+", "-", playbook.stem.lower()).strip("-") or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stem}-{stamp}"


def make_spec(
    playbook: Path, args: list[str] | tuple[str, ...] = (), job_id: str | None = None
) -> JobSpec:
    """Check the playbook exists and is a Python file; build its spec."""
    path = playbook.expanduser()
    if not path.is_file():
        raise InputError(
            f"playbook {playbook} does not exist",
            "give the path of a Python file, e.g. playbooks/ppo_cartpole.py",
        )
    if path.suffix != ".py":
        raise InputError(f"playbook {playbook} is not a .py file", "give a Python script")
    resolved = path.resolve()
    return JobSpec(playbook=resolved, args=tuple(args), job_id=job_id or job_id_for(resolved))
