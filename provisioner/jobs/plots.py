"""The plots of a job's results, drawn on the client with matplotlib (never in the image).

Uses matplotlib's object API (`Figure`), not pyplot: no global state, no display needed.
matplotlib is imported inside the functions that draw: the CLI imports this module and
must start fast (matplotlib costs about 0.4 s to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.jobs.tables import column, read_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure

TRAINING_PNG = "training.png"
SCALING_PNG = "scaling.png"


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def training_plot(metrics_csv: Path, out: Path) -> Path:
    """Mean episode return against env steps."""
    rows = read_rows(metrics_csv)
    fig = _figure(7, 4)
    ax = fig.subplots()
    ax.plot(column(rows, "env_steps"), column(rows, "episode_return_mean"), marker="o")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(f"training: {metrics_csv.parent.name}")
    ax.grid(alpha=0.3)
    fig.savefig(out, dpi=100)
    return out


def scaling_plot(scaling_csv: Path, out: Path) -> Path:
    """Env steps per second and time to target against the number of env runners."""
    rows = read_rows(scaling_csv)
    runners = column(rows, "env_runners")
    fig = _figure(9, 4)
    left, right = fig.subplots(1, 2)
    left.plot(runners, column(rows, "env_steps_per_s"), marker="o")
    left.set_xlabel("env runners")
    left.set_ylabel("env steps / s")
    left.set_title("throughput")
    right.plot(runners, column(rows, "time_to_target_s"), marker="o", color="tab:orange")
    right.set_xlabel("env runners")
    right.set_ylabel("seconds")
    right.set_title("time to target return")
    for ax in (left, right):
        ax.set_xticks(runners)
        ax.grid(alpha=0.3)
    fig.savefig(out, dpi=100)
    return out


def plot_results(job_dir: Path, out: Path | None = None) -> list[Path]:
    """Every plot the files in `job_dir` allow: training.png, scaling.png, drawn into
    `out` (default: `job_dir`)."""
    into = job_dir if out is None else out
    made: list[Path] = []
    if (job_dir / "metrics.csv").is_file():
        made.append(training_plot(job_dir / "metrics.csv", into / TRAINING_PNG))
    if (job_dir / "scaling.csv").is_file():
        made.append(scaling_plot(job_dir / "scaling.csv", into / SCALING_PNG))
    return made
