"""What a job is, as data: the playbook, its arguments, the entrypoint and runtime_env.

Pure functions; `submit` sends what they build to Ray's Jobs API.
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
import shlex
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from provisioner.errors import InputError
from provisioner.jobs.watch import tune_resume_argv, watcher_command
from provisioner.node.layout import RESULTS_ROOT_ENV

# Where a job writes: $PROVISIONER_RESULTS_ROOT/JOB, the node's results directory (on the
# head's own disk, outside the container), one directory per job.
RESULTS_ENV = "PROVISIONER_RESULTS_DIR"
# A checkpoint to continue from, relative to the job's results directory (set by --resume).
RESUME_ENV = "PROVISIONER_RESUME_FROM"
RESUME_DIR = "resume"
# An earlier Tune experiment to continue (set by --resume and --retries for a script that
# trained through Tune): its folder, relative to the job's results directory.
TUNE_RESUME_ENV = "PROVISIONER_TUNE_RESUME"
TUNE_RESUME_DIR = f"{RESUME_DIR}/tune"
# The price of one node-hour, for the job's cost in its summary.json (playbooks/rlrun.py).
PRICE_ENV = "PROVISIONER_PRICE_PER_NODE_HOUR"
# Files that never travel with the working_dir (besides .gitignore'd ones, which Ray honours).
EXCLUDES = ["results/", "__pycache__/", "*.pyc", ".git/"]
# Job ids name directories on the head and here: keep them to a safe alphabet.
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")  # \Z: even `.match` refuses "id\n"
# Keys of the job's metadata in Ray (what `jobs list` shows).
META_PLAYBOOK = "provisioner.playbook"
META_ARGS = "provisioner.args"
META_ATTEMPT = "provisioner.attempt"
META_RUN = "provisioner.run"
META_RESUMED = "provisioner.resumed_from"


def check_job_id(job_id: str) -> str:
    """`job_id`, or an InputError when it could not safely name a directory."""
    if not JOB_ID.fullmatch(job_id):
        raise InputError(
            f"{job_id!r} is not a job id",
            "use the id `submit` printed or `provisioner jobs list` shows (letters, digits, . _ -)",
        )
    return job_id


@dataclass(frozen=True)
class JobSpec:
    """One playbook run: `python PLAYBOOK ARGS` in the playbook's directory on the cluster."""

    playbook: Path
    args: tuple[str, ...] = ()
    job_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    run: str = ""  # the first attempt's id when this is a retry (`--retries`)
    attempt: int = 1
    resumed_from: str = ""  # the job or path this one continues from
    excludes: tuple[str, ...] = ()  # beyond EXCLUDES: the secrets found (jobs/upload.py)
    # Tune's default storage every node shares (node.storage.job_env: RAY_STORAGE and what
    # pyarrow needs to reach the head's store), set by the place that runs the job
    storage: dict[str, str] = field(default_factory=dict)
    # the Tune experiment (its folder's name) this run continues, under TUNE_RESUME_DIR:
    # the script's first Tuner(...) is it, restored (jobs.tune_resume)
    tune_experiment: str = ""
    # an experiment file's job (`playbook` the file): the driver is provisioner's runner,
    # written under this name into the job's working_dir by the entrypoint
    runner: str = ""

    @property
    def working_dir(self) -> Path:
        return self.playbook.parent

    @property
    def script(self) -> str:
        """The Python file the driver runs, in the working_dir: the playbook, or the runner."""
        return self.runner or self.playbook.name

    def entrypoint(self) -> str:
        """The shell command the head runs: this job's results directory made, then the
        playbook. The node's results root comes from the Ray container's environment.
        Beside the driver, the watcher of Tune's results (`jobs.tune_watch`): the progress
        of a script that trains through Tune, read from Tune's own result files."""
        missing = "this Ray container has no results directory; run provisioner down, then up"
        root = f'"${{{RESULTS_ROOT_ENV}:?{missing}}}"'
        results = f"{root}/{self.job_id}"
        argv = ["python3", "-u", self.script, *self.args]
        if self.tune_experiment:
            argv = tune_resume_argv("python3", self.script, self.args)
        run = shlex.join(argv)
        watch = watcher_command("python3", "$$")  # $$: the shell's pid, which execs the driver
        placed = f"{runner_command('python3', self.runner)} && " if self.runner else ""
        return (
            f'export {RESULTS_ENV}={results} && mkdir -p "${RESULTS_ENV}" '
            f"&& {placed}{{ {watch} & }} && exec {run}"
        )

    def runtime_env(self) -> dict[str, Any]:
        """working_dir = the playbook's directory; the job's own variables."""
        env = {"PYTHONUNBUFFERED": "1", **self.storage, **self.env}
        if self.tune_experiment:
            env[TUNE_RESUME_ENV] = f"{TUNE_RESUME_DIR}/{self.tune_experiment}"
        elif self.resumed_from:
            env[RESUME_ENV] = f"{RESUME_DIR}/checkpoint"
        excludes = [*EXCLUDES, *self.excludes]
        return {"working_dir": str(self.working_dir), "excludes": excludes, "env_vars": env}

    def metadata(self) -> dict[str, str]:
        """What Ray keeps beside the job, for `jobs list` and retries."""
        return {
            META_PLAYBOOK: self.playbook.name,
            META_ARGS: json.dumps(list(self.args)),
            META_ATTEMPT: str(self.attempt),
            META_RUN: self.run or self.job_id,
            META_RESUMED: self.resumed_from,
        }


def runner_command(python: str, name: str) -> str:
    """`PYTHON -I -S -c '...' NAME BLOB`: provisioner's experiment runner written as NAME
    into the current folder (the job's working_dir on the head), carried in the command."""
    from provisioner.experiment.facts import runner_source

    blob = base64.b64encode(zlib.compress(runner_source(), 9)).decode()
    write = (
        "import base64,sys,zlib;"
        "open(sys.argv[1],'wb').write(zlib.decompress(base64.b64decode(sys.argv[2])))"
    )
    return shlex.join([python, "-I", "-S", "-c", write, name, blob])


def priced(spec: JobSpec, flag: float | None, inventory: float | None) -> JobSpec:
    """`spec` with the price of a node-hour (`--price-per-hour`, else the inventory's
    price_per_node_hour) in its environment; unchanged when neither gives one."""
    price = flag if flag is not None else inventory
    if price is None:
        return spec
    if not math.isfinite(price) or price < 0:
        raise InputError(f"price per node-hour {price}: not a price", "give a number, 0 or more")
    return replace(spec, env={**spec.env, PRICE_ENV: repr(float(price))})


def job_id_for(playbook: Path, now: float | None = None, nonce: str | None = None) -> str:
    """A readable, unguessable submission id: `<playbook stem>-<UTC timestamp>-<random>`
    (48 random bits, so a job cannot plant the directory of the next job in advance)."""
    stem = re.sub(r"[^a-z0-9]+", "-", playbook.stem.lower()).strip("-")[:80] or "job"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stem}-{stamp}-{secrets.token_hex(6) if nonce is None else nonce}"


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
    job = check_job_id(job_id) if job_id else job_id_for(resolved)
    return JobSpec(playbook=resolved, args=tuple(args), job_id=job)


def asks_for_help(args: tuple[str, ...] | list[str]) -> bool:
    """True when the playbook's arguments ask only for its usage (`-- --help`)."""
    return any(a in ("-h", "--help") for a in args)
