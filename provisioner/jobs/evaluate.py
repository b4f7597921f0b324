"""`provisioner eval -i INV JOB|PATH`: a trained checkpoint evaluated on the cluster.

Here: the checkpoint is found (in results/JOB/ home, or under a PATH: an RLlib algorithm
checkpoint is a folder with `rllib_checkpoint.json` and `algorithm_state.pkl`, wherever
the run put it: Tune's `checkpoint_NNNNNN`, a playbook's `checkpoints/iter-NNNNNN`, a
SageMaker job's files), with the training return at it (Tune's result for that
checkpoint, or the playbook's metrics.csv row of its iteration). Where a run holds several
trials (seeds, a sweep), the latest checkpoint of the trial whose last return is best.

Then a job like any other, through the place it runs (`jobs.place.evaluate`): its
working_dir a folder of the checkpoint and the runner (`experiment/eval_runner.py`),
its results home under results/JOB/eval-*/ (eval.json, episodes.csv, videos/*.mp4).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from provisioner.errors import InputError
from provisioner.jobs.compare import result_lines, return_of
from provisioner.jobs.spec import JOB_ID, JobSpec, check_job_id, job_id_for

RUNNER_NAME = "_provisioner_eval.py"  # the runner, in the eval job's working_dir
CHECKPOINT_DIR = "checkpoint"  # the checkpoint's copy, beside it
MARKERS = ("rllib_checkpoint.json", "algorithm_state.pkl")
MAX_CHECKPOINT_BYTES = 400 << 20  # what a job's working_dir carries (Ray's limit: 500 MiB)
MAX_ITERATIONS = 5000  # the training returns handed to the runner (the last ones)


@dataclass(frozen=True)
class Found:
    """The checkpoint to evaluate, where its evaluation's results go, and what training
    said at it."""

    checkpoint: Path
    source: str  # JOB or PATH, as given
    home: Path  # RESULTS/NAME: the eval's results land in HOME/eval-*/
    label: str  # the checkpoint relative to the run's folder
    training_return: float | None
    trials: int = 1  # how many trials had a checkpoint
    by_iteration: dict[int, float] = field(default_factory=dict)


def is_checkpoint(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MARKERS)


def checkpoints_under(root: Path) -> list[Path]:
    """Every algorithm checkpoint under `root` (a checkpoint's own sub-folders are its
    components, never another checkpoint)."""
    if is_checkpoint(root):
        return [root]
    return sorted(p.parent for p in root.rglob(MARKERS[0]) if is_checkpoint(p.parent))


def _number(name: str) -> int:
    digits = re.findall(r"\d+", name)
    return int(digits[-1]) if digits else -1


def returns_by_iteration(checkpoint: Path) -> dict[int, float]:
    """The training return of each iteration of the run `checkpoint` belongs to: its
    trial's Tune results (result.json), or its playbook's metrics.csv (checkpoints/ beside
    it). The runner picks the iteration the restored algorithm says it was taken at."""
    found: dict[int, float] = {}
    rows = result_lines(checkpoint.parent / "result.json")
    for row in rows:
        iteration, value = row.get("training_iteration"), return_of(row)
        if isinstance(iteration, int) and value is not None:
            found[iteration] = value
    metrics = checkpoint.parent.parent / "metrics.csv"
    if not rows and metrics.is_file():
        from provisioner.jobs.tables import read_rows

        for line in read_rows(metrics):
            try:
                value, iteration = float(line["episode_return_mean"]), int(line["iteration"])
            except (KeyError, TypeError, ValueError):
                continue
            if value == value:
                found[iteration] = value
    return dict(sorted(found.items())[-MAX_ITERATIONS:])


def training_return_at(checkpoint: Path) -> float | None:
    """The training return when `checkpoint` was taken, as far as the files here say:
    Tune's result naming it (`checkpoint_dir_name`), or a playbook's `iter-NNNNNN` row;
    else the run's last (the runner corrects it with the restored iteration)."""
    rows = result_lines(checkpoint.parent / "result.json")
    named = [r for r in rows if r.get("checkpoint_dir_name") == checkpoint.name]
    for row in reversed(named):
        if (value := return_of(row)) is not None:
            return value
    by_iteration = returns_by_iteration(checkpoint)
    wanted = _number(checkpoint.name) if not rows else None
    if wanted is not None and wanted in by_iteration:
        return by_iteration[wanted]
    return by_iteration[max(by_iteration)] if by_iteration else None


