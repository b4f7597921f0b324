"""Runs compared (`provisioner compare RUN...`): the learning curves of runs home in
RESULTS/, seeds of one config drawn as their mean and a confidence band, and a table.

A run is a job's folder (results/JOB/) or any folder holding training results. Its curves
are read from what the run itself wrote, never from a format of ours:
- every Tune trial under it (a folder with Tune's `result.json`: one JSON result per
  iteration, the trial's `config` in each): an experiment file's seeds and sweeps, an
  unchanged Tune or RLlib script, a Tune grid;
- a playbook's `metrics.csv` (with the algorithm config `config.json` beside it).

Curves whose configs are the same but for the seed are one group: the band is the
Student-t 95% interval of the mean over its seeds, on a common grid of env steps (or of
wall time) where every seed has data. The table: final return (mean and the interval's
half-width), time to target, env steps per second and node-hours.

Pure, but for the reading of files; the plot is `plots.compare_plot`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import InputError

# Student's t, two-sided 95%, by degrees of freedom (1..30); beyond: the normal's 1.96
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip

# where RLlib (new stack first, then the old) and Tune put the figures of one result
RETURN_KEYS = (
    ("env_runners", "episode_return_mean"),
    ("episode_return_mean",),
    ("env_runners", "episode_reward_mean"),
    ("episode_reward_mean",),
)
STEP_KEYS = (
    ("num_env_steps_sampled_lifetime",),
    ("env_runners", "num_env_steps_sampled_lifetime"),
    ("timesteps_total",),
)
# config keys that differ between the seeds of one experiment without making it another
NOT_THE_CONFIG = frozenset({"seed", "__trial_index__"})
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # a function's repr: not part of a config
GRID = 50  # points of the common grid the seeds are averaged on


def t95(n: int) -> float:
    """The two-sided 95% Student-t quantile for the mean of `n` values (n >= 2)."""
    return _T95[n - 2] if n - 1 <= len(_T95) else 1.96


@dataclass(frozen=True)
class Curve:
    """One training curve: a Tune trial, or a playbook's run."""

    run: str  # the RUN it came from, as given
    name: str  # the trial's folder name, or the run's
    config: dict[str, Any]  # the algorithm config without the seed ({} unknown)
    seed: int | None
    env_steps: tuple[float, ...]
    wall_s: tuple[float, ...]
    returns: tuple[float, ...]
    started: float | None = None  # unix time of its first iteration's start (Tune's)
    ended: float | None = None  # unix time of its last result

    @property
    def final_return(self) -> float:
        return self.returns[-1]

    def steps_per_s(self) -> float | None:
        return self.env_steps[-1] / self.wall_s[-1] if self.wall_s[-1] > 0 else None

    def time_to(self, target: float) -> float | None:
        """The wall time of the first result at or above `target` (None: never)."""
        return next(
            (w for w, r in zip(self.wall_s, self.returns, strict=True) if r >= target), None
        )


@dataclass
class Run:
    """A RUN argument: its folder, its curves, the target its file names and its cost."""

    label: str
    path: Path
    curves: list[Curve]
    target: float | None = None
    nodes: int | None = None
    node_hours: float | None = None


@dataclass(frozen=True)
class Band:
    """The mean over seeds and its 95% interval on a common grid (x: env steps or s)."""

    x: tuple[float, ...]
    mean: tuple[float, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]


@dataclass(frozen=True)
class Stat:
    """A figure over seeds: mean, the interval's half-width (None: one seed), count."""

    mean: float
    half_width: float | None
    n: int

    def text(self, digits: int = 1) -> str:
        pm = "" if self.half_width is None else f" ± {self.half_width:.{digits}f}"
        return f"{self.mean:.{digits}f}{pm}"

    def to_json(self) -> dict[str, Any]:
        return {"mean": self.mean, "ci95_half_width": self.half_width, "n": self.n}


def stat(values: Sequence[float]) -> Stat | None:
    """Mean and 95% interval of `values` (None when there are none)."""
    if not values:
        return None
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Stat(mean, None, n)
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return Stat(mean, t95(n) * math.sqrt(var / n), n)


