"""Runs with the CLUSTER's Python, as a job's driver; not imported locally.

`provisioner submit -i INV EXPERIMENT.yaml` puts this file into the job's working_dir
(the experiment file's folder, as it reached the head) as `RUNNER_NAME` and runs

    python3 -u _provisioner_experiment.py EXPERIMENT.yaml '{"run": ..., ...}'

The JSON is what `provisioner.jobs.experiment.runner_args` built from the validated file:
the algorithm, the keys the file sets (`config`, `env`, `resources`), `stop`, the seeds,
the checkpoint frequency and the experiment's name. It runs the experiment as RLlib's tuned
examples are run: through Tune, the algorithm's default config with the file's keys
(`update_from_dict`), one trial per seed (Tune's grid over `seed`), checkpoints every
`checkpoint_frequency` iterations and at the end. So Tune's storage (the job's
`RAY_STORAGE`: the head's store every node shares) holds the run, its progress is read by
the job's Tune watcher, its folder comes home under results/JOB/ray_results/, and
`submit --resume JOB` restores it (`jobs.tune_resume`), as for an unchanged Tune script.

Exit 1 when a trial failed (its error printed); Ray and the standard library only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MARK = "provisioner:"


SPACES = ("grid_search", "choice", "uniform", "loguniform", "randint")
DEFAULT_METRIC = "env_runners/episode_return_mean"


def to_tune(value: Any) -> Any:
    """A search space as the file writes it (`{grid_search: [...]}`, `{uniform: [a, b]}`,
    ...) as Tune's own object; any other value as it is."""
    from ray import tune

    if isinstance(value, dict) and len(value) == 1:
        ((kind, arg),) = value.items()
        if kind == "grid_search":
            return tune.grid_search(list(arg))
        if kind == "choice":
            return tune.choice(list(arg))
        if kind in ("uniform", "loguniform", "randint"):
            return getattr(tune, kind)(arg[0], arg[1])
    return value


def scheduler_of(spec: dict[str, Any]) -> Any:
    """Tune's scheduler the file names (None: FIFO, Tune's default)."""
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    sched = dict(spec.get("scheduler") or {})
    if not sched:
        return None
    kind = str(sched.pop("type")).lower()
    sched.setdefault("time_attr", "training_iteration")
    if kind == "asha":
        return ASHAScheduler(**sched)
    mutations = {k: to_tune(v) for k, v in dict(sched.pop("hyperparam_mutations")).items()}
    return PopulationBasedTraining(hyperparam_mutations=mutations, **sched)


def with_keys(config: Any, keys: dict[str, Any]) -> Any:
    """RLlib's `config` with the file's flat keys: `update_from_dict`, and `model_config`
    (a read-only property on the config) through `rl_module(model_config=...)`."""
    keys = dict(keys)
    model = keys.pop("model_config", None)
    config = config.update_from_dict(keys)
    if model is not None:
        config = config.rl_module(model_config=dict(model))
    return config


