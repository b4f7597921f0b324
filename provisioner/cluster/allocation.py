"""The nodes a scheduler gives, for the cluster verbs: `up` holds them before anything runs
there (so does `jobs submit --retries`' repair, which is `up`), `status` asks the queue
about the job that holds them, `down` gives them back once Ray has stopped on them. An
inventory without a scheduler: its own nodes, as they are."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError
from provisioner.inventory import Inventory
from provisioner.inventory.allocation import read_allocation
from provisioner.inventory.loader import require_nodes
from provisioner.remote import Pool
from provisioner.slurm.allocate import allocate, queue_state, release
from provisioner.slurm.commands import QueueState, time_seconds_left

# The job is near its time limit with less than this left, or less than this share of it.
NEAR_LIMIT_S = 600
NEAR_LIMIT_SHARE = 0.1


@dataclass(frozen=True)
class Released:
    """A scheduler's job given back: its id (None: none was recorded) and whether it left
    the queue."""

    job_id: int | None
    left_queue: bool

    def to_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "left_queue": self.left_queue}


def hold(
    inventory: Inventory,
    report: Reporter = quiet,
    *,
    queue_timeout: float | None = None,
    pool: Pool | None = None,
) -> tuple[Inventory, int | None]:
    """The inventory with its nodes, and the scheduler's job that holds them (None: no
    scheduler): the recorded job while it is alive and this cluster's, else a new one,
    waited for (slurm.allocate). `pool`: connections to the inventory's nodes (the login
    node, with a scheduler) to use, left open."""
    if inventory.slurm is None:
        return require_nodes(inventory), None
    with ExitStack() as stack:
        pool = pool if pool is not None else stack.enter_context(Pool(inventory))
        got = allocate(inventory, pool, report, queue_timeout=queue_timeout)
    return require_nodes(got.inventory), got.job_id


def give_back(inventory: Inventory, pool: Pool, report: Reporter = quiet) -> Released | None:
    """Cancel the scheduler's recorded job and wait until it left the queue (None: no
    scheduler). After Ray stopped on its nodes, or before the allocation ever ran."""
    if inventory.slurm is None:
        return None
    job_id, gone = release(inventory, pool, report)
    return Released(job_id, gone)


def on_nodes(inventory: Inventory) -> bool:
    """Whether the inventory's Ray may run on nodes: it has nodes of its own, or the
    scheduler's allocation ran (else a job still queued, or none: nothing on any node)."""
    return inventory.slurm is None or inventory.allocated


@dataclass(frozen=True)
class Job:
    """The scheduler's job that holds the nodes, as the queue shows it (`status`)."""

    job_id: int
    queue: QueueState

    @property
    def state(self) -> str:
        return self.queue.state or "GONE"

    @property
    def running(self) -> bool:
        return self.queue.state == "RUNNING"

    @property
    def time_left_s(self) -> int | None:
        return time_seconds_left(self.queue.time_left)

    @property
    def near_limit(self) -> bool:
        """Pure: less than NEAR_LIMIT_S left, or less than NEAR_LIMIT_SHARE of its limit."""
        left = self.time_left_s
        limit = time_seconds_left(self.queue.time_limit)
        return left is not None and (
            left < NEAR_LIMIT_S or (limit is not None and left < limit * NEAR_LIMIT_SHARE)
        )

    def to_json(self) -> dict[str, Any]:
        q = self.queue
        return {
            "job_id": self.job_id,
            "state": self.state,
            "reason": q.reason,
            "nodes": q.nodelist,
            "time_left": q.time_left,
            "time_left_s": self.time_left_s,
            "time_limit": q.time_limit,
            "near_limit": self.near_limit,
        }


def job_status(inventory: Inventory, report: Reporter = quiet) -> Job | None:
    """The recorded job as the queue shows it, reported (with a warning near its time
    limit); None: no scheduler, or no job recorded. A job no longer in the queue is an
    OperationError: the nodes are gone."""
    if inventory.slurm is None:
        return None
    recorded = read_allocation(inventory)
    if recorded is None:
        return None
    assert inventory.login is not None
    with Pool(inventory) as pool:
        state = queue_state(pool.session(inventory.login), inventory, recorded.job_id, recorded.tag)
    job = Job(recorded.job_id, state)
    report(
        f"SLURM job {recorded.job_id}: {state.describe()}"
        + (f" on {state.nodelist}, {state.time_left} left" if job.running else "")
    )
    if job.near_limit:
        report(
            f"warning: SLURM job {recorded.job_id} has {state.time_left} left: SLURM ends "
            "it at its time limit (save a checkpoint; up again later resumes)"
        )
    if state.gone:
        raise OperationError(
            f"SLURM job {recorded.job_id} is no longer in the queue: the nodes are gone",
            "run `provisioner down` to forget it, then `provisioner up` for a new allocation",
        )
    return job
