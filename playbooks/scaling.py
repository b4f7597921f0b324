"""Scaling run: the same PPO training with 1, 2, ... N env runners, one after another.

    provisioner submit -i INVENTORY playbooks/scaling.py -- --max-runners 4

For each count it reports env steps per second, time to the target return, and how many
nodes the env runners landed on; `scaling.csv` / `scaling.json` hold the table, and
runs/runners-N/ each run's own metrics. The client draws scaling.png from the table.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rlrun
from cell_network import CellNetwork

if TYPE_CHECKING:
    from ray.rllib.algorithms.ppo import PPOConfig

COLUMNS = [
    "env_runners",
    "nodes",
    "iterations",
    "env_steps",
    "time_s",
    "env_steps_per_s",
    "time_to_target_s",
    "episode_return_mean",
]


def config(args: argparse.Namespace) -> PPOConfig:
    if args.env == "cells":
        return rlrun.ppo_config(args, CellNetwork, {})
    return rlrun.ppo_config(args, "CartPole-v1")


def row(summary: dict[str, Any]) -> dict[str, Any]:
    """One line of the scaling table from one run's summary."""
    values = {**summary, "nodes": len(summary["nodes"])}
    return {name: values[name] for name in COLUMNS}


def write_table(rows: list[dict[str, Any]], results: Path) -> None:
    with open(results / "scaling.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=COLUMNS)
        out.writeheader()
        out.writerows(rows)
    (results / "scaling.json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    p = rlrun.parser(__doc__ or "", target_return=150.0, max_env_steps=20_000)
    p.add_argument(
        "--max-runners",
        type=int,
        default=None,
        help="largest env runner count (default: the cluster's CPUs minus one)",
    )
    p.add_argument("--env", choices=["cartpole", "cells"], default="cartpole")
    args = p.parse_args()
    import ray

    ray.init(log_to_driver=False)
    largest = args.max_runners or rlrun.default_env_runners()
    budget = rlrun.Budget(args.target_return, args.max_env_steps, args.max_iterations)
    rows: list[dict[str, Any]] = []
    for runners in range(1, largest + 1):
        args.env_runners = runners
        print(f"--- {runners} env runner(s)", flush=True)
        run_dir = args.results / "runs" / f"runners-{runners}"
        saving = rlrun.Saving(every=0, final=False)
        summary = rlrun.train(config(args), budget, run_dir, saving)
        rows.append(row(summary))
        write_table(rows, args.results)
        print("scaling: " + json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
