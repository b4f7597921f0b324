"""SageMaker (local mode) as a `provisioner.jobs.place.Place`: the job runs under the
SDK's local mode (`sagemaker.local`), which waits for its end, so `submit` runs it whole;
its outcome is a `JobOutcome` (`RunResult`) whose results are finished by the shared
`jobs.home.finish`, and its cost is read as every place's (`Place.cost`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError
from provisioner.jobs.place import JobSpec, Place, Results, Submitted, finish
from provisioner.sagemaker.local import LOG_FILE, RunOptions, RunResult, require_ok, run_local


@dataclass
class SageMakerLocal(Place):
    """Playbooks as SageMaker training jobs in local mode (this machine's Docker), their
    results into `results_root`/JOB/."""

    name = "sagemaker-local"
    instance_type: str
    instance_count: int
    results_root: Path
    state_dir: Path
    pin_path: Path
    price_per_hour: float | None = None
    report: Reporter = quiet

    def options(self, spec: JobSpec) -> RunOptions:
        return RunOptions(
            playbook=spec.playbook,
            args=spec.args,
            instance_type=self.instance_type,
            instance_count=self.instance_count,
            results_root=self.results_root,
            state_dir=self.state_dir,
            pin_path=self.pin_path,
            resume=spec.resumed_from or None,
            price_per_hour=self.price_per_hour,
        )

    def submit(self, spec: JobSpec) -> Submitted:
        ended = run_local(self.options(spec), self.report)
        return Submitted(ended.job_id, self.name, ended=ended)

    def follow(self, job: Submitted) -> RunResult:
        if isinstance(job.ended, RunResult):
            return job.ended
        raise InputError(
            f"SageMaker job {job.job_id} is followed only by the run that started it "
            "(local mode ends with it)",
            f"read its output in {self.results_root / job.job_id / LOG_FILE}",
        )

    def run(self, spec: JobSpec) -> RunResult:
        return self.follow(self.submit(spec))

    def bring_home(self, job_id: str) -> Results:
        """Local mode brings everything home while the job runs: what is home now."""
        home = self.results_root / job_id
        if not home.is_dir():
            raise InputError(
                f"no SageMaker job {job_id} in {self.results_root}",
                "give the job id `sagemaker run` printed, and the same --results",
            )
        return finish(home, None)

    def resume(self, spec: JobSpec, source: str) -> JobSpec:
        """The checkpoint (of a cluster or SageMaker job, or a folder) is put into the
        checkpoint channel when the job starts (`sagemaker.local.seed_resume`)."""
        return replace(spec, resumed_from=source)


__all__ = ["JobSpec", "RunOptions", "RunResult", "SageMakerLocal", "require_ok"]
