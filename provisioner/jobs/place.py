"""The seam for where a job runs: a `Place` submits a job, follows it, brings its results
home, resumes it and says what it cost; the CLI's job commands go through it only.

What a job does is written once, over this interface: `run` (submit, then follow), the
results home (`provisioner.jobs.home.finish`: the files in RESULTS/JOB/, summary.json,
the plots drawn here, every file landing through `provisioner.remote.receive`) and the
cost (`Place.cost`, read from summary.json's `cost`, the same shape wherever the job ran).

The places:
- `Cluster` (here): a Ray job on the cluster (`jobs.submit`; with `retries`, the
  repair-and-resume loop of `jobs.repair`); results home over SSH;
- `Sbatch` (here): a SLURM allocation's standalone sbatch script (`slurm.sbatch`): its
  submit writes the script, which the user hands to `sbatch` on the login node; the
  scheduler runs it, so it is not followed, brought home or resumed from here (each says
  so, with what to do instead);
- `provisioner.sagemaker.place.SageMakerLocal`: a SageMaker training job in local mode;
  its submit runs the job to its end (the SDK waits), its outcome a `JobOutcome`
  (`sagemaker.local.RunResult`, a subclass that keeps the SageMaker fields and JSON).

A new place (experiments, evaluation) is a subclass of `Place` with `name`, `submit`,
`follow`, `bring_home` and `resume`, whose outcome's `results` come from `home.finish`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from provisioner.errors import InputError
from provisioner.jobs.evaluate import Found, check_counts, eval_spec, find_checkpoint, read_eval
from provisioner.jobs.experiment import (
    experiment_spec,
    is_experiment,
    prepare_experiment,
    read_experiment,
)
from provisioner.jobs.home import Results, finish
from provisioner.jobs.link import Link, Target, target_for
from provisioner.jobs.noise import NoiseFilter
from provisioner.jobs.spec import JobSpec, asks_for_help, check_job_id, make_spec, priced
from provisioner.jobs.stream import Handlers
from provisioner.jobs.submit import JobOutcome, local_help, upload_for, upload_line
from provisioner.jobs.tables import read_rows
from provisioner.jobs.tune_watch import DEFAULT_METRIC
from provisioner.jobs.upload import Upload
from provisioner.jobs.watch import watcher_command

if TYPE_CHECKING:
    from provisioner.inventory.models import Inventory
    from provisioner.jobs.control import JobRow


@dataclass(frozen=True)
class Cost:
    """What a run occupied and what it cost: summary.json's `cost` (a cluster job's
    node-hours, `playbooks/rlrun.py` `cost_of`; a SageMaker job's instance-hours,
    `sagemaker.plan.comparable_cost`)."""

    unit: str  # "node-hour" | "instance-hour"
    hours: float
    price_per_hour: float | None = None
    cost: float | None = None

    @classmethod
    def of(cls, summary: dict[str, Any] | None) -> Cost | None:
        """The cost in a summary.json; None when it has none (or not as numbers)."""
        found = (summary or {}).get("cost")
        if not isinstance(found, dict) or not _number(found.get("hours")):
            return None
        price, cost = found.get("price_per_hour"), found.get("cost")
        return cls(
            unit=str(found.get("unit") or "node-hour"),
            hours=found["hours"],
            price_per_hour=price if _number(price) else None,
            cost=cost if _number(cost) else None,
        )

    def text(self) -> str:
        """`0.01 node-hours, cost 0.03`."""
        return f"{self.hours} {self.unit}s" + (
            f", cost {self.cost}" if self.cost is not None else ""
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "hours": self.hours,
            "price_per_hour": self.price_per_hour,
            "cost": self.cost,
        }


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class Submitted:
    """A job handed to its place: its id (empty where the place names none yet), what was
    sent, the script written (sbatch), or its outcome where submit waits for the end."""

    job_id: str
    place: str
    upload: Upload | None = None
    script: str | None = None
    ended: JobOutcome | None = None


class Place(ABC):
    """Where a job runs. `run` (submit, then follow) and `cost` are written once here."""

    name: ClassVar[str]

    @abstractmethod
    def submit(self, spec: JobSpec) -> Submitted:
        """Hand the job to the place."""

    @abstractmethod
    def follow(self, job: Submitted) -> JobOutcome:
        """Follow the job to its end (live output to the place's handlers); its results
        home."""

    @abstractmethod
    def bring_home(self, job_id: str) -> Results:
        """What the job has written so far, home into RESULTS/JOB/ (`home.finish`)."""

    @abstractmethod
    def resume(self, spec: JobSpec, source: str) -> JobSpec:
        """`spec`, continuing from the latest checkpoint of job `source` (or a folder)."""

    def run(self, spec: JobSpec) -> JobOutcome:
        """Submit the job and follow it to its end."""
        return self.follow(self.submit(spec))

    def cost(self, outcome: JobOutcome) -> Cost | None:
        """What the run cost, from its summary.json (None: it has no cost)."""
        return Cost.of(outcome.results.summary)


@dataclass
class Cluster(Place):
    """Ray jobs on the cluster (`target`), followed unless `detach`; with `retries`,
    repaired and resumed when a node is lost (with `follow`: taking over a job's retries)."""

    name: ClassVar[str] = "cluster"
    target: Target
    results_root: Path = Path("results")
    handlers: Handlers = field(default_factory=Handlers)
    detach: bool = False
    retries: int | None = None
    prepare: Callable[[Link], None] | None = None

    def with_storage(self, spec: JobSpec) -> JobSpec:
        """`spec` with the cluster's shared storage as Tune's default (none recorded: as is)."""
        from dataclasses import replace

        from provisioner.cluster.storage import job_env

        return replace(spec, storage=job_env(self.target.inventory, spec.job_id))

    def submit(self, spec: JobSpec) -> Submitted:
        from provisioner.jobs.submit import hand_over, keep_submitted

        spec = self.with_storage(spec)
        upload = hand_over(self.target, spec, self.handlers, self.prepare)
        keep_submitted(self.results_root, spec, self.target.node_count)
        return Submitted(spec.job_id, self.name, upload=upload)

    def follow(self, job: Submitted) -> JobOutcome:
        from provisioner.jobs.repair import with_retries
        from provisioner.jobs.submit import follow_to_end, retry_spec

        if self.retries is not None:
            spec, _ = retry_spec(self.results_root, job.job_id)
            return with_retries(
                self.target,
                spec,
                self.results_root,
                self.retries,
                self.handlers,
                None,
                attach=True,
            )
        outcome = follow_to_end(self.target, job.job_id, self.results_root, self.handlers)
        outcome.upload = job.upload or outcome.upload
        return outcome

    def run(self, spec: JobSpec) -> JobOutcome:
        from provisioner.jobs.repair import with_retries

        spec = self.with_storage(spec)
        if self.retries is not None and not self.detach:
            return with_retries(
                self.target, spec, self.results_root, self.retries, self.handlers, self.prepare
            )
        job = self.submit(spec)
        if self.detach:
            home = Results(self.results_root / spec.job_id)
            return JobOutcome(spec.job_id, "PENDING", home, detached=True, upload=job.upload)
        return self.follow(job)

    def bring_home(self, job_id: str) -> Results:
        from provisioner.jobs.home import bring_home

        return bring_home(self.target, job_id, self.results_root / job_id)

    def resume(self, spec: JobSpec, source: str) -> JobSpec:
        from provisioner.jobs.repair import resuming

        spec, self.prepare = resuming(self.target, spec, source, self.results_root, self.handlers)
        return spec

    # what only a cluster has: its jobs after `submit` is gone
    def jobs(self) -> list[JobRow]:
        """Every job on the cluster."""
        from provisioner.jobs.control import list_jobs

        with self.target.link() as link:
            return list_jobs(link)

    def log(self, job_id: str) -> list[str]:
        """The job's whole log (its visible lines), as far as it is written."""
        from provisioner.errors import OperationError
        from provisioner.jobs.client import JOB_LOG_CAP, job_log
        from provisioner.jobs.stream import job_info, visible

        with self.target.link() as link:
            job_info(link, job_id)
            text = job_log(link.client, job_id)
        if text is None:
            raise OperationError(
                f"the log of job {job_id} is over {JOB_LOG_CAP >> 20} MiB, more than is read "
                "here at once",
                f"stream it line by line: provisioner jobs logs {job_id} --follow",
            )
        return visible(text.splitlines())

    def stop(self, job_id: str) -> tuple[str, str]:
        """Stop the job and wait until it has stopped: (status, Ray's message)."""
        from provisioner.jobs import control
        from provisioner.jobs.stream import job_info

        with self.target.link() as link:
            job_info(link, job_id)
            return control.stop(link, job_id)


def evaluate(
    target: Target, found: Found, episodes: int, video: int, handlers: Handlers
) -> JobOutcome:
    """`provisioner eval`: the checkpoint `found` evaluated by a job on the cluster (its
    runner and the checkpoint's copy the working_dir), followed to its end; its results
    home in RESULTS/NAME/eval-*/ (`read_eval` of the outcome's folder: the figures)."""
    import tempfile

    check_counts(episodes, video)
    trained = (
        f"; training return there {found.training_return:.2f}"
        if found.training_return is not None
        else ""
    )
    handlers.report(
        f"evaluating {found.label} of {found.source}"
        + (f" (best of {found.trials} trials)" if found.trials > 1 else "")
        + trained
    )
    place = Cluster(target, found.home, handlers)
    with tempfile.TemporaryDirectory(prefix="provisioner-eval-") as work:
        return place.run(eval_spec(found, episodes, video, Path(work)))


# what the scheduler runs, where its output and results are (`slurm.sbatch`'s script)
SBATCH_OUTPUT = "NAME-JOBID.out in the folder sbatch ran in"
SBATCH_RESULTS = "$RESULTS_DIR (default $HOME/provisioner-results/NAME-JOBID) of the batch host"


@dataclass
class Sbatch(Place):
    """A SLURM allocation's standalone sbatch script: `submit` writes it (the script
    carries the playbook's folder; nothing of provisioner is needed on the cluster); the
    user hands it to `sbatch` on the login node, and SLURM runs it when it can."""

    name: ClassVar[str] = "sbatch"
    inventory: Inventory

    def submit(self, spec: JobSpec) -> Submitted:
        return Submitted("", self.name, script=self.script(spec))

    def script(self, spec: JobSpec) -> str:
        """The sbatch script that runs `spec` on Ray across the allocation."""
        from provisioner.slurm.sbatch import SbatchJob, pack_playbook, render_sbatch

        if spec.runner:
            raise InputError(
                "an experiment file is validated against a running cluster and run by it: "
                "it has no sbatch script",
                "start Ray on the allocation (`provisioner up -i INVENTORY`), then "
                f"`provisioner submit -i INVENTORY {spec.playbook.name}`",
            )
        inv = self.inventory
        if inv.slurm is None:
            raise InputError(
                "the inventory has no scheduler section",
                "add scheduler: {type: slurm, login: ADDRESS, nodes: N, ...}",
                where=str(inv.path),
            )
        if not spec.playbook.is_file():
            raise InputError(f"no playbook at {spec.playbook}", "pass the path of a Python file")
        job = SbatchJob(
            name=inv.cluster,
            slurm=inv.slurm,
            playbook=spec.playbook.name,
            args=spec.args,
            payload=pack_playbook(spec.playbook),
            python=inv.ray_python,
            source=inv.path.name,
            tls=inv.tls,
            watch=watcher_command('"$PY"', '"$DRIVER_PID"'),
        )
        return render_sbatch(job)

    def follow(self, job: Submitted) -> JobOutcome:
        raise InputError(
            "an sbatch script runs when SLURM starts it, not from here: it is not followed",
            f"watch it on the login node (squeue -j JOBID); its output is {SBATCH_OUTPUT}",
        )

    def bring_home(self, job_id: str) -> Results:
        raise InputError(
            f"the results of sbatch job {job_id} stay on the allocation: nothing of "
            "provisioner runs there to send them",
            f"copy {SBATCH_RESULTS} (e.g. scp -r through the login node); or train with "
            "`provisioner up` on the allocation and `provisioner submit`, whose results "
            "come home",
        )

    def resume(self, spec: JobSpec, source: str) -> JobSpec:
        raise InputError(
            "an sbatch script starts its playbook afresh: it carries no checkpoint",
            "resume on the allocation as a cluster: `provisioner up -i INVENTORY`, then "
            f"`provisioner submit --resume {source} PLAYBOOK`",
        )


__all__ = [
    "DEFAULT_METRIC",
    "Cluster",
    "Cost",
    "Found",
    "Handlers",
    "JobOutcome",
    "JobSpec",
    "NoiseFilter",
    "Place",
    "Results",
    "Sbatch",
    "Submitted",
    "Target",
    "Upload",
    "asks_for_help",
    "check_counts",
    "check_job_id",
    "evaluate",
    "experiment_spec",
    "find_checkpoint",
    "finish",
    "is_experiment",
    "local_help",
    "make_spec",
    "prepare_experiment",
    "priced",
    "read_eval",
    "read_experiment",
    "read_rows",
    "target_for",
    "upload_for",
    "upload_line",
]
