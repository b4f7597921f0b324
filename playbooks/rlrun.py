"""The training loop every playbook shares: PPO on RLlib's new API stack, results on disk.

A playbook builds a `PPOConfig` and calls `run(config, args)`. This module trains until
the target return or the step budget, and writes into the results directory
(`$PROVISIONER_RESULTS_DIR`, default `results/` in the job's working directory):

- `metrics.csv`, `metrics.json`: one row per iteration (steps, return, time, steps/s);
- `tensorboard/`: TensorBoard event files of the same scalars;
- `checkpoints/iter-NNNNNN/`: a checkpoint every `--checkpoint-every` iterations and at the
  end (`Algorithm.save_to_path`), the last `--keep-checkpoints` kept; each is written
  under a `.tmp-` name and renamed when complete, so a reader never sees half of one;
- `progress.json`: where the run is now (iteration, env steps against the budget, mean
  return, steps/s, the time left), also printed as a `PROVISIONER-PROGRESS` line;
- `runners.json`: the node address and host each env runner ran on;
- `summary.json`: what the run reached, and why it stopped.

`--resume-from CHECKPOINT` (or `$PROVISIONER_RESUME_FROM`, relative to the results
directory) continues a run: `Algorithm.restore_from_path` brings back the weights, the
iteration and env-step counters; metrics.csv and TensorBoard go on from the rows the
results directory already holds up to that iteration.

It runs on the cluster, not on the client: it needs Ray, RLlib and tensorboardX only.
(The `type: ignore[no-untyped-call]` below: those parts of Ray's API are not annotated.)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Ray, RLlib and tensorboardX are imported where they are used, so that a playbook's
# `--help` answers at once (`submit PLAYBOOK -- --help` runs it on the control machine).
if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.ppo import PPOConfig

RESULTS_ENV = "PROVISIONER_RESULTS_DIR"
RESUME_ENV = "PROVISIONER_RESUME_FROM"
RETRIES_ENV = "PROVISIONER_RETRIES"
PROGRESS_MARK = "PROVISIONER-PROGRESS"
CHECKPOINTS = "checkpoints"


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
    p.add_argument(
        "--num-gpus-per-learner",
        type=float,
        default=None,
        help="GPUs per RLlib learner (default: 1 when the cluster has GPUs, else 0: CPU)",
    )
    p.add_argument(
        "--num-learners",
        type=int,
        default=None,
        help="remote learners (default: as many as the cluster's GPUs allow; 0 without GPUs: "
        "the driver's own learner)",
    )
    p.add_argument("--target-return", type=float, default=target_return)
    p.add_argument("--max-env-steps", type=int, default=max_env_steps)
    p.add_argument("--max-iterations", type=int, default=1000)
    p.add_argument("--train-batch", type=int, default=2000, help="env steps per iteration")
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate")
    p.add_argument("--gamma", type=float, default=0.99, help="discount factor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", type=Path, default=Path(os.environ.get(RESULTS_ENV, "results")))
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=10,
        help="save a checkpoint every N iterations (and at the end); 0: only at the end",
    )
    p.add_argument("--keep-checkpoints", type=int, default=3, help="keep the last K checkpoints")
    p.add_argument(
        "--resume-from",
        type=Path,
        default=Path(os.environ[RESUME_ENV]) if os.environ.get(RESUME_ENV) else None,
        help="continue from this checkpoint (relative: to the results directory)",
    )
    return p


def default_env_runners() -> int:
    """One env runner per CPU of the cluster, keeping one CPU for the driver's learner."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))  # type: ignore[no-untyped-call]
    return max(1, cpus - 1)


def cluster_gpus() -> float:
    """The GPUs Ray lists in the cluster."""
    import ray

    return float(ray.cluster_resources().get("GPU", 0))  # type: ignore[no-untyped-call]


