"""The seam for where a job runs: a `Place` runs a job and says how it ended, as a
`JobOutcome`, whatever the place.

What a job does after it ends is written once, here and in `provisioner.jobs.results`:
`results.finish(home, pulled)` reads what is home in RESULTS/JOB/ (the files, the
summary.json, the plots drawn here), and every place returns its outcome with those
`Results` in it, so the summary, the cost line and the plots are one code path.

The places:
- `Cluster` (here): a Ray job on the cluster (`jobs.submit`; with `--retries`, the
  repair-and-resume loop of `jobs.repair`); results home over SSH;
- `provisioner.sagemaker.place.SageMakerLocal`: a SageMaker training job in local mode;
  its outcome is a `JobOutcome` (`sagemaker.local.RunResult`, a subclass that keeps the
  SageMaker fields and its JSON);
- a SLURM allocation's standalone sbatch script (`slurm.sbatch`) is written for a
  scheduler to run later, so nothing here runs it; it is not yet behind this seam.

A new place (experiments, evaluation) is a class with `name` and `run()`, returning a
`JobOutcome` whose `results` come from `results.finish`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from provisioner.jobs.link import Link, Target
from provisioner.jobs.repair import with_retries
from provisioner.jobs.results import finish
from provisioner.jobs.spec import JobSpec
from provisioner.jobs.stream import Handlers
from provisioner.jobs.submit import JobOutcome, submit


@runtime_checkable
class Place(Protocol):
    """Where a job runs: it submits the job, follows it, brings its results home into
    RESULTS/JOB/ (finished by `results.finish`) and says how it ended."""

    @property
    def name(self) -> str: ...

    def run(self) -> JobOutcome: ...


@dataclass
class Cluster:
    """A Ray job on the cluster (`target`), followed unless `detach`; with `retries`,
    repaired and resumed when a node is lost."""

    target: Target
    spec: JobSpec
    results_root: Path
    handlers: Handlers
    detach: bool = False
    retries: int = 0
    prepare: Callable[[Link], None] | None = None

    @property
    def name(self) -> str:
        return "cluster"

    def run(self) -> JobOutcome:
        if self.retries and not self.detach:
            return with_retries(
                self.target, self.spec, self.results_root, self.retries, self.handlers, self.prepare
            )
        return submit(
            self.target,
            self.spec,
            self.results_root,
            handlers=self.handlers,
            detach=self.detach,
            prepare=self.prepare,
        )


__all__ = ["Cluster", "JobOutcome", "Place", "finish"]