def build(spec: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """The algorithm's name, its config (defaults + the file's keys, its search spaces as
    Tune's, a grid over the seeds) and Tune's RunConfig arguments."""
    from ray import tune
    from ray.tune.registry import get_trainable_cls

    run = str(spec["run"])
    config = get_trainable_cls(run).get_default_config()  # type: ignore[no-untyped-call]
    config = with_keys(config, {k: to_tune(v) for k, v in dict(spec["config"]).items()})
    seeds = [int(s) for s in spec["seeds"]]
    config = config.debugging(seed=tune.grid_search(seeds) if len(seeds) > 1 else seeds[0])
    run_args: dict[str, Any] = {"name": str(spec["name"]), "stop": dict(spec["stop"])}
    if spec.get("max_failures"):  # `submit --retries N`: a trial cut off by a lost node
        # goes on from its latest checkpoint on the nodes that remain, within this run
        run_args["failure_config"] = tune.FailureConfig(max_failures=int(spec["max_failures"]))
    return run, config, run_args


def tune_config(spec: dict[str, Any]) -> Any:
    """Tune's TuneConfig: samples, the bound on trials at once, the scheduler and what it
    (and "best") is judged by."""
    from ray import tune

    scheduler = scheduler_of(spec)
    return tune.TuneConfig(
        num_samples=int(spec.get("num_samples") or 1),
        max_concurrent_trials=int(spec["max_concurrent"]) if spec.get("max_concurrent") else None,
        scheduler=scheduler,
        metric=metric_of(spec) if scheduler is not None else None,
        mode=mode_of(spec) if scheduler is not None else None,
    )


def metric_of(spec: dict[str, Any]) -> str:
    return str(spec.get("metric") or DEFAULT_METRIC)


def mode_of(spec: dict[str, Any]) -> str:
    return str(spec.get("mode") or "max")


def _dig(result: dict[str, Any], metric: str) -> Any:
    value: Any = result
    for part in metric.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def summary(grid: Any, spec: dict[str, Any], swept: list[str]) -> dict[str, Any]:
    """Every trial's outcome and the best one by the file's metric: sweep.json's body."""
    import math

    metric, mode = metric_of(spec), mode_of(spec)
    better = max if mode == "max" else min
    max_t = int((spec.get("scheduler") or {}).get("max_t") or 0)
    trials: list[dict[str, Any]] = []
    for i in range(len(grid)):
        result = grid[i]
        last = result.metrics or {}
        config = result.config or {}
        history: list[float] = []
        frame = result.metrics_dataframe
        if frame is not None and metric in frame:
            history = [
                float(v) for v in frame[metric] if isinstance(v, float) and not math.isnan(v)
            ]
        final = _dig(last, metric)
        trials.append(
            {
                "trial": Path(result.path).name if result.path else last.get("trial_id"),
                "status": "ERROR" if result.error is not None else "TERMINATED",
                "error": str(result.error) if result.error is not None else None,
                "iterations": last.get("training_iteration"),
                # a settable property is stored under its private name (RLlib's to_dict)
                "params": {k: config.get(k, config.get(f"_{k}")) for k in swept},
                "seed": config.get("seed"),
                "final": final if isinstance(final, int | float) else None,
                "best": better(history) if history else None,
                "node": last.get("node_ip"),
                "time_s": last.get("time_total_s"),
                "restored": bool(
                    last.get("iterations_since_restore", 0)
                    and last.get("iterations_since_restore") != last.get("training_iteration")
                ),
            }
        )
    done = [t for t in trials if t["final"] is not None]
    best = better(done, key=lambda t: t["final"]) if done else None
    most = max((t["iterations"] or 0 for t in trials), default=0)
    for t in trials:
        t["best_trial"] = best is not None and t["trial"] == best["trial"]
        # a trial a scheduler ended before the others' length (ASHA's early stop)
        t["stopped_early"] = bool(
            spec.get("scheduler") and t["status"] == "TERMINATED"
            and (t["iterations"] or 0) < (max_t or most)
            and not _reached(t, spec)
        )  # fmt: skip
    return {"metric": metric, "mode": mode, "swept": swept, "trials": trials,
            "best": best["trial"] if best else None}  # fmt: skip


def _reached(trial: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether the trial met one of the file's stop conditions on its own."""
    stop = spec.get("stop") or {}
    if (trial["iterations"] or 0) >= stop.get("training_iteration", float("inf")):
        return True
    target, final = stop.get(metric_of(spec)), trial["final"]
    if target is None or final is None:
        return False
    return bool(final >= target if mode_of(spec) == "max" else final <= target)


def write_summary(body: dict[str, Any]) -> None:
    """sweep.json and trials.csv into the job's results (home with it), and the table."""
    import csv
    import os

    results = Path(os.environ.get("PROVISIONER_RESULTS_DIR", "results"))
    results.mkdir(parents=True, exist_ok=True)
    (results / "sweep.json").write_text(json.dumps(body, indent=1, default=str) + "\n")
    columns = ["trial", *body["swept"], "seed", "status", "iterations", "final", "best",
               "stopped_early", "restored", "best_trial", "node"]  # fmt: skip
    with (results / "trials.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for t in body["trials"]:
            row = {**t, **t["params"]}
            writer.writerow([row.get(c) for c in columns])
    print(f"{MARK} {len(body['trials'])} trial(s), best by {body['metric']} ({body['mode']}): "
          f"{body['best']}", flush=True)  # fmt: skip
    for t in body["trials"]:
        mark = "*" if t["best_trial"] else " "
        params = " ".join(f"{k}={v}" for k, v in t["params"].items())
        early = " stopped early" if t["stopped_early"] else ""
        print(f"{MARK} {mark} {t['trial']} {params} seed={t['seed']} {t['status']} "
              f"iterations={t['iterations']} final={t['final']}{early}", flush=True)  # fmt: skip


def main(argv: list[str]) -> int:
    from ray import tune

    spec = json.loads(argv[1])
    run, config, run_args = build(spec)
    checkpoints = tune.CheckpointConfig(
        checkpoint_frequency=int(spec.get("checkpoint_frequency") or 0),
        checkpoint_at_end=True,
    )
    swept = sorted(k for k, v in dict(spec["config"]).items() if to_tune(v) is not v)
    print(
        f"{MARK} experiment {run_args['name']} ({argv[0]}): {run} on {config.env}, "
        f"seeds {spec['seeds']}, stop {run_args['stop']}"
        + (f", a trial retried {spec['max_failures']} time(s)" if spec.get("max_failures") else "")
        + (f", sweeping {', '.join(swept)}" if swept else ""),
        flush=True,
    )
    tuner = tune.Tuner(
        run,
        param_space=config,
        tune_config=tune_config(spec),
        run_config=tune.RunConfig(checkpoint_config=checkpoints, **run_args),
    )
    grid = tuner.fit()
    results = [grid[i] for i in range(len(grid))]
    failed = [r for r in results if r.error is not None]
    for result in failed:
        print(f"{MARK} trial failed: {result.error}", file=sys.stderr, flush=True)
    if len(results) > 1:
        write_summary(summary(grid, spec, swept))
    print(f"{MARK} {len(results) - len(failed)} of {len(results)} trial(s) ended well", flush=True)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
