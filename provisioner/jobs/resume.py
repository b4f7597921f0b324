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
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError, OperationError, ProvisionerError, RemoteError
from provisioner.jobs.head_folder import enter_command
from provisioner.jobs.link import Link
from provisioner.jobs.spec import JOB_ID, RESUME_DIR, TUNE_RESUME_DIR
from provisioner.jobs.upload import sendable_files
from provisioner.node import layout
from provisioner.remote.pull import LINK_EXIT
from provisioner.remote.results import Result
from provisioner.remote.session import Session

CHECKPOINT = re.compile(r"^iter-(\d+)$")
SEEDS = ("metrics.csv", "tensorboard")
# Tune's experiments in a job's results (the storage's copy, cluster.storage.Sync)
TUNE_RESULTS = "ray_results"
TUNE_STATE = "experiment_state-*.json"
EXPERIMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")


@dataclass(frozen=True)
class Source:
    """What a run continues from: a checkpoint, and the results it belongs to (if any)."""

    checkpoint: Path  # local
    results: Path | None  # the local results directory holding metrics.csv, tensorboard/
    job_id: str | None  # the earlier job, when resuming a job
    label: str
    tune: bool = False  # `checkpoint` is a Tune experiment's folder (jobs.tune_resume)

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


def latest_experiment(results: Path) -> Path | None:
    """The Tune experiment in a results directory (ray_results/EXPERIMENT, the one whose
    state Tune saved last), or the directory itself when it is one."""
    if any(results.glob(TUNE_STATE)):
        return results if EXPERIMENT.match(results.name) else None
    found = [
        (max(state.stat().st_mtime for state in p.glob(TUNE_STATE)), p.name, p)
        for p in (results / TUNE_RESULTS).glob("*")
        if p.is_dir()
        and not p.is_symlink()
        and EXPERIMENT.match(p.name)
        and any(p.glob(TUNE_STATE))
    ]
    return max(found)[2] if found else None


def find_source(value: str, results_root: Path) -> Source:
    """JOB (its results under RESULTS/JOB, brought home first) or a local PATH: a job's
    results directory, one checkpoint directory, or a Tune experiment's folder. A job's
    own checkpoints (a playbook's) come first, then the Tune experiment it ran."""
    path = Path(value).expanduser()
    if path.is_dir():
        latest = latest_checkpoint(path)
        if latest is not None:
            return Source(latest, path, None, str(path))
        experiment = latest_experiment(path)
        if experiment is not None:
            return Source(experiment, path, None, str(path), tune=True)
        return Source(path, None, None, str(path))
    if not JOB_ID.match(value):
        raise InputError(
            f"--resume {value}: neither a directory nor a job id", "give a job id or a checkpoint"
        )
    home = results_root / value
    latest = latest_checkpoint(home)
    if latest is None and (experiment := latest_experiment(home)) is not None:
        return Source(experiment, home, value, value, tune=True)
    if latest is None:
        raise InputError(
            f"--resume {value}: no checkpoint of job {value} here or on the head",
            f"bring it home with `provisioner jobs results {value}`, or give a checkpoint path",
        )
    return Source(latest, home, value, value)


def head_copy_command(
    cluster: str,
    old: str,
    checkpoint: str,
    new: str,
    into: str = f"{RESUME_DIR}/checkpoint",
    seeds_from: tuple[str, ...] = SEEDS,
) -> str:
    """Seed NEW from OLD on the head itself (the checkpoint as NEW/INTO, then the
    `seeds_from` files); exit 3 when the head lacks the checkpoint."""
    root = layout.node_results_dir(cluster)
    src = shlex.quote(f"{old}/{checkpoint}")
    parent, _ = f"{new}/{into}".rsplit("/", 1)
    dest = shlex.quote(parent)
    seeds = " ".join(
        f"if [ -e {shlex.quote(f'{old}/{name}')} ]; then cp -rP {shlex.quote(f'{old}/{name}')} "
        f"{shlex.quote(f'{new}/')}; fi;"
        for name in seeds_from
    )
    return (
        f"cd -P {root} && [ -d {src} ] && [ ! -L {shlex.quote(old)} ] || exit 3; "
        f"mkdir -p {dest} && ( {enter_command(cluster, parent)} ) && "
        f"cp -rP {src} {shlex.quote(f'{new}/{into}')} && {seeds} true"
    )


STAGE = ".tmp-upload.XXXXXXXX"  # mktemp's template; `.tmp*` is left out of every pull
EXISTS_EXIT = 5  # the upload's destination is there already (a link planted by a job?)


def _checked(result: Result, remote_rel: str) -> None:
    """Raise what a staging or placing command ended with: a link or a destination there
    already is refused with its own message (something on the head planted it)."""
    if result.exit_code in (LINK_EXIT, EXISTS_EXIT):
        raise RemoteError(
            result.host,
            f"refused to write {remote_rel} on the head: it, or a folder on its way, is a "
            "link or was there already (a job on the cluster may have planted it)",
            "look at what the cluster's jobs wrote under its results on the head, then "
            "submit the resume again (a new job, a new folder)",
            kind="command",
        )
    result.check()


