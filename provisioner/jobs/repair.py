"""`jobs submit --retries` and `--resume`: the repair-and-resume loop below the CLI.

A run that loses a node or its head is repaired with the CLI's own `up` (a scheduler's
nodes held first), tried again `REPAIR_TRIES` times `REPAIR_WAIT_S` apart, and resumed
from the latest checkpoint that came home; `resuming` makes the spec of a run resumed
from a job's (or a folder's) checkpoint, and the step that puts it on the head.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.errors import InputError, OperationError, ProvisionerError
from provisioner.jobs.link import Link, Target
from provisioner.jobs.spec import JOB_ID, JobSpec
from provisioner.jobs.stream import Handlers
from provisioner.jobs.submit import JobOutcome
from provisioner.runtime.context import ClusterContext, cluster_context

if TYPE_CHECKING:
    from provisioner.jobs.resume import Source

REPAIR_TRIES = 5
REPAIR_WAIT_S = 20.0


def with_retries(
    target: Target,
    spec: JobSpec,
    results: Path,
    retries: int,
    handlers: Handlers,
    prepare: Callable[[Link], None] | None,
    *,
    attach: bool = False,
) -> JobOutcome:
    """Run (or with `attach`, follow) the job; when a node is lost or the head restarts,
    repair the cluster with `up` and resume, `retries` times."""
    from provisioner.jobs.resume import find_source, latest_checkpoint, latest_experiment, seed
    from provisioner.jobs.submit import submit_with_retries

    inv = target.inventory
    if inv is None:
        raise InputError("--retries repairs the cluster with `up`: it needs -i INVENTORY", "add -i")
    built: list[ClusterContext] = []  # the command's context with its pin, read once

    def repair() -> None:
        from provisioner.cluster.up import UpOptions, up_cluster

        # a node cut off or powered off for a while comes back: `up` is tried again
        # (REPAIR_TRIES in all, REPAIR_WAIT_S apart) before the run gives up. It is the
        # CLI's `up`: a scheduler's nodes are held first (the recorded job while alive).
        for left in range(REPAIR_TRIES - 1, -1, -1):
            try:
                if not built:
                    built.append(cluster_context(inv))
                up_cluster(built[0], handlers.report, options=UpOptions(doctor=False))
                return
            except OperationError as exc:
                if left == 0:
                    raise
                handlers.report(
                    f"repair failed ({exc}); trying again in {REPAIR_WAIT_S:.0f} s ({left} more)"
                )
                time.sleep(REPAIR_WAIT_S)

    def resume_from(
        following: JobSpec, previous: Path
    ) -> tuple[JobSpec, Callable[[Link], None] | None]:
        from provisioner.jobs.home import bring_home

        # What came home of the lost attempt was brought while its node was down: with the
        # head's Ray container lost, Tune's folder in the store (which runs beside it and
        # kept every trial's results and checkpoints) could not be copied to the head's
        # results, a copy made in that container. The cluster repaired, it can: the
        # attempt's results come home again, Tune's folder from the store with them, so
        # the next attempt goes on from the latest state, not from the head's older copy.
        try:
            again = bring_home(target, previous.name, previous)
        except ProvisionerError as exc:
            handlers.report(f"{previous.name}: its results could not come home again ({exc})")
        else:  # said, not dropped: the next attempt goes on from what is here
            for problem in again.problems():
                handlers.report(f"{previous.name}: {problem}")
        if latest_checkpoint(previous) is None and latest_experiment(previous) is None:
            handlers.report("no checkpoint came home: the next attempt starts afresh")
            return following, prepare
        source = find_source(str(previous), results)
        source = replace(source, job_id=previous.name)

        def step(link: Link) -> None:
            handlers.report(
                f"checkpoint for {following.job_id}: {seed(link, source, following.job_id)}"
            )

        return resumed(following, source, previous.name), step

    return submit_with_retries(
        target,
        spec,
        results,
        retries=retries,
        repair=repair,
        handlers=handlers,
        prepare=prepare,
        resume_prepare=resume_from,
        attach=attach,
    )


def _drop_empty(folder: Path) -> None:
    """Remove `folder` when it exists and holds nothing."""
    with contextlib.suppress(OSError):
        folder.rmdir()


def resuming(
    target: Target, spec: JobSpec, value: str, results: Path, handlers: Handlers
) -> tuple[JobSpec, Callable[[Link], None]]:
    """The spec of a resumed run and the step that puts its checkpoint on the head."""
    from provisioner.jobs.home import bring_home
    from provisioner.jobs.resume import find_source, seed

    if target.inventory is None:
        raise InputError(
            "--resume needs the inventory (the checkpoint goes to the head over SSH)",
            "add -i INVENTORY",
        )
    home = results / value
    by_id = not Path(value).expanduser().is_dir() and JOB_ID.fullmatch(value) is not None
    known = home.is_dir()  # a job known here: its results came home before
    unknown = f"--resume {value}: no such job is known here (no results of it came home here)"
    if by_id:
        handlers.report(f"bringing home what the head holds of {value}")
        try:
            bring_home(target, value, home)
        except ProvisionerError as exc:
            if known:
                raise
            kind = InputError if isinstance(exc, InputError) else OperationError
            raise kind(
                f"{unknown}; nor could the head be asked: {exc}",
                f"check the job id (`provisioner jobs list -i INVENTORY`) or give a "
                f"checkpoint folder; to ask the head: {exc.fix or 'reach it, then retry'}",
                where=str(home),
            ) from exc
    try:
        source = find_source(value, results)
    except InputError as exc:
        came = home.is_dir() and any(home.iterdir())  # the head knew the job, no checkpoint
        if by_id and not known and not came:
            _drop_empty(home)
            raise InputError(
                f"{unknown}, nor on the head",
                "check the job id (`provisioner jobs list -i INVENTORY`), or give a "
                "checkpoint folder",
                where=str(home),
            ) from exc
        raise
    handlers.report(f"resuming from {source.checkpoint}")

    def prepare(link: Link) -> None:
        handlers.report(f"checkpoint for {spec.job_id}: {seed(link, source, spec.job_id)}")

    return resumed(spec, source, source.label), prepare


def resumed(spec: JobSpec, source: Source, label: str) -> JobSpec:
    """`spec` continuing from `source`: a playbook's checkpoint, or a Tune experiment its
    script's first Tuner(...) is, restored."""
    tune = source.checkpoint.name if source.tune else ""
    return replace(spec, resumed_from=label, tune_experiment=tune)


__all__ = ["REPAIR_TRIES", "REPAIR_WAIT_S", "resuming", "with_retries"]