@dataclass
class Group:
    """Curves that share a config (seeds of one experiment), and their figures."""

    label: str
    curves: list[Curve]
    runs: list[Run]
    target: float | None = None
    by_steps: Band | None = None
    by_time: Band | None = None
    final_return: Stat | None = None
    time_to_target: Stat | None = None
    reached: int = 0
    steps_per_s: Stat | None = None
    node_hours: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "runs": [r.label for r in self.runs],
            "trials": [c.name for c in self.curves],
            "seeds": [c.seed for c in self.curves],
            "final_return": self.final_return.to_json() if self.final_return else None,
            "target": self.target,
            "time_to_target_s": self.time_to_target.to_json() if self.time_to_target else None,
            "reached_target": self.reached,
            "env_steps_per_s": self.steps_per_s.to_json() if self.steps_per_s else None,
            "node_hours": self.node_hours,
        }


@dataclass
class Comparison:
    runs: list[Run]
    groups: list[Group] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": [
                {"run": r.label, "path": str(r.path), "curves": len(r.curves), "nodes": r.nodes}
                for r in self.runs
            ],
            "groups": [g.to_json() for g in self.groups],
        }


# --- reading -----------------------------------------------------------------------------


def _dig(result: dict[str, Any], keys: Sequence[tuple[str, ...]]) -> float | None:
    for path in keys:
        value: Any = result
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def _config_of(config: Any) -> tuple[dict[str, Any], int | None]:
    if not isinstance(config, dict):
        return {}, None
    seed = config.get("seed")
    kept = {k: v for k, v in config.items() if k not in NOT_THE_CONFIG}
    return kept, seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def curve_from_results(lines: Iterable[str], run: str, name: str) -> Curve | None:
    """A Tune trial's curve from its result.json lines (None: no iteration with a return;
    a line cut short by a trial still writing is passed over)."""
    steps: list[float] = []
    wall: list[float] = []
    returns: list[float] = []
    config: dict[str, Any] = {}
    seed: int | None = None
    started = ended = None
    for line in lines:
        try:
            result = json.loads(line)
        except ValueError:
            continue
        if not isinstance(result, dict):
            continue
        if not config and "config" in result:
            config, seed = _config_of(result["config"])
        ret, step = _dig(result, RETURN_KEYS), _dig(result, STEP_KEYS)
        total = _dig(result, (("time_total_s",),))
        stamp = _dig(result, (("timestamp",),))
        if stamp is not None:
            ended = stamp
            if started is None and total is not None:
                started = stamp - total
        if ret is None or step is None or total is None:
            continue
        steps.append(step)
        wall.append(total)
        returns.append(ret)
    if not returns:
        return None
    return Curve(run, name, config, seed, tuple(steps), tuple(wall), tuple(returns), started, ended)


def curve_from_metrics(metrics_csv: Path, run: str) -> Curve | None:
    """A playbook's curve from its metrics.csv (config.json beside it: its config)."""
    from provisioner.jobs.tables import read_rows

    rows = read_rows(metrics_csv)
    points = []
    for row in rows:
        try:
            points.append(
                (float(row["env_steps"]), float(row["time_s"]), float(row["episode_return_mean"]))
            )
        except (KeyError, TypeError, ValueError):
            continue
    points = [p for p in points if all(math.isfinite(v) for v in p)]
    if not points:
        return None
    config: dict[str, Any] = {}
    seed = None
    beside = metrics_csv.parent / "config.json"
    if beside.is_file():
        try:
            config, seed = _config_of(json.loads(beside.read_text()))
        except (ValueError, OSError):
            config, seed = {}, None
    steps, wall, returns = zip(*points, strict=True)
    return Curve(run, metrics_csv.parent.name, config, seed, steps, wall, returns)


def _trial_folders(root: Path) -> list[Path]:
    """Every folder under `root` with Tune's result.json (not inside a checkpoint)."""
    found = []
    for result in sorted(root.rglob("result.json")):
        parts = result.relative_to(root).parts
        if any(p.startswith("checkpoint_") for p in parts[:-1]):
            continue
        found.append(result.parent)
    return found


