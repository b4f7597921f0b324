"""The nodes a scheduler gives, for the cluster verbs: `up` holds them before anything runs
there (so does `jobs submit --retries`' repair, which is `up`), `down` gives them back once
Ray has stopped on them. An inventory without a scheduler: its own nodes, as they are."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.console import Reporter, quiet
from provisioner.inventory import Inventory
from provisioner.inventory.loader import require_nodes
from provisioner.remote import Pool
from provisioner.slurm.allocate import allocate, release


@dataclass(frozen=True)
class Released:
    """A scheduler's job given back: its id (None: none was recorded) and whether it left
    the queue."""

    job_id: int | None
    left_queue: bool

    def to_json(self) -> dict[str, object]:
        return {"job_id": self.job_id, "left_queue": self.left_queue}


def hold(
    inventory: Inventory, report: Reporter = quiet, *, queue_timeout: float | None = None
) -> tuple[Inventory, int | None]:
    """The inventory with its nodes, and the scheduler's job that holds them (None: no
    scheduler): the recorded job while it is alive and this cluster's, else a new one,
    waited for (slurm.allocate)."""
    if inventory.slurm is None:
        return require_nodes(inventory), None
    with Pool(inventory) as pool:
        got = allocate(inventory, pool, report, queue_timeout=queue_timeout)
    return require_nodes(got.inventory), got.job_id


def give_back(inventory: Inventory, pool: Pool, report: Reporter = quiet) -> Released | None:
    """Cancel the scheduler's recorded job and wait until it left the queue (None: no
    scheduler). After Ray stopped on its nodes, or before the allocation ever ran."""
    if inventory.slurm is None:
        return None
    job_id, gone = release(inventory, pool, report)
    return Released(job_id, gone)
