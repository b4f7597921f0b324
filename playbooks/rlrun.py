"""The training loop every playbook shares: PPO on RLlib's new API stack, results on disk.

A playbook builds a `PPOConfig` and calls `run(config, args)`. This module trains until
the target return or the step budget, and writes into the results directory
(`$PROVISIONER_RESULTS_DIR`, default `results/` in the job's working directory):

- `metrics.csv`, `metrics.json`: one row per iteration (steps, return, time, steps/s);
- `tensorboard/`: TensorBoard event files of the same scalars;
- `checkpoint/`: the final checkpoint (`Algorithm.save_to_path`);
- `runners.json`: the node address and host each env runner ran on;
- `summary.json`: what the run reached, and why it stopped.

It runs on the cluster, not on the client: it needs Ray, RLlib and tensorboardX only.
(The `type: ignore[no-untyped-call]` below: those parts of Ray's API are not annotated.)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.ppo import PPOConfig
from tensorboardX import SummaryWriter  # type: ignore[import-untyped]

RESULTS_ENV = "PROVISIONER_RESULTS_DIR"


@dataclass
class Row:
    """One training iteration, as written to metrics.csv."""

    iteration: int
    env_steps: int
    episode_return_mean: float
    time_s: float
    env_steps_per_s: float


@dataclass
class Budget:
    """When to stop: the first of target return, step budget or iteration budget."""

    target_return: float
    max_env_steps: int
    max_iterations: int


def parser(
    description: str, *, target_return: float, max_env_steps: int
) -> argparse.ArgumentParser:
    """The options every playbook takes; defaults are the playbook's own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--env-runners",
        type=int,
        default=None,
        help="number of env runners (default: the cluster's CPUs minus one)",
    )
    p.add_argument("--target-return", type=float, default=target_return)
    p.add_argument("--max-env-steps", type=int, default=max_env_steps)
    p.add_argument("--max-iterations", type=int, default=1000)
    p.add_argument("--train-batch", type=int, default=2000, help="env steps per iteration")
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", type=Path, default=Path(os.environ.get(RESULTS_ENV, "results")))
    return p


def default_env_runners() -> int:
    """One env runner per CPU of the cluster, keeping one CPU for the driver's learner."""
    cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
    return max(1, cpus - 1)


def ppo_config(
    args: argparse.Namespace, env: Any, env_config: dict[str, Any] | None = None
) -> PPOConfig:
    """PPO on the new API stack with the playbook's options applied."""
    runners = args.env_runners if args.env_runners is not None else default_env_runners()
    batch = int(args.train_batch)
    return (
        PPOConfig()  # type: ignore[no-untyped-call]
        .environment(env, env_config=env_config or {})
        .env_runners(num_env_runners=runners, num_envs_per_env_runner=1)
        .training(
            train_batch_size_per_learner=batch,
            minibatch_size=min(128, batch),
            num_epochs=6,
            lr=args.lr,
            gamma=args.gamma,
        )
        .debugging(seed=args.seed)
    )


def runner_nodes(algo: Algorithm) -> list[dict[str, Any]]:
    """Where each env runner lives: index, node address, host name, node id."""

    def where(runner: Any) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "runner": int(runner.worker_index),
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "host": socket.gethostname(),
            "node_id": ctx.get_node_id(),
        }

    group = algo.env_runner_group
    assert group is not None, "the algorithm was built without env runners"
    remote = group.num_remote_env_runners() > 0
    found = group.foreach_env_runner(where, local_env_runner=not remote)
    return sorted(found, key=lambda r: r["runner"])


def row_of(result: dict[str, Any], started: float) -> Row:
    """The few numbers of an RLlib result that the tables and plots use."""
    runners = result.get("env_runners", {})
    steps = int(
        result.get("num_env_steps_sampled_lifetime")
        or runners.get("num_env_steps_sampled_lifetime", 0)
    )
    ret = runners.get("episode_return_mean")
    elapsed = time.monotonic() - started
    return Row(
        iteration=int(result["training_iteration"]),
        env_steps=steps,
        episode_return_mean=float("nan") if ret is None else float(ret),
        time_s=round(elapsed, 3),
        env_steps_per_s=round(steps / elapsed, 1) if elapsed > 0 else 0.0,
    )


def stop_reason(row: Row, budget: Budget) -> str | None:
    """Why training stops after this row, or None to go on."""
    if row.episode_return_mean >= budget.target_return:
        return "target_return"
    if row.env_steps >= budget.max_env_steps:
        return "max_env_steps"
    if row.iteration >= budget.max_iterations:
        return "max_iterations"
    return None


class Recorder:
    """Writes metrics.csv, metrics.json and TensorBoard events as iterations come."""

    def __init__(self, results: Path) -> None:
        results.mkdir(parents=True, exist_ok=True)
        self.results = results
        self.rows: list[Row] = []
        self.writer = SummaryWriter(str(results / "tensorboard"))

    def add(self, row: Row) -> None:
        self.rows.append(row)
        for name in ("episode_return_mean", "env_steps_per_s"):
            self.writer.add_scalar(f"ppo/{name}", getattr(row, name), row.env_steps)
        self.writer.flush()
        with open(self.results / "metrics.csv", "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(asdict(row)))
            out.writeheader()
            out.writerows(asdict(r) for r in self.rows)
        (self.results / "metrics.json").write_text(
            json.dumps([asdict(r) for r in self.rows], indent=1)
        )

    def close(self) -> None:
        self.writer.close()


def train(
    config: PPOConfig, budget: Budget, results: Path, *, checkpoint: bool = True
) -> dict[str, Any]:
    """Train until the budget says stop; write every result file; return the summary."""
    algo = config.build_algo()
    recorder = Recorder(results)
    try:
        nodes = runner_nodes(algo)
        (results / "runners.json").write_text(json.dumps(nodes, indent=1))
        print(
            f"env runners: {len(nodes)} on nodes {sorted({n['node_ip'] for n in nodes})}",
            flush=True,
        )
        started = time.monotonic()
        reason = None
        while reason is None:
            row = row_of(algo.train(), started)  # type: ignore[no-untyped-call]
            recorder.add(row)
            print(
                f"iter {row.iteration:4d}  steps {row.env_steps:8d}  "
                f"return {row.episode_return_mean:8.2f}  {row.env_steps_per_s:8.1f} steps/s",
                flush=True,
            )
            reason = stop_reason(row, budget)
        path = (results / "checkpoint").resolve()
        saved = algo.save_to_path(str(path)) if checkpoint else None
        last = recorder.rows[-1]
        summary = {
            "stopped_by": reason,
            "iterations": last.iteration,
            "env_steps": last.env_steps,
            "episode_return_mean": last.episode_return_mean,
            "first_return_mean": recorder.rows[0].episode_return_mean,
            "time_s": last.time_s,
            "env_steps_per_s": last.env_steps_per_s,
            "time_to_target_s": last.time_s if reason == "target_return" else None,
            "env_runners": len(nodes),
            "nodes": sorted({n["node_ip"] for n in nodes}),
            "checkpoint": os.path.relpath(saved, results) if saved else None,
        }
        (results / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        recorder.close()
        algo.stop()  # type: ignore[no-untyped-call]


def run(args: argparse.Namespace, config_for: Any) -> dict[str, Any]:
    """Connect to the cluster, build the config with `config_for(args)`, train, summarise."""
    ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    budget = Budget(args.target_return, args.max_env_steps, args.max_iterations)
    summary = train(config_for(args), budget, args.results)
    print("summary: " + json.dumps(summary), flush=True)
    return summary