def _stop_return(data: Any) -> float | None:
    """The return an experiment file's `stop` names (its body or the file itself)."""
    if not isinstance(data, dict):
        return None
    bodies = [data, *(v for v in data.values() if isinstance(v, dict))]
    for body in bodies:
        stop = body.get("stop")
        if not isinstance(stop, dict):
            continue
        for key, value in stop.items():
            if ("return" in str(key) or "reward" in str(key)) and _number(value):
                return float(value)
    return None


def _argument(args: Any, flag: str) -> float | None:
    """The number after `flag` (or in `flag=N`) in a playbook's arguments."""
    if not isinstance(args, list):
        return None
    for i, arg in enumerate(args):
        text = str(arg)
        value = text.partition("=")[2] if text.startswith(f"{flag}=") else None
        if text == flag and i + 1 < len(args):
            value = str(args[i + 1])
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def _target_of(root: Path) -> float | None:
    """The return the run stops at: its experiment file's `stop`, or the playbook's
    `--target-return` as submitted (None: not said; `compare --target` says it)."""
    import yaml

    path = root / "experiment.yaml"
    if path.is_file():
        try:
            found = _stop_return(yaml.safe_load(path.read_text()))
        except (yaml.YAMLError, OSError, ValueError):
            found = None
        if found is not None:
            return found
    return _argument(_field(root / "submitted.json", "args"), "--target-return")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _field(path: Path, key: str) -> Any:
    """`key` of the JSON object in `path` (None: no file, not JSON, not an object)."""
    try:
        found = json.loads(path.read_text()) if path.is_file() else None
    except (ValueError, OSError):
        return None
    return found.get(key) if isinstance(found, dict) else None


def _submitted_nodes(root: Path) -> int | None:
    nodes = _field(root / "submitted.json", "nodes")
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 0 else None


def _summary_node_hours(root: Path) -> float | None:
    cost = _field(root / "summary.json", "cost")
    hours = cost.get("hours") if isinstance(cost, dict) else None
    return float(hours) if isinstance(hours, int | float) and not isinstance(hours, bool) else None


def return_of(result: dict[str, Any]) -> float | None:
    """The mean episode return in one Tune result (RLlib's new stack, then the old)."""
    return _dig(result, RETURN_KEYS)


def result_lines(path: Path) -> list[dict[str, Any]]:
    """Tune's result.json as its results (a line cut short by a trial still writing, or
    one that is no object, passed over); [] when there is none."""
    found = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                found.append(row)
    return found


def read_run(label: str, root: Path) -> Run:
    """The curves of one run (its Tune trials, or its playbook's metrics.csv)."""
    curves: list[Curve] = []
    for folder in _trial_folders(root):
        with (folder / "result.json").open(errors="replace") as lines:
            curve = curve_from_results(lines, label, folder.name)
        if curve is not None:
            curves.append(curve)
    if not curves and (root / "metrics.csv").is_file():
        found = curve_from_metrics(root / "metrics.csv", label)
        curves = [found] if found else []
    run = Run(label, root, curves, _target_of(root), _submitted_nodes(root))
    run.node_hours = _summary_node_hours(root)
    if run.node_hours is None and run.nodes is not None:
        starts = [c.started for c in curves if c.started is not None]
        ends = [c.ended for c in curves if c.ended is not None]
        if starts and ends:
            run.node_hours = run.nodes * max(0.0, max(ends) - min(starts)) / 3600
    return run


def find_run(arg: str, results: Path) -> Path:
    """RUN as a job id under `results`, or a folder; bad input: an InputError."""
    for candidate in (results / arg, Path(arg)):
        if candidate.is_dir():
            return candidate
    have = sorted(p.name for p in results.iterdir() if p.is_dir()) if results.is_dir() else []
    hint = f" (runs in {results}: {', '.join(have[:12])})" if have else ""
    raise InputError(
        f"no run {arg!r}: neither {results / arg} nor {arg} is a folder{hint}",
        "name a job id home under --results DIR (`provisioner jobs results JOB` brings one "
        "home) or the folder of a run",
        where=arg,
    )


# --- grouping and figures ------------------------------------------------------------------


def config_key(config: dict[str, Any]) -> str:
    """The config as canonical text (function addresses left out): equal for seeds."""
    return _ADDRESS.sub("", json.dumps(config, sort_keys=True, default=str))


