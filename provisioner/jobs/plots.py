"""The plots of a job's results, drawn on the client with matplotlib (never in the image).

Uses matplotlib's object API (`Figure`), not pyplot: no global state, no display needed.
matplotlib is imported inside the functions that draw: the CLI imports this module and
must start fast (matplotlib costs about 0.4 s to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.jobs.tables import column, read_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from provisioner.jobs.compare import Band, Comparison

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


def compare_plot(comparison: Comparison, out: Path) -> Path:
    """Mean return against env steps and against wall time: one line and its 95% band
    per group (seeds of one config), each seed's own curve faint beneath."""
    fig = _figure(12, 4.5)
    by_steps, by_time = fig.subplots(1, 2, sharey=True)
    for i, group in enumerate(comparison.groups):
        colour = f"C{i % 10}"
        for ax, axis, band in (
            (by_steps, "env_steps", group.by_steps),
            (by_time, "wall_s", group.by_time),
        ):
            for curve in group.curves:
                ax.plot(getattr(curve, axis), curve.returns, color=colour, alpha=0.25, lw=0.8)
            _band(ax, band, colour, f"{group.label} (n={len(group.curves)})")
    by_steps.set_xlabel("env steps")
    by_time.set_xlabel("wall time (s)")
    by_steps.set_ylabel("mean episode return")
    for ax in (by_steps, by_time):
        ax.grid(alpha=0.3)
        targets = {g.target for g in comparison.groups if g.target is not None}
        for target in targets:
            ax.axhline(target, color="grey", ls="--", lw=0.8)
    by_steps.legend(fontsize="small", loc="best")
    fig.suptitle("runs compared: mean and 95% interval over seeds")
    fig.savefig(out, dpi=100)
    return out


def _band(ax: Any, band: Band | None, colour: str, label: str) -> None:
    if band is None:
        return
    ax.plot(band.x, band.mean, color=colour, lw=2, label=label)
    if any(lo != hi for lo, hi in zip(band.low, band.high, strict=True)):
        ax.fill_between(band.x, band.low, band.high, color=colour, alpha=0.2, lw=0)


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