def stage_command(cluster: str, parent: str, name: str, subdirs: list[str]) -> str:
    """Shell: make the results root's PARENT, enter it without following a link (exit 4:
    a link on the way), refuse when NAME is there already (exit 5), then make a fresh
    private folder (`mktemp -d`: mode 0700, a name that was not there) with the folders
    `subdirs` under it, and print its name."""
    made = " ".join(shlex.quote(d) for d in subdirs)
    name_q = shlex.quote(name)
    return (
        f"mkdir -p {layout.node_results_dir(cluster, parent)} || exit 1; "
        f"{enter_command(cluster, parent)}; "
        f"[ ! -e {name_q} ] && [ ! -L {name_q} ] || exit {EXISTS_EXIT}; "
        f"stage=$(mktemp -d {STAGE}) || exit 1; "
        f'cd -P "$stage" && mkdir -p -- {made} && printf "%s\\n" "$stage"'
    )


def place_command(cluster: str, parent: str, stage: str, name: str) -> str:
    """Shell: move STAGE/NAME to NAME in the results root's PARENT with one rename that
    never follows a link (`mv -T`: NAME is the destination itself, not a folder to move
    into), entered as `stage_command` does; refused when NAME is there (exit 5)."""
    name_q, stage_q = shlex.quote(name), shlex.quote(stage)
    return (
        f"{enter_command(cluster, parent)}; "
        f"[ -d {stage_q} ] && [ ! -L {stage_q} ] || exit {LINK_EXIT}; "
        f"[ ! -e {name_q} ] && [ ! -L {name_q} ] || exit {EXISTS_EXIT}; "
        f"mv -T -- {shlex.quote(f'{stage}/{name}')} {name_q} && rmdir -- {stage_q}"
    )


def drop_stage_command(cluster: str, parent: str, stage: str) -> str:
    """Shell: remove a staging folder an upload left (entered as `stage_command` does)."""
    return f"{enter_command(cluster, parent)}; rm -rf -- {shlex.quote(stage)}"


def upload(session: Session, cluster: str, local: Path, remote_rel: str) -> int:
    """Send a local file or directory to the head as REMOTE_REL under the results root;
    files sent. Local links are never followed and secrets stay here (`sendable_files`).
    On the head it goes into a fresh private folder beside its destination (nothing a job
    planted there can redirect a write), then into place with one rename that does not
    follow a link; a destination that is there already (a link) is refused."""
    if local.is_symlink():
        return 0
    files = [local] if local.is_file() else sendable_files(local)[0]
    if not files:
        return 0
    parent, name = remote_rel.rsplit("/", 1)
    rels = (
        [name] if local.is_file() else [f"{name}/{p.relative_to(local).as_posix()}" for p in files]
    )
    subdirs = sorted(
        {r.rsplit("/", 1)[0] for r in rels if "/" in r} | ({name} if local.is_dir() else set())
    )
    made = session.run(stage_command(cluster, parent, name, subdirs or ["."]), timeout=60)
    _checked(made, remote_rel)
    stage = made.stdout.strip()
    if not stage.startswith(".tmp-upload.") or "/" in stage:
        raise OperationError(
            f"the head made no staging folder for {remote_rel}: {stage!r}",
            "check the head's disk space and its results folder (`provisioner doctor -i "
            "INVENTORY`), then resume again",
        )
    placed = False
    try:
        for path, rel in zip(files, rels, strict=True):
            session.sftp_put(path, layout.node_results_rel(cluster, parent, stage, rel))
        _checked(session.run(place_command(cluster, parent, stage, name), timeout=60), remote_rel)
        placed = True
    finally:
        if not placed:
            with suppress(ProvisionerError):
                session.run(drop_stage_command(cluster, parent, stage), timeout=60)
    return len(files)


def seed(link: Link, source: Source, new_job: str) -> str:
    """Put the checkpoint and the earlier metrics into NEW's results on the head; say how."""
    assert link.inventory is not None
    cluster = link.inventory.cluster
    session = link.head()
    into = f"{TUNE_RESUME_DIR}/{source.checkpoint.name}" if source.tune else None
    if source.job_id is not None and source.on_head is not None:
        command = (
            head_copy_command(cluster, source.job_id, source.on_head, new_job, into, ())
            if into
            else head_copy_command(cluster, source.job_id, source.on_head, new_job)
        )
        copied = session.run(command, timeout=300)
        if copied.ok:
            return f"the head's own copy of {source.job_id}/{source.on_head}"
        if copied.exit_code != 3:
            copied.check()
    if into:
        sent = upload(session, cluster, source.checkpoint, f"{new_job}/{into}")
        return f"{source.checkpoint} sent from this machine ({sent} files)"
    sent = upload(session, cluster, source.checkpoint, f"{new_job}/{RESUME_DIR}/checkpoint")
    if source.results is not None:
        for name in SEEDS:
            local = source.results / name
            if local.exists():
                sent += upload(session, cluster, local, f"{new_job}/{name}")
    return f"{source.checkpoint} sent from this machine ({sent} files)"
