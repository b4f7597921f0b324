"""Sweeps in an experiment file (pure): Tune's search spaces written in `config`, and the
file's scheduler, as the file says them and as they are judged.

    config:
        lr: {grid_search: [0.0001, 0.001]}          # every value (Tune's grid_search)
        train_batch_size_per_learner: {choice: [500, 1000]}
        gamma: {uniform: [0.95, 0.999]}             # sampled (num_samples of them)
        entropy_coeff: {loguniform: [1.0e-4, 1.0e-2]}
        num_epochs: {randint: [2, 8]}               # low <= n < high
    num_samples: 4                                  # samples of the random spaces
    scheduler: {type: asha, max_t: 50, grace_period: 5, reduction_factor: 2}
    metric: env_runners/episode_return_mean         # what "best" means (default)
    mode: max

The runner (`experiment/runner.py`, with the cluster's Ray) turns them into Tune's own
objects; this module only reads and judges them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# a search space: a mapping of one of these to its argument
SPACES = ("grid_search", "choice", "uniform", "loguniform", "randint")
RANDOM = frozenset({"choice", "uniform", "loguniform", "randint"})
DEFAULT_METRIC = "env_runners/episode_return_mean"
MODES = ("max", "min")
# the schedulers a file may name, and the keys each takes (Tune's own arguments)
SCHEDULERS: Mapping[str, tuple[str, ...]] = {
    "asha": ("max_t", "grace_period", "reduction_factor", "time_attr"),
    "pbt": (
        "perturbation_interval",
        "hyperparam_mutations",
        "quantile_fraction",
        "resample_probability",
        "time_attr",
    ),
}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def space_of(value: Any) -> tuple[str, Any] | None:
    """(kind, argument) when `value` is a search space (`{grid_search: [...]}`, ...)."""
    if isinstance(value, dict) and len(value) == 1:
        ((kind, arg),) = value.items()
        if kind in SPACES:
            return str(kind), arg
    return None


def looks_like_a_space(value: Any) -> str | None:
    """A one-key mapping whose key is close to a space's name (a typo: `grid_serch`)."""
    import difflib

    if isinstance(value, dict) and len(value) == 1:
        (kind,) = value
        found = difflib.get_close_matches(str(kind), SPACES, n=1, cutoff=0.75)
        if found and kind not in SPACES:
            return found[0]
    return None


def space_problem(kind: str, arg: Any) -> str | None:
    """What is wrong with a space's argument (None: nothing)."""
    if kind in ("grid_search", "choice"):
        if not isinstance(arg, list) or not arg:
            return f"{kind} takes a non-empty list of values, not {arg!r}"
        return None
    if not (isinstance(arg, list) and len(arg) == 2 and all(_number(v) for v in arg)):
        return f"{kind} takes [low, high], two numbers, not {arg!r}"
    low, high = arg
    if not low < high:
        return f"{kind} [{low}, {high}]: low must be below high"
    if kind == "loguniform" and low <= 0:
        return f"loguniform [{low}, {high}]: both ends must be above 0"
    if kind == "randint" and not all(isinstance(v, int) for v in arg):
        return f"randint [{low}, {high}]: whole numbers (low <= n < high)"
    return None


def examples(kind: str, arg: Any) -> list[Any]:
    """Values the space can give, to judge against the key's type."""
    if kind in ("grid_search", "choice"):
        return list(arg)
    if kind == "randint":
        return [arg[0], arg[1] - 1]
    return [float(arg[0]), float(arg[1])]


def spaces(config: Any) -> dict[str, tuple[str, Any]]:
    """The config's keys that hold a search space, and the space."""
    if not isinstance(config, dict):
        return {}
    return {k: s for k, v in config.items() if (s := space_of(v)) is not None}


def trial_count(config: Any, seeds: int, num_samples: int) -> int:
    """How many trials the file makes: Tune repeats the grid (every grid value times every
    seed) `num_samples` times, each repeat drawing the random spaces afresh."""
    grid = 1
    for kind, arg in spaces(config).values():
        if kind == "grid_search":
            grid *= len(arg)
    return grid * max(1, seeds) * max(1, num_samples)
