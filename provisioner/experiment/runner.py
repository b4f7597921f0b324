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
from typing import Any

MARK = "provisioner:"


def build(spec: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    """The algorithm's name, its config (defaults + the file's keys, a grid over the
    seeds) and Tune's RunConfig arguments."""
    from ray import tune
    from ray.tune.registry import get_trainable_cls

    run = str(spec["run"])
    config = get_trainable_cls(run).get_default_config()  # type: ignore[no-untyped-call]
    config = config.update_from_dict(dict(spec["config"]))
    seeds = [int(s) for s in spec["seeds"]]
    config = config.debugging(seed=tune.grid_search(seeds) if len(seeds) > 1 else seeds[0])
    return run, config, {"name": str(spec["name"]), "stop": dict(spec["stop"])}


def main(argv: list[str]) -> int:
    from ray import tune

    spec = json.loads(argv[1])
    run, config, run_args = build(spec)
    checkpoints = tune.CheckpointConfig(
        checkpoint_frequency=int(spec.get("checkpoint_frequency") or 0),
        checkpoint_at_end=True,
    )
    print(
        f"{MARK} experiment {run_args['name']} ({argv[0]}): {run} on {config.env}, "
        f"seeds {spec['seeds']}, stop {run_args['stop']}",
        flush=True,
    )
    tuner = tune.Tuner(
        run,
        param_space=config,
        run_config=tune.RunConfig(checkpoint_config=checkpoints, **run_args),
    )
    grid = tuner.fit()
    results = [grid[i] for i in range(len(grid))]
    failed = [r for r in results if r.error is not None]
    for result in failed:
        print(f"{MARK} trial failed: {result.error}", file=sys.stderr, flush=True)
    print(f"{MARK} {len(results) - len(failed)} of {len(results)} trial(s) ended well", flush=True)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