def learner_plan(gpus: float, per_learner: float | None, learners: int | None) -> tuple[int, float]:
    """Pure: (num_learners, num_gpus_per_learner). By default the cluster's GPUs train: one
    remote learner per GPU; without GPUs, the driver's own learner on its CPU."""
    per = per_learner if per_learner is not None else (1.0 if gpus >= 1 else 0.0)
    if per < 0:
        raise SystemExit(f"GPUs per learner (--num-gpus-per-learner) must be 0 or more, got {per}")
    if learners is None:
        learners = int(gpus // per) if per > 0 else 0
    if per > 0 and max(learners, 1) * per > gpus:
        raise SystemExit(
            f"{max(learners, 1)} learner(s) x {per} GPU(s) need more than the cluster's "
            f"{gpus:g} GPU(s): lower --num-learners or --num-gpus-per-learner (0: CPU)"
        )
    return learners, per


def ppo_config(
    args: argparse.Namespace, env: Any, env_config: dict[str, Any] | None = None
) -> PPOConfig:
    """PPO on the new API stack with the playbook's options applied."""
    from ray.rllib.algorithms.ppo import PPOConfig

    runners = args.env_runners if args.env_runners is not None else default_env_runners()
    batch = int(args.train_batch)
    config = (
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
    learners, per = learner_plan(
        cluster_gpus(),
        getattr(args, "num_gpus_per_learner", None),
        getattr(args, "num_learners", None),
    )
    config = config.learners(num_learners=learners, num_gpus_per_learner=per)
    if os.environ.get(RETRIES_ENV):
        # `submit --retries`: a lost env runner fails the job at once, and provisioner
        # repairs the cluster and resumes from the latest checkpoint on every node,
        # instead of RLlib going on with fewer runners.
        config = config.fault_tolerance(
            restart_failed_env_runners=False, ignore_env_runner_failures=False
        )
    return config


def runner_nodes(algo: Algorithm) -> list[dict[str, Any]]:
    """Where each env runner lives: index, node address, host name, node id."""
    import ray

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


def learner_devices(algo: Algorithm) -> list[dict[str, Any]]:
    """Which device each learner trains on: its torch device, node address and GPU name."""
    import ray

    def where(learner: Any, _: Any = None) -> dict[str, Any]:
        device = str(learner.device) if learner.device is not None else "cpu"
        name = None
        if device.startswith("cuda"):
            import torch

            name = torch.cuda.get_device_name(learner.device)
        return {
            "device": device,
            "gpu": name,
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    group = algo.learner_group
    assert group is not None, "the algorithm was built without learners"
    found = [r.get() for r in group.foreach_learner(where)]  # type: ignore[no-untyped-call]
    return [{"learner": i, **d} for i, d in enumerate(found)]


@dataclass
class Clock:
    """Where this run started: its time and env steps, plus the time of runs it continues.

    Steps/s is this run's own steps over this run's own time: a resumed run never divides
    the lifetime steps by its new, shorter elapsed time."""

    started: float
    steps_at_start: int = 0
    time_before: float = 0.0


def row_of(result: dict[str, Any], clock: Clock, now: float | None = None) -> Row:
    """The few numbers of an RLlib result that the tables and plots use."""
    runners = result.get("env_runners", {})
    steps = int(
        result.get("num_env_steps_sampled_lifetime")
        or runners.get("num_env_steps_sampled_lifetime", 0)
    )
    ret = runners.get("episode_return_mean")
    elapsed = (time.monotonic() if now is None else now) - clock.started
    done = steps - clock.steps_at_start
    return Row(
        iteration=int(result["training_iteration"]),
        env_steps=steps,
        episode_return_mean=float("nan") if ret is None else float(ret),
        time_s=round(clock.time_before + elapsed, 3),
        env_steps_per_s=round(done / elapsed, 1) if elapsed > 0 else 0.0,
    )


def progress_of(row: Row, budget: Budget) -> dict[str, Any]:
    """The live figures of a run: iteration, steps against the budget, return, rate, ETA."""
    left = max(0, budget.max_env_steps - row.env_steps)
    eta = left / row.env_steps_per_s if row.env_steps_per_s > 0 else None
    ret = row.episode_return_mean
    return {
        "iteration": row.iteration,
        "env_steps": row.env_steps,
        "max_env_steps": budget.max_env_steps,
        "episode_return_mean": None if math.isnan(ret) else round(ret, 2),
        "target_return": budget.target_return,
        "env_steps_per_s": row.env_steps_per_s,
        "eta_s": None if eta is None else round(eta, 1),
        "time_s": row.time_s,
        "updated": time.time(),
    }


def write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all (a reader copying it mid-run sees one version)."""
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text)
    os.replace(tmp, path)


def checkpoint_name(iteration: int) -> str:
    return f"iter-{iteration:06d}"


def save_checkpoint(algo: Algorithm, results: Path, iteration: int, keep: int) -> Path:
    """checkpoints/iter-NNNNNN, written under a .tmp- name and renamed when complete;
    only the last `keep` are kept."""
    folder = results / CHECKPOINTS
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / checkpoint_name(iteration)
    if final.is_dir():
        return final
    tmp = folder / f".tmp-{final.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    algo.save_to_path(str(tmp.resolve()))
    os.replace(tmp, final)
    for old in sorted(p for p in folder.glob("iter-*") if p.is_dir())[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


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

    def __init__(self, results: Path, *, continue_after: int | None = None) -> None:
        results.mkdir(parents=True, exist_ok=True)
        self.results = results
        self.rows: list[Row] = []
        if continue_after is not None:  # a resumed run: the rows up to its checkpoint go on
            self.rows = [
                r for r in read_rows(results / "metrics.csv") if r.iteration <= continue_after
            ]
        from tensorboardX import SummaryWriter  # type: ignore[import-untyped]

        self.writer = SummaryWriter(str(results / "tensorboard"))

    def add(self, row: Row) -> None:
        self.rows.append(row)
        for name in ("episode_return_mean", "env_steps_per_s"):
            self.writer.add_scalar(f"ppo/{name}", getattr(row, name), row.env_steps)
        self.writer.flush()
        tmp = self.results / ".tmp-metrics.csv"
        with open(tmp, "w", newline="") as f:
            out = csv.DictWriter(f, fieldnames=list(asdict(row)))
            out.writeheader()
            out.writerows(asdict(r) for r in self.rows)
        os.replace(tmp, self.results / "metrics.csv")
        write_atomic(
            self.results / "metrics.json", json.dumps([asdict(r) for r in self.rows], indent=1)
        )

    def close(self) -> None:
        self.writer.close()


def read_rows(path: Path) -> list[Row]:
    """The rows of an earlier metrics.csv (none when there is none)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return [
            Row(
                iteration=int(r["iteration"]),
                env_steps=int(r["env_steps"]),
                episode_return_mean=float(r["episode_return_mean"] or "nan"),
                time_s=float(r["time_s"]),
                env_steps_per_s=float(r["env_steps_per_s"]),
            )
            for r in csv.DictReader(f)
        ]


@dataclass
class Saving:
    """How often to checkpoint, how many to keep, and where to continue from."""

    every: int = 10
    keep: int = 3
    resume_from: Path | None = None
    final: bool = True


def resume_path(results: Path, given: Path | None) -> Path | None:
    """The checkpoint to restore: as given, or relative to the results directory."""
    if given is None:
        return None
    path = given if given.is_absolute() else results / given
    if not path.is_dir():
        raise SystemExit(f"no checkpoint to resume from at {path}")
    return path.resolve()


def describe_device(d: dict[str, Any]) -> str:
    """`cuda:0 (Tesla T4) on 10.0.0.5` or `cpu on 10.0.0.5`."""
    gpu = f" ({d['gpu']})" if d.get("gpu") else ""
    return f"{d['device']}{gpu} on {d['node_ip']}"


def train(
    config: PPOConfig, budget: Budget, results: Path, saving: Saving | None = None
) -> dict[str, Any]:
    """Train until the budget says stop; write every result file; return the summary."""
    saving = saving or Saving()
    algo = config.build_algo()
    resume = resume_path(results, saving.resume_from)
    if resume is not None:
        algo.restore_from_path(str(resume))  # type: ignore[no-untyped-call]
        print(f"resumed from {resume} at iteration {algo.iteration}", flush=True)
    recorder = Recorder(results, continue_after=algo.iteration if resume else None)
    try:
        nodes = runner_nodes(algo)
        (results / "runners.json").write_text(json.dumps(nodes, indent=1))
        learners = learner_devices(algo)
        (results / "learners.json").write_text(json.dumps(learners, indent=1))
        print(f"learners: {', '.join(describe_device(d) for d in learners)}", flush=True)
        print(
            f"env runners: {len(nodes)} on nodes {sorted({n['node_ip'] for n in nodes})}",
            flush=True,
        )
        last_row = recorder.rows[-1] if recorder.rows else None
        clock = Clock(
            started=time.monotonic(),
            steps_at_start=last_row.env_steps if last_row else 0,
            time_before=last_row.time_s if last_row else 0.0,
        )
        reason = stop_reason(last_row, budget) if last_row else None
        while reason is None:
            row = row_of(algo.train(), clock)  # type: ignore[no-untyped-call]
            recorder.add(row)
            print(
                f"iter {row.iteration:4d}  steps {row.env_steps:8d}  "
                f"return {row.episode_return_mean:8.2f}  {row.env_steps_per_s:8.1f} steps/s",
                flush=True,
            )
            reason = stop_reason(row, budget)
            if saving.every > 0 and row.iteration % saving.every == 0 and reason is None:
                save_checkpoint(algo, results, row.iteration, saving.keep)
            progress = progress_of(row, budget)
            write_atomic(results / "progress.json", json.dumps(progress))
            print(f"{PROGRESS_MARK} {json.dumps(progress)}", flush=True)
        last = recorder.rows[-1]
        saved = (
            save_checkpoint(algo, results, last.iteration, saving.keep) if saving.final else None
        )
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
            "learners": len(learners),
            "trained_on": sorted({describe_device(d) for d in learners}),
            "checkpoint": os.path.relpath(saved, results) if saved else None,
        }
        write_atomic(results / "summary.json", json.dumps(summary, indent=1))
        return summary
    finally:
        recorder.close()
        algo.stop()  # type: ignore[no-untyped-call]


def saving_of(args: argparse.Namespace) -> Saving:
    return Saving(args.checkpoint_every, args.keep_checkpoints, args.resume_from)


def run(args: argparse.Namespace, config_for: Any) -> dict[str, Any]:
    """Connect to the cluster, build the config with `config_for(args)`, train, summarise."""
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS"), log_to_driver=False)
    budget = Budget(args.target_return, args.max_env_steps, args.max_iterations)
    summary = train(config_for(args), budget, args.results, saving_of(args))
    print("summary: " + json.dumps(summary), flush=True)
    return summary
