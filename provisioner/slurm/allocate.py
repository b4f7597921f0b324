"""Ask SLURM for the nodes, wait for them, give them back: the login node's part of `up`,
`status` and `down` on a cluster whose inventory has a scheduler section."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError, RemoteError
from provisioner.inventory.allocation import (
    AllocatedNode,
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


def owner(inventory: Inventory, tag: str) -> commands.Owner:
    """This cluster's job: its name, and the tag recorded with its id."""
    return commands.Owner(commands.job_name(inventory.cluster), tag)


def queue_state(
    session: Session, inventory: Inventory, job_id: int, tag: str = ""
) -> commands.QueueState:
    """The job as squeue shows it, when it is this cluster's (else: gone, `other` says
    whose it is). What the login node answers is checked (InputError, `where` it)."""
    assert inventory.slurm is not None
    done = session.run(commands.queue_command(job_id, inventory.slurm.partition), timeout=30)
    try:
        return commands.parse_queue(done.stdout, job_id, owner(inventory, tag))
    except InputError as exc:
        exc.where = _login(inventory).name
        raise


def submit(session: Session, inventory: Inventory, report: Reporter, tag: str = "") -> int:
    assert inventory.slurm is not None
    done = session.run(commands.submit_command(inventory.slurm, inventory.cluster, tag), timeout=60)
    job_id = commands.parse_job_id(done.stdout)
    if not done.ok or job_id is None:
        raise RemoteError(
            _login(inventory).name,
            f"sbatch refused the allocation: {done.tail(5)}",
            "check the scheduler section (partition, account, time) with `sinfo` and "
            "`sacctmgr show assoc user=$USER` on the login node",
            kind="slurm",
        )
    return job_id


def cancel(
    session: Session, inventory: Inventory, job_id: int, tag: str = "", *, wait_s: float = 60
) -> bool:
    """scancel the job, when it is this cluster's (checked first, and by scancel's own
    filters), and wait until it left the queue; True when it did (or was never there)."""
    if queue_state(session, inventory, job_id, tag).gone:
        return True  # gone already, or the id names another job now: never cancel that
    session.run(commands.cancel_command(job_id, owner(inventory, tag)), timeout=30)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if queue_state(session, inventory, job_id, tag).gone:
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
    tag = ""
    if recorded is not None:
        state = queue_state(session, inventory, recorded.job_id, recorded.tag)
        if state.state in ALIVE:  # and it is this cluster's job (name, user, tag)
            job_id, tag, reused = recorded.job_id, recorded.tag, True
            report(f"SLURM job {job_id}: {state.describe()} (recorded by an earlier up)")
        else:
            report(f"SLURM job {recorded.job_id}: {state.describe()}; asking for a new one")
            forget_allocation(inventory)
    if job_id is None:
        tag = secrets.token_hex(8)
        job_id = submit(session, inventory, report, tag)
        write_allocation(inventory, Allocation(job_id, tag=tag))  # so that down can cancel it
        report(f"SLURM job {job_id} submitted (holds the allocation until down)")
    try:
        nodelist = _wait_running(session, inventory, job_id, tag, report, queue_timeout, on_state)
        nodes = _read_nodes(session, login, job_id, nodelist)
    except BaseException:  # Ctrl-C, a timeout, a lost login node, a hostile answer:
        if not reused:  # never leave it queued
            report(f"SLURM job {job_id}: cancelling it")
            try:
                cancel(session, inventory, job_id, tag, wait_s=20)
            finally:
                forget_allocation(inventory)
        raise
    allocation = Allocation(job_id, nodes, tag)
    write_allocation(inventory, allocation)
    report(f"SLURM job {job_id}: RUNNING on {', '.join(f'{n.name} ({n.address})' for n in nodes)}")
    return Allocated(with_allocation(inventory, allocation), job_id, reused, time.monotonic() - t0)


def _read_nodes(
    session: Session, login: Node, job_id: int, nodelist: str
) -> tuple[AllocatedNode, ...]:
    """The job's nodes, names and addresses checked (InputError, exit 2, naming the login
    node: nothing of a hostile answer is recorded or used)."""
    try:
        done = session.run(
            commands.nodes_command(commands.check_nodelist(nodelist, job_id)), timeout=60
        )
        nodes = commands.parse_nodes(done.stdout)
    except InputError as exc:
        exc.where = login.name
        raise
    if not nodes:
        raise RemoteError(
            login.name,
            f"could not read the nodes of SLURM job {job_id} ({nodelist}): {done.tail(5)}",
            "look at `scontrol show job` on the login node",
            kind="slurm",
        )
    return nodes


def _wait_running(
    session: Session,
    inventory: Inventory,
    job_id: int,
    tag: str,
    report: Reporter,
    queue_timeout: float | None,
    on_state: Callable[[commands.QueueState], None] | None,
) -> str:
    deadline = None if queue_timeout is None else time.monotonic() + queue_timeout
    last = ""
    while True:
        state = queue_state(session, inventory, job_id, tag)
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
    gone = cancel(session, inventory, recorded.job_id, recorded.tag)
    if gone:
        forget_allocation(inventory)
        report(f"SLURM job {recorded.job_id}: left the queue")
    return recorded.job_id, gone