def choose(candidates: list[Path]) -> tuple[Path, int]:
    """The latest checkpoint of the trial whose last return is best (a run of one trial:
    its latest); and how many trials had one."""
    by_trial: dict[Path, list[Path]] = {}
    for path in candidates:
        by_trial.setdefault(path.parent, []).append(path)
    latest = {t: max(ps, key=lambda p: (_number(p.name), p.name)) for t, ps in by_trial.items()}

    def score(trial: Path) -> float:
        rows = result_lines(trial / "result.json")
        values = [v for r in rows if (v := return_of(r)) is not None]
        return values[-1] if values else float("-inf")

    best = max(latest, key=lambda t: (score(t), str(t)))
    return latest[best], len(latest)


def find_checkpoint(source: str, results_root: Path) -> Found:
    """JOB (home under `results_root`) or PATH: its checkpoint to evaluate; an InputError
    when there is none."""
    job_home = results_root / source
    if JOB_ID.fullmatch(source) and job_home.is_dir():
        root, home = job_home, job_home
    elif Path(source).expanduser().is_dir():
        root = Path(source).expanduser()
        home = results_root / (root.resolve().name or "eval")
    else:
        raise InputError(
            f"no run or checkpoint {source!r}: neither {job_home} nor {source} is a folder",
            "name a job whose results are home (`provisioner jobs results JOB` brings them), "
            "or the folder of a checkpoint",
            where=source,
        )
    found = checkpoints_under(root)
    if not found:
        raise InputError(
            f"no RLlib checkpoint under {root} (a folder with {' and '.join(MARKERS)})",
            "train with checkpoints (an experiment file's checkpoint_frequency, Tune's "
            "CheckpointConfig, a playbook's checkpoints) and bring them home "
            "(`provisioner jobs results JOB`)",
            where=str(root),
        )
    checkpoint, trials = choose(found)
    size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
    if size > MAX_CHECKPOINT_BYTES:
        raise InputError(
            f"the checkpoint {checkpoint} holds {size >> 20} MiB: more than a job carries "
            f"({MAX_CHECKPOINT_BYTES >> 20} MiB)",
            "evaluate a smaller checkpoint, or load it in your own script on the cluster",
            where=str(checkpoint),
        )
    try:
        label = checkpoint.relative_to(root).as_posix() or "."
    except ValueError:
        label = str(checkpoint)
    return Found(
        checkpoint,
        source,
        home,
        label,
        training_return_at(checkpoint),
        trials,
        returns_by_iteration(checkpoint),
    )


def runner_source() -> bytes:
    return resources.files("provisioner.experiment").joinpath("eval_runner.py").read_bytes()


def runner_args(found: Found, episodes: int, video: int) -> tuple[str, ...]:
    """The runner's one JSON argument (pure)."""
    body = {
        "checkpoint": CHECKPOINT_DIR,
        "episodes": episodes,
        "video": video,
        "source": found.source,
        "source_checkpoint": found.label,
        "training_return": found.training_return,
        "returns_by_iteration": {str(k): v for k, v in found.by_iteration.items()},
    }
    return (json.dumps(body, sort_keys=True, separators=(",", ":")),)


def check_counts(episodes: int, video: int) -> None:
    if episodes < 1:
        raise InputError(
            f"--episodes {episodes}: at least one episode", "give --episodes 1 or more"
        )
    if video < 0:
        raise InputError(f"--video {video}: a count of videos", "give --video 0 or more")


def eval_spec(found: Found, episodes: int, video: int, workdir: Path) -> JobSpec:
    """The eval job: `workdir` (made here) holds the runner and the checkpoint's copy."""
    check_counts(episodes, video)
    shutil.copytree(found.checkpoint, workdir / CHECKPOINT_DIR, symlinks=False)
    runner = workdir / RUNNER_NAME
    runner.write_bytes(runner_source())
    job_id = check_job_id(job_id_for(Path("eval.py")))
    return JobSpec(playbook=runner, args=runner_args(found, episodes, video), job_id=job_id)


def read_eval(home: Path) -> dict[str, object] | None:
    """eval.json of an evaluation home (None: not there or unreadable)."""
    path = home / "eval.json"
    try:
        value = json.loads(path.read_text()) if path.is_file() else None
    except (ValueError, OSError):
        return None
    return value if isinstance(value, dict) else None
