"""`submit --resume JOB|PATH`: continue a run from its latest checkpoint.

The new job's results directory on the head is seeded before the job starts: the
checkpoint under `resume/checkpoint/`, and the earlier run's `metrics.csv` and
`tensorboard/`, so the iteration and env-step counters, the metrics, the TensorBoard
curves and the plot go on instead of restarting. What the head still holds (the same
cluster, its disk survived the container) is copied there; anything else is sent from
this machine over SFTP (a freshly brought-up cluster, another head).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError
from provisioner.jobs.link import Link
from provisioner.jobs.pull import enter_command
from provisioner.jobs.spec import JOB_ID, RESUME_DIR
from provisioner.jobs.upload import sendable_files
from provisioner.node import layout
from provisioner.remote.session import Session

CHECKPOINT = re.compile(r"^iter-(\d+)$")
SEEDS = ("metrics.csv", "tensorboard")


@dataclass(frozen=True)
class Source:
    """What a run continues from: a checkpoint, and the results it belongs to (if any)."""

    checkpoint: Path  # local
    results: Path | None  # the local results directory holding metrics.csv, tensorboard/
    job_id: str | None  # the earlier job, when resuming a job
    label: str

    @property
    def on_head(self) -> str | None:
        """The checkpoint's path relative to the earlier job's results directory."""
        if self.job_id is None or self.results is None:
            return None
        return self.checkpoint.relative_to(self.results).as_posix()


def latest_checkpoint(results: Path) -> Path | None:
    """The newest complete checkpoint (checkpoints/iter-NNNNNN) in a results directory."""
    found = [
        (int(m.group(1)), p)
        for p in (results / "checkpoints").glob("iter-*")
        if p.is_dir() and (m := CHECKPOINT.match(p.name))
    ]
    return max(found)[1] if found else None


def find_source(value: str, results_root: Path) -> Source:
    """JOB (its results under RESULTS/JOB, brought home first) or a local PATH: a job's
    results directory or one checkpoint directory."""
    path = Path(value).expanduser()
    if path.is_dir():
        latest = latest_checkpoint(path)
        if latest is not None:
            return Source(latest, path, None, str(path))
        return Source(path, None, None, str(path))
    if not JOB_ID.match(value):
        raise InputError(
            f"--resume {value}: neither a directory nor a job id", "give a job id or a checkpoint"
        )
    home = results_root / value
    latest = latest_checkpoint(home)
    if latest is None:
        raise InputError(
            f"--resume {value}: no checkpoint of job {value} here or on the head",
            f"bring it home with `provisioner jobs results {value}`, or give a checkpoint path",
        )
    return Source(latest, home, value, value)


def head_copy_command(cluster: str, old: str, checkpoint: str, new: str) -> str:
    """Seed NEW from OLD on the head itself; exit 3 when the head lacks the checkpoint."""
    root = layout.node_results_dir(cluster)
    src = shlex.quote(f"{old}/{checkpoint}")
    dest = shlex.quote(f"{new}/{RESUME_DIR}")
    seeds = " ".join(
        f"if [ -e {shlex.quote(f'{old}/{name}')} ]; then cp -rP {shlex.quote(f'{old}/{name}')} "
        f"{shlex.quote(f'{new}/')}; fi;"
        for name in SEEDS
    )
    return (
        f"cd -P {root} && [ -d {src} ] && [ ! -L {shlex.quote(old)} ] || exit 3; "
        f"mkdir -p {dest} && ( {enter_command(cluster, f'{new}/{RESUME_DIR}')} ) && "
        f"cp -rP {src} {dest}/checkpoint && {seeds} true"
    )


def upload(session: Session, cluster: str, local: Path, remote_rel: str) -> int:
    """Send a local file or directory to the head under the results root; files sent.
    Local links are never followed and secrets stay here (`sendable_files`); on the head
    every folder written into is checked not to be a link before a file goes in."""
    if local.is_symlink():
        return 0
    files = [local] if local.is_file() else sendable_files(local)[0]
    base = local.parent if local.is_file() else local
    targets = [f"{remote_rel}/{p.relative_to(base).as_posix()}" for p in files]
    dirs = sorted({t.rsplit("/", 1)[0] for t in targets})
    if dirs:
        words = " ".join(layout.node_results_dir(cluster, d) for d in dirs)
        checks = " && ".join(f"( {enter_command(cluster, d)} )" for d in dirs)
        made = session.run(f"mkdir -p {words} && {checks}", timeout=60)
        made.check("a folder of the resumed job on the head is a link (a hostile job?)")
    for path, target in zip(files, targets, strict=True):
        session.sftp_put(path, layout.node_results_rel(cluster, target))
    return len(files)


def seed(link: Link, source: Source, new_job: str) -> str:
    """Put the checkpoint and the earlier metrics into NEW's results on the head; say how."""
    assert link.inventory is not None
    cluster = link.inventory.cluster
    session = link.head()
    if source.job_id is not None and source.on_head is not None:
        copied = session.run(
            head_copy_command(cluster, source.job_id, source.on_head, new_job), timeout=300
        )
        if copied.ok:
            return f"the head's own copy of {source.job_id}/{source.on_head}"
        if copied.exit_code != 3:
            copied.check()
    sent = upload(session, cluster, source.checkpoint, f"{new_job}/{RESUME_DIR}/checkpoint")
    if source.results is not None:
        for name in SEEDS:
            local = source.results / name
            if local.exists():
                remote = f"{new_job}/{name}" if local.is_dir() else new_job
                sent += upload(session, cluster, local, remote)
    return f"{source.checkpoint} sent from this machine ({sent} files)"
