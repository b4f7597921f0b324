"""PPO on GridCells (the `gridcells` package, installed in the cluster image), RLlib's new
API stack, env runners spread over the cluster's nodes.

    python train.py --env-runners 2 --iterations 3          # on your laptop (pip install -e .)
    provisioner submit -i INVENTORY examples/gridcells/train.py -- --iterations 20

Writes into $PROVISIONER_RESULTS_DIR (brought home to results/JOB/ by `submit`), else
./results: metrics.json (one row per iteration), runners.json (the node each env runner
ran on), checkpoint/ (`Algorithm.from_checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from pathlib import Path
from typing import Any

import gridcells  # noqa: F401  (registers gridcells/GridCells-v0 here; the image has it on every node)
import ray
from ray.rllib.algorithms.ppo import PPOConfig

# `module:id`: gymnasium imports the package first, in every env runner's process.
ENV_ID = "gridcells:gridcells/GridCells-v0"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env-runners", type=int, default=2)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--horizon", type=int, default=40)
    args = p.parse_args()
    results = Path(os.environ.get("PROVISIONER_RESULTS_DIR", "results"))
    results.mkdir(parents=True, exist_ok=True)
    ray.init()  # joins the cluster where there is one, else starts Ray here
    config = (
        PPOConfig()
        .environment(ENV_ID, env_config={"horizon": args.horizon})
        .env_runners(num_env_runners=args.env_runners, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=400, minibatch_size=100, num_epochs=4, lr=1e-3)
    )
    algo = config.build_algo()
    rows: list[dict[str, Any]] = []
    for _ in range(args.iterations):
        result = algo.train()
        runners = result.get("env_runners", {})
        row = {
            "iteration": result["training_iteration"],
            "env_steps": runners.get("num_env_steps_sampled_lifetime", 0),
            "return_mean": runners.get("episode_return_mean"),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        (results / "metrics.json").write_text(json.dumps(rows, indent=1))

    def where(runner: Any) -> dict[str, Any]:
        import gridcells as here

        return {
            "runner": int(runner.worker_index),
            "node_ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "gridcells": here.__file__,
        }

    group = algo.env_runner_group
    placed = group.foreach_env_runner(where, local_env_runner=False) if group else []
    (results / "runners.json").write_text(json.dumps(sorted(placed, key=lambda r: r["runner"])))
    saved = algo.save(str((results / "checkpoint").resolve()))
    print(f"checkpoint: {saved.checkpoint.path}", flush=True)
    algo.stop()


if __name__ == "__main__":
    main()
