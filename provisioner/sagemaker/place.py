"""SageMaker (local mode) as a `provisioner.jobs.place.Place`: the job runs under the
SDK's local mode (`sagemaker.local`), and its outcome is a `JobOutcome` whose results
are finished by the shared `jobs.results.finish`."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.console import Reporter, quiet
from provisioner.sagemaker.local import RunOptions, RunResult, require_ok, run_local


@dataclass
class SageMakerLocal:
    """The playbook of `opts` as a SageMaker training job in local mode (this machine's
    Docker)."""

    opts: RunOptions
    report: Reporter = quiet

    @property
    def name(self) -> str:
        return "sagemaker-local"

    def run(self) -> RunResult:
        return run_local(self.opts, self.report)


__all__ = ["RunOptions", "RunResult", "SageMakerLocal", "require_ok"]
