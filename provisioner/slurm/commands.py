"""SLURM commands run on the login node, as pure quoted builders, and their parsers.

What the login node answers is checked where it is parsed: node names and addresses
(`AllocatedNode`), the nodelist, and whose job a job id is (its name, user and comment),
so that `up` reuses and `down` cancels only this cluster's own job.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from provisioner.errors import InputError
from provisioner.inventory.allocation import NAME_FIX, AllocatedNode
from provisioner.inventory.models import Slurm
from provisioner.slurm.sbatch import sbatch_directives

# What a holding job runs: nothing, until `down` cancels it or the time limit ends it.
HOLD = "exec sleep infinity"
FIELD_SEP = "|"
# A nodelist as squeue prints it (%N): host names, `,` and ranges such as n-[1-3,5].
_NODELIST = re.compile(r"[A-Za-z0-9_.,\[\]-]{1,65536}")
_JOB_ID = re.compile(r"[0-9]{1,12}")


def job_name(cluster: str) -> str:
    return f"provisioner-{cluster}"


def job_comment(tag: str) -> str:
    """The holding job's comment: what, with its name and user, makes it this cluster's."""
    return f"provisioner-{tag}"


@dataclass(frozen=True)
class Owner:
    """Whose job `up` and `down` may reuse or cancel: this cluster's name, the login
    user (`id -un` on the login node, as squeue shows it) and the recorded job's tag."""

    name: str
    tag: str = ""  # "" (a record of an older provisioner): name and user only


def submit_command(slurm: Slurm, cluster: str, tag: str = "") -> str:
    """sbatch a job that holds the allocation; prints the job id (`--parsable`). It
    writes nothing (no shared filesystem is assumed: an output path on the login node
    may not exist on the batch host, and then SLURM fails the job at once). Its comment
    carries the tag that `up` records with the job id."""
    options = " ".join(shlex.quote(o) for o in sbatch_directives(slurm, job_name(cluster)))
    comment = f" --comment={shlex.quote(job_comment(tag))}" if tag else ""
    return f"sbatch --parsable {options}{comment} --output=/dev/null --wrap={shlex.quote(HOLD)}"


def parse_job_id(stdout: str) -> int | None:
    """`sbatch --parsable`'s answer: JOBID or JOBID;CLUSTER (None: anything else)."""
    text = stdout.strip().split(";")[0]
    return int(text) if _JOB_ID.fullmatch(text) else None


def queue_command(job_id: int, partition: str | None) -> str:
    """The login user, `==`, the job's line in squeue (state, reason, nodes, time left,
    time limit, name, user, comment: last, as it may hold `|`), `==`, then the pending
    jobs of its partition by priority (the job's place in the queue)."""
    fmt = FIELD_SEP.join(("%T", "%r", "%N", "%L", "%l", "%j", "%u", "%k"))
    part = f" -p {shlex.quote(partition)}" if partition else ""
    return (
        f"id -un; echo ==; squeue -h -j {int(job_id)} -o {shlex.quote(fmt)} 2>/dev/null; "
        f"echo ==; squeue -h -t PD{part} -o %i --sort=-p,i 2>/dev/null; true"
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
    # The job the id names now is not this cluster's: whose it is ("" when it is ours);
    # then `state` is "": this cluster's job is not in the queue.
    other: str = ""

    @property
    def gone(self) -> bool:
        return self.state == ""

    def describe(self) -> str:
        if self.other:
            return f"not in the queue (the id now names another job: {self.other})"
        if self.gone:
            return "not in the queue"
        text = self.state
        if self.reason and self.reason != "None":
            text += f" ({self.reason})"
        if self.position is not None and self.state == "PENDING":
            text += f", place {self.position} in the queue"
        return text


def parse_queue(stdout: str, job_id: int, owner: Owner) -> QueueState:
    """The job as squeue shows it, when it is `owner`'s (name, user, tag); a job of
    another name, user or comment under that id is this cluster's job gone."""
    user, _, rest = stdout.partition("==")
    mine, _, pending = rest.partition("==")
    line = next((x for x in mine.splitlines() if x.strip()), "")
    if not line:
        return QueueState()
    state, reason, nodelist, left, limit, name, job_user, comment = (
        p.strip() for p in (line.split(FIELD_SEP, 7) + [""] * 8)[:8]
    )
    me = ([x.strip() for x in user.splitlines() if x.strip()] or [""])[-1]  # after any banner
    if (
        name != owner.name
        or not me
        or job_user != me
        or (owner.tag and comment != job_comment(owner.tag))
    ):
        return QueueState(other=f"{name!r} of user {job_user!r}")
    ids = [x.strip() for x in pending.splitlines() if x.strip()]
    position = ids.index(str(job_id)) + 1 if str(job_id) in ids else None
    return QueueState(state, reason, nodelist, left, limit, position)


def check_nodelist(nodelist: str, job_id: int) -> str:
    """The nodelist squeue printed, when it is one (InputError otherwise)."""
    if not _NODELIST.fullmatch(nodelist):
        raise InputError(
            f"refused the nodes of SLURM job {job_id}: nodelist {nodelist[:200]!r} is not "
            "a list of host names",
            NAME_FIX,
        )
    return nodelist


def nodes_command(nodelist: str) -> str:
    """Each node of a nodelist: `NAME NODEADDR IPV4`, as slurmctld and this node resolve it."""
    return (
        f"for n in $(scontrol show hostnames {shlex.quote(nodelist)}); do "
        "a=$(scontrol show node -o \"$n\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'); "
        "ip=$(getent ahostsv4 \"${a:-$n}\" | awk 'NR == 1 {print $1}'); "
        'echo "$n ${a:-$n} ${ip:-?}"; done'
    )


def parse_nodes(stdout: str) -> tuple[AllocatedNode, ...]:
    """The allocated nodes; a name or address that is not a host name is refused
    (InputError from `AllocatedNode`): nothing of the answer is used then."""
    nodes = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            name, addr, ip = parts
            nodes.append(AllocatedNode(name, ip if ip != "?" else addr))
    return tuple(nodes)


def cancel_command(job_id: int, owner: Owner) -> str:
    """scancel the job only while it has this cluster's name and the login user's (SLURM
    applies the filters to the id given); the comment was checked just before."""
    return f'scancel --name={shlex.quote(owner.name)} --user="$(id -un)" {int(job_id)}'


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