def _differing(configs: Sequence[dict[str, Any]]) -> list[str]:
    keys = sorted({k for c in configs for k in c})
    return [
        k
        for k in keys
        if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1
    ]


def _label(curves: Sequence[Curve], differing: Sequence[str], runs: Sequence[str]) -> str:
    config = curves[0].config
    shown = [f"{k}={json.dumps(config.get(k), default=str)}" for k in differing[:3]]
    head = "+".join(dict.fromkeys(runs))
    return f"{head} {' '.join(shown)}".strip() if shown else head


def interpolate(xs: Sequence[float], ys: Sequence[float], at: float) -> float:
    """`ys` at `at`, linear between the points of increasing `xs` (clamped at the ends)."""
    if at <= xs[0]:
        return ys[0]
    for i in range(1, len(xs)):
        if at <= xs[i]:
            span = xs[i] - xs[i - 1]
            frac = 0.0 if span <= 0 else (at - xs[i - 1]) / span
            return ys[i - 1] + frac * (ys[i] - ys[i - 1])
    return ys[-1]


def band(curves: Sequence[Curve], axis: str) -> Band | None:
    """Mean and 95% band over `curves` on a grid of `axis` ("env_steps" | "wall_s") where
    every curve has data (from the latest first point to the earliest last one)."""
    series = [(getattr(c, axis), c.returns) for c in curves]
    if not series:
        return None
    lo = max(xs[0] for xs, _ in series)
    hi = min(xs[-1] for xs, _ in series)
    if hi < lo:
        return None
    points = 1 if hi == lo else GRID
    grid = [lo + (hi - lo) * i / max(1, points - 1) for i in range(points)]
    mean, low, high = [], [], []
    for x in grid:
        found = stat([interpolate(xs, ys, x) for xs, ys in series])
        assert found is not None
        width = found.half_width or 0.0
        mean.append(found.mean)
        low.append(found.mean - width)
        high.append(found.mean + width)
    return Band(tuple(grid), tuple(mean), tuple(low), tuple(high))


def compare(runs: list[Run], target: float | None = None) -> Comparison:
    """The groups of `runs`' curves (same config but for the seed) and their figures;
    `target` (else each run's own) for the time to target."""
    keyed: dict[str, list[Curve]] = {}
    for run in runs:
        for curve in run.curves:
            # a curve without a config is its own run's alone
            key = config_key(curve.config) if curve.config else f"run:{run.label}/{curve.name}"
            keyed.setdefault(key, []).append(curve)
    differing = _differing([curves[0].config for curves in keyed.values()])
    found = Comparison(runs)
    for curves in keyed.values():
        names = [c.run for c in curves]
        members = [r for r in runs if r.label in names]
        own = {r.target for r in members if r.target is not None}
        goal = target if target is not None else (own.pop() if len(own) == 1 else None)
        group = Group(_label(curves, differing, names), curves, members, goal)
        group.by_steps = band(curves, "env_steps")
        group.by_time = band(curves, "wall_s")
        group.final_return = stat([c.final_return for c in curves])
        if goal is not None:
            times = [t for c in curves if (t := c.time_to(goal)) is not None]
            group.reached = len(times)
            group.time_to_target = stat(times)
        group.steps_per_s = stat([s for c in curves if (s := c.steps_per_s()) is not None])
        hours = [r.node_hours for r in members if r.node_hours is not None]
        group.node_hours = sum(hours) if hours and len(hours) == len(members) else None
        found.groups.append(group)
    return found


def compare_runs(args: Sequence[str], results: Path, target: float | None = None) -> Comparison:
    """`provisioner compare`: RUN arguments read from `results` (or as folders), compared.
    Bad input (no run, a run without training results): an InputError."""
    if not args:
        raise InputError("no run to compare", "name one or more job ids (or folders of runs)")
    runs = [read_run(arg, find_run(arg, results)) for arg in dict.fromkeys(args)]
    empty = [r for r in runs if not r.curves]
    if empty:
        raise InputError(
            "no training results in "
            + ", ".join(str(r.path) for r in empty)
            + " (no Tune result.json with a return, no playbook metrics.csv)",
            "bring the job's results home first (`provisioner jobs results JOB`), or name "
            "the run's own folder",
            where=empty[0].label,
        )
    return compare(runs, target)
