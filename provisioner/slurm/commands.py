"""SLURM commands run on the login node, as pure quoted builders, and their parsers."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from provisioner.inventory.allocation import AllocatedNode
from provisioner.inventory.models import Slurm
from provisioner.slurm.sbatch import sbatch_directives

# What a holding job runs: nothing, until `down` cancels it or the time limit ends it.
HOLD = "exec sleep infinity"
FIELD_SEP = "|"


def job_name(cluster: str) -> str:
    return f"provisioner-{cluster}"


def submit_command(slurm: Slurm, cluster: str) -> str:
    """sbatch a job that holds the allocation; prints the job id (`--parsable`). It
    writes nothing (no shared filesystem is assumed: an output path on the login node
    may not exist on the batch host, and then SLURM fails the job at once)."""
    options = " ".join(shlex.quote(o) for o in sbatch_directives(slurm, job_name(cluster)))
    return f"sbatch --parsable {options} --output=/dev/null --wrap={shlex.quote(HOLD)}"


def queue_command(job_id: int, partition: str | None) -> str:
    """The job's line in squeue (state, reason, nodes, time left, time limit), then `==`,
    then the pending jobs of its partition by priority (the job's place in the queue)."""
    fmt = FIELD_SEP.join(("%T", "%r", "%N", "%L", "%l"))
    part = f" -p {shlex.quote(partition)}" if partition else ""
    return (
        f"squeue -h -j {int(job_id)} -o {shlex.quote(fmt)} 2>/dev/null; echo ==; "
        f"squeue -h -t PD{part} -o %i --sort=-p,i 2>/dev/null; true"
    )


@dataclass(frozen=True)
class QueueState:
    """The job as squeue shows it; state "" when it is not in the queue (any more)."""

    state: str = ""
    reason: str = ""
    nodelist: str = ""
    time_left: str = ""
    time_limit: str = ""
    position: int | None = None  # among the partition's pending jobs, 1 = next

    @property
    def gone(self) -> bool:
        return self.state == ""

    def describe(self) -> str:
        if self.gone:
            return "not in the queue"
        text = self.state
        if self.reason and self.reason != "None":
            text += f" ({self.reason})"
        if self.position is not None and self.state == "PENDING":
            text += f", place {self.position} in the queue"
        return text


def parse_queue(stdout: str, job_id: int) -> QueueState:
    mine, _, pending = stdout.partition("==")
    line = next((x for x in mine.splitlines() if x.strip()), "")
    if not line:
        return QueueState()
    state, reason, nodelist, left, limit = (
        p.strip() for p in (line.split(FIELD_SEP) + [""] * 5)[:5]
    )
    ids = [x.strip() for x in pending.splitlines() if x.strip()]
    position = ids.index(str(job_id)) + 1 if str(job_id) in ids else None
    return QueueState(state, reason, nodelist, left, limit, position)


def nodes_command(nodelist: str) -> str:
    """Each node of a nodelist: `NAME NODEADDR IPV4`, as slurmctld and this node resolve it."""
    return (
        f"for n in $(scontrol show hostnames {shlex.quote(nodelist)}); do "
        "a=$(scontrol show node -o \"$n\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'); "
        "ip=$(getent ahostsv4 \"${a:-$n}\" | awk 'NR == 1 {print $1}'); "
        'echo "$n ${a:-$n} ${ip:-?}"; done'
    )


def parse_nodes(stdout: str) -> tuple[AllocatedNode, ...]:
    nodes = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            name, addr, ip = parts
            nodes.append(AllocatedNode(name, ip if ip != "?" else addr))
    return tuple(nodes)


def cancel_command(job_id: int) -> str:
    return f"scancel {int(job_id)}"


def time_seconds_left(text: str) -> int | None:
    """squeue's %L (D-HH:MM:SS, HH:MM:SS, MM:SS) in seconds; None for INVALID/UNLIMITED."""
    from provisioner.inventory.models import time_seconds

    try:
        if text.count(":") == 1 and "-" not in text:
            mm, ss = text.split(":")
            return int(mm) * 60 + int(ss)
        return time_seconds(text)
    except ValueError:
        return None
