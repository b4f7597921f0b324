"""Ask SLURM for the nodes, wait for them, give them back: the login node's part of `up`,
`status` and `down` on a cluster whose inventory has a scheduler section."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError, RemoteError
from provisioner.inventory.allocation import (
    Allocation,
    forget_allocation,
    read_allocation,
    with_allocation,
    write_allocation,
)
from provisioner.inventory.models import Inventory, Node
from provisioner.remote import Pool
from provisioner.remote.session import Session
from provisioner.slurm import commands

POLL_S = 2.0
ALIVE = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED")


class QueueTimeout(OperationError):
    pass


def _login(inventory: Inventory) -> Node:
    assert inventory.login is not None and inventory.slurm is not None
    return inventory.login


def queue_state(session: Session, inventory: Inventory, job_id: int) -> commands.QueueState:
    assert inventory.slurm is not None
    done = session.run(commands.queue_command(job_id, inventory.slurm.partition), timeout=30)
    return commands.parse_queue(done.stdout, job_id)


def submit(session: Session, inventory: Inventory, report: Reporter) -> int:
    assert inventory.slurm is not None
    done = session.run(commands.submit_command(inventory.slurm, inventory.cluster), timeout=60)
    text = done.stdout.strip().split(";")[0]
    if not done.ok or not text.isdigit():
        raise RemoteError(
            _login(inventory).name,
            f"sbatch refused the allocation: {done.tail(5)}",
            "check the scheduler section (partition, account, time) with `sinfo` and "
            "`sacctmgr show assoc user=$USER` on the login node",
            kind="slurm",
        )
    return int(text)


def cancel(session: Session, job_id: int, *, wait_s: float = 60) -> bool:
    """scancel the job and wait until it left the queue; True when it did."""
    session.run(commands.cancel_command(job_id), timeout=30)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        done = session.run(commands.queue_command(job_id, None), timeout=30)
        if commands.parse_queue(done.stdout, job_id).gone:
            return True
        time.sleep(1)
    return False


@dataclass
class Allocated:
    inventory: Inventory  # head and workers: the allocated nodes
    job_id: int
    reused: bool
    waited_s: float


def allocate(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    queue_timeout: float | None = None,
    on_state: Callable[[commands.QueueState], None] | None = None,
) -> Allocated:
    """The running allocation of this cluster: the recorded job when it is still alive,
    else a new holding job. Waits while it is PENDING, reporting the state and the
    scheduler's reason when they change; Ctrl-C (or the queue timeout) while waiting
    cancels the job, so nothing is left queued."""
    login = _login(inventory)
    session = pool.session(login)
    t0 = time.monotonic()
    recorded = read_allocation(inventory)
    reused = False
    job_id: int | None = None
    if recorded is not None:
        state = queue_state(session, inventory, recorded.job_id)
        if state.state in ALIVE:
            job_id, reused = recorded.job_id, True
            report(f"SLURM job {job_id}: {state.describe()} (recorded by an earlier up)")
        else:
            report(f"SLURM job {recorded.job_id}: {state.describe()}; asking for a new one")
            forget_allocation(inventory)
    if job_id is None:
        job_id = submit(session, inventory, report)
        write_allocation(inventory, Allocation(job_id))  # so that down can cancel it
        report(f"SLURM job {job_id} submitted (holds the allocation until down)")
    try:
        nodelist = _wait_running(session, inventory, job_id, report, queue_timeout, on_state)
    except BaseException:  # Ctrl-C, a timeout, a lost login node: never leave it queued
        if not reused:
            report(f"SLURM job {job_id}: cancelling it")
            try:
                cancel(session, job_id, wait_s=20)
            finally:
                forget_allocation(inventory)
        raise
    done = session.run(commands.nodes_command(nodelist), timeout=60)
    nodes = commands.parse_nodes(done.stdout)
    if not nodes:
        raise RemoteError(
            login.name,
            f"could not read the nodes of SLURM job {job_id} ({nodelist}): {done.tail(5)}",
            "look at `scontrol show job` on the login node",
            kind="slurm",
        )
    allocation = Allocation(job_id, nodes)
    write_allocation(inventory, allocation)
    report(f"SLURM job {job_id}: RUNNING on {', '.join(f'{n.name} ({n.address})' for n in nodes)}")
    return Allocated(with_allocation(inventory, allocation), job_id, reused, time.monotonic() - t0)


def _wait_running(
    session: Session,
    inventory: Inventory,
    job_id: int,
    report: Reporter,
    queue_timeout: float | None,
    on_state: Callable[[commands.QueueState], None] | None,
) -> str:
    deadline = None if queue_timeout is None else time.monotonic() + queue_timeout
    last = ""
    while True:
        state = queue_state(session, inventory, job_id)
        if on_state is not None:
            on_state(state)
        if state.describe() != last:
            report(f"SLURM job {job_id}: {state.describe()}")
            last = state.describe()
        if state.state == "RUNNING" and state.nodelist:
            return state.nodelist
        if state.state not in ALIVE:
            raise OperationError(
                f"SLURM job {job_id} ended before it ran ({state.describe()})",
                "look at `sacct -j JOB` on the login node; then run up again",
            )
        if deadline is not None and time.monotonic() > deadline:
            raise QueueTimeout(
                f"SLURM job {job_id} still {state.describe()} after {queue_timeout:.0f}s; "
                "cancelled",
                "run up again later, or ask for fewer nodes or less time",
            )
        time.sleep(POLL_S)


def release(inventory: Inventory, pool: Pool, report: Reporter = quiet) -> tuple[int | None, bool]:
    """Cancel the recorded job and check that it left the queue; (job id, gone)."""
    recorded = read_allocation(inventory)
    if recorded is None:
        return None, True
    session = pool.session(_login(inventory))
    report(f"SLURM job {recorded.job_id}: cancelling it")
    gone = cancel(session, recorded.job_id)
    if gone:
        forget_allocation(inventory)
        report(f"SLURM job {recorded.job_id}: left the queue")
    return recorded.job_id, gone
