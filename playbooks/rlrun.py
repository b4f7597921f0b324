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
- `summary.json`: what the run reached, why it stopped, its node-hours and their cost
  (where `$PROVISIONER_PRICE_PER_NODE_HOUR` gives a price);
- `config.json`: the run's whole algorithm config (`AlgorithmConfig.to_dict()` as JSON).

`--resume-from CHECKPOINT` (or `$PROVISIONER_RESUME_FROM`, relative to the results
directory) continues a run: `Algorithm.restore_from_path` brings back the learner's
weights and optimizer state, the connector states and the counters; then every env
runner is given the restored weights and connector states and waits until it holds them
(checked by digest), and the random generators go on from where they were
(`rng.json` in each checkpoint). metrics.csv and TensorBoard go on from the rows the
results directory already holds up to that iteration.

Why the explicit hand-over: RLlib's own restore sends the weights to remote env runners
fire-and-forget, through an actor manager that drops a call to a runner while an earlier
call with the same tag is still in flight (`max_requests_in_flight_per_env_runner`,
default 1). `build_algo()` leaves exactly such a call in flight (its own first weight
sync), so on a cluster, where that call has to fetch the weights from another node, the
restored weights were usually dropped and the runners sampled with a fresh policy. On
one machine that call is done within milliseconds, so a resume there seemed to work.

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
import signal
import socket
import stat
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
# set by the SageMaker entry point: SIGTERM (a stopped job) ends the run after the current
# iteration with a checkpoint, instead of killing it
SIGTERM_ENV = "PROVISIONER_CHECKPOINT_ON_SIGTERM"
PROGRESS_MARK = "PROVISIONER-PROGRESS"
CHECKPOINTS = "checkpoints"
# the price of one node-hour (`submit --price-per-hour`, or the inventory's
# price_per_node_hour): the run's cost in summary.json
PRICE_ENV = "PROVISIONER_PRICE_PER_NODE_HOUR"


RNG_FILE = "rng.json"
# What RLlib's learner state leaves out: PPO's adaptive KL coefficient (per module) lives
# beside the learner's weights and optimizer, and a restore would reset it to the
# config's initial value, changing how far each update after the resume may move.
LEARNER_FILE = "learner.json"


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
    p.add_argument(
        "--obs-filter",
        action="store_true",
        help="normalise observations with a running mean/std filter (its state is "
        "checkpointed and resumed with the weights)",
    )
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


def cluster_nodes() -> int:
    """The nodes alive in the cluster."""
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))  # type: ignore[no-untyped-call,misc]


def price_per_hour(environ: Any = None) -> float | None:
    """The price of a node-hour this job was given ($PROVISIONER_PRICE_PER_NODE_HOUR), or
    None (no price given, or not a number 0 or more)."""
    text = (os.environ if environ is None else environ).get(PRICE_ENV)
    try:
        price = float(text) if text else None
    except ValueError:
        return None
    return price if price is not None and math.isfinite(price) and price >= 0 else None


def cost_of(unit: str, hours: float, price: float | None) -> dict[str, Any]:
    """Pure: the `cost` of summary.json, the same in a cluster job's (node-hours) and a
    SageMaker job's (instance-hours): hours x price, where a price is given."""
    hours = round(hours, 5)  # the cost is the hours as written times the price
    return {
        "unit": unit,
        "hours": hours,
        "price_per_hour": price,
        "cost": None if price is None else round(hours * price, 5),
    }


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
    if getattr(args, "obs_filter", False):
        from ray.rllib.connectors.env_to_module.mean_std_filter import MeanStdFilter

        def obs_filter(env: Any, spaces: Any = None, device: Any = None) -> Any:
            return MeanStdFilter()

        config = config.env_runners(env_to_module_connector=obs_filter)
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
    """Which device each learner trains on: its torch device, node address and GPU name,
    and whether it is a remote learner."""
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
    # remote: in an actor of its own (`--num-learners` 1 or more, as a GPU learner is);
    # else the driver's own learner
    remote = bool(group.is_remote)
    return [{"learner": i, "remote": remote, **d} for i, d in enumerate(found)]


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


def jsonable(value: Any, depth: int = 0) -> Any:
    """A config value as JSON (as provisioner's experiment facts write it): containers
    kept, a class or function by its dotted name, any other object by its type."""
    import inspect

    if depth > 20:
        return "<too deep>"
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [jsonable(v, depth + 1) for v in items]
    if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value):
        return f"{value.__module__}.{value.__qualname__}"
    kind = type(value)
    return f"<{kind.__module__}.{kind.__qualname__}>"


def resolved_config(config: Any) -> dict[str, Any]:
    """The algorithm config that runs, as config.json keeps it: `to_dict()` made JSON,
    without the keys RLlib keeps only as deprecated."""
    from ray._common.deprecation import DEPRECATED_VALUE

    found = sorted(config.to_dict().items())
    return {k: jsonable(v) for k, v in found if v is not DEPRECATED_VALUE}


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
    readable_like(tmp, results)
    (tmp / RNG_FILE).write_text(json.dumps(rng_states(algo)))
    (tmp / LEARNER_FILE).write_text(json.dumps(learner_extras(algo)))
    os.replace(tmp, final)
    for old in sorted(p for p in folder.glob("iter-*") if p.is_dir())[: -max(1, keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def readable_like(tree: Path, like: Path) -> None:
    """Give every folder and file under `tree` the read access `like` (the results
    directory) grants. A learner on another node (`--num-learners`, a GPU learner) saves
    its part of a checkpoint through a temporary directory of RLlib's own, mode 0700,
    which the user bringing results home over SSH could not read."""
    bits = stat.S_IMODE(like.stat().st_mode) & 0o555
    for root, dirs, files in os.walk(tree):
        for name in dirs:
            path = Path(root, name)
            os.chmod(path, stat.S_IMODE(path.stat().st_mode) | bits)
        for name in files:
            path = Path(root, name)
            os.chmod(path, stat.S_IMODE(path.stat().st_mode) | (bits & 0o444))


@dataclass
class Terminate:
    """Whether SIGTERM came (see SIGTERM_ENV)."""

    requested: bool = False

    def handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        print("SIGTERM: checkpointing after this iteration, then stopping", flush=True)


TERMINATE = Terminate()


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


def _flat(value: Any, out: list[bytes], key: str = "") -> None:
    """Every number in a nested state, in a fixed order, as bytes (tensors and arrays too)."""
    import numpy as np

    if isinstance(value, dict):
        for k in sorted(value, key=str):
            _flat(value[k], out, f"{key}/{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _flat(v, out, f"{key}/{i}")
    else:
        if hasattr(value, "detach"):  # a torch tensor
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray | np.generic | int | float | bool):
            arr = np.asarray(value, dtype=np.float64)
            out.append(key.encode() + b"=" + arr.tobytes())
        elif value is not None:
            out.append(f"{key}={value!r}".encode())


def digest(state: Any) -> str:
    """A digest of a weights or connector state that is the same wherever it is computed."""
    import hashlib

    parts: list[bytes] = []
    _flat(state, parts)
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def on_every_runner(algo: Algorithm, func: Any, what: str) -> list[Any]:
    """`func(runner)` on every env runner (the local one when there are no remote ones),
    waiting for each; a runner that fails or does not answer fails the run, rather than
    training going on with some runners in another state."""
    group = algo.env_runner_group
    assert group is not None
    remote = group.num_remote_env_runners()
    found = group.foreach_env_runner(func, local_env_runner=remote == 0)
    if len(found) != max(remote, 1):
        raise SystemExit(
            f"resume: {max(remote, 1) - len(found)} of {max(remote, 1)} env runner(s) could "
            f"not {what}; see the job's log for the runner's error"
        )
    return list(found)


def _one_module(weights: Any) -> Any:
    """A single-agent module's weights, whether or not they come keyed by its module id."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    return weights.get(DEFAULT_MODULE_ID, weights)


def hand_over(algo: Algorithm, checkpoint: Path) -> int:
    """Give every env runner the restored weights and connector states, wait until each
    holds them, and check that by digest; the number of runners checked.

    Synchronous calls on each runner, queued behind any weight sync RLlib still has in
    flight, so nothing sent earlier can overwrite them (an actor runs one caller's calls
    in order)."""
    import ray
    from ray.rllib.core import (
        COMPONENT_ENV_TO_MODULE_CONNECTOR,
        COMPONENT_LEARNER,
        COMPONENT_MODULE_TO_ENV_CONNECTOR,
        COMPONENT_RL_MODULE,
    )

    group = algo.env_runner_group
    assert group is not None and algo.learner_group is not None
    weights = algo.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}", inference_only=True
    )[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
    state: dict[str, Any] = {COMPONENT_RL_MODULE: weights}
    for name, pipeline in (
        (COMPONENT_ENV_TO_MODULE_CONNECTOR, getattr(algo, "env_to_module_connector", None)),
        (COMPONENT_MODULE_TO_ENV_CONNECTOR, getattr(algo, "module_to_env_connector", None)),
    ):
        if pipeline is not None and (checkpoint / name).is_dir():
            # exactly the checkpoint's state (RLlib's restore merges the fresh runners' in)
            pipeline.restore_from_path(checkpoint / name)
            state[name] = pipeline.get_state()
    ref = ray.put(state)
    want = {k: digest(_one_module(v) if k == COMPONENT_RL_MODULE else v) for k, v in state.items()}

    def take(runner: Any) -> dict[str, str]:
        import ray as _ray

        runner.set_state(_ray.get(ref))  # no weights_seq_no: the runner takes them whatever
        got = runner.get_state(components=list(state), inference_only=True)
        return {
            k: digest(_one_module(got[k]) if k == COMPONENT_RL_MODULE else got[k])
            for k in state
            if k in got
        }

    found = on_every_runner(algo, take, "take the restored weights")
    for i, got in enumerate(found):
        wrong = sorted(k for k in want if got.get(k) != want[k])
        if wrong:
            raise SystemExit(
                f"resume: env runner {i + 1} does not hold the restored {', '.join(wrong)} "
                "after the hand-over; not training on a fresh policy"
            )
    return len(found)


def _rng_of_process(envs: Any = None) -> dict[str, Any]:
    """This process's random generators (Python, NumPy, torch) and its envs' own."""
    import random

    import numpy as np

    state: dict[str, Any] = {"python": _jsonable(random.getstate())}
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state["numpy"] = [kind, np.asarray(keys).tolist(), pos, has_gauss, cached]
    try:
        import torch

        state["torch"] = torch.get_rng_state().tolist()
    except ImportError:  # pragma: no cover - the image has torch
        pass
    if envs is not None:
        state["envs"] = [_jsonable(e.np_random.bit_generator.state) for e in envs]
    return state


def _set_rng_of_process(state: dict[str, Any], envs: Any = None) -> None:
    import random

    import numpy as np

    random.setstate(_tupled(state["python"]))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        import torch

        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if envs is not None:
        for env, saved in zip(envs, state.get("envs", []), strict=False):
            env.np_random.bit_generator.state = saved


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _tupled(value: Any) -> Any:
    return tuple(_tupled(v) for v in value) if isinstance(value, list) else value


def _runner_envs(runner: Any) -> list[Any]:
    """The gymnasium envs an env runner steps (inside its vector env), unwrapped."""
    vector = getattr(runner, "env", None)
    inner = getattr(getattr(vector, "unwrapped", vector), "envs", None) or []
    return [getattr(e, "unwrapped", e) for e in inner]


def rng_states(algo: Algorithm) -> dict[str, Any]:
    """The driver's (and its local learner's) random state and each env runner's, by
    runner index, for `rng.json` beside a checkpoint."""
    group = algo.env_runner_group
    assert group is not None

    def of(runner: Any) -> tuple[int, dict[str, Any]]:
        return int(runner.worker_index), _rng_of_process(_runner_envs(runner))

    runners = dict(on_every_runner(algo, of, "report its random state"))
    return {"driver": _rng_of_process(), "runners": {str(k): v for k, v in runners.items()}}


def learner_extras(algo: Algorithm) -> dict[str, Any]:
    """Each learner's state that RLlib's own checkpoint does not hold (PPO's current KL
    coefficient per module), for `learner.json` beside a checkpoint."""
    group = algo.learner_group
    assert group is not None

    def of(learner: Any, _: Any = None) -> dict[str, float]:
        coeffs = getattr(learner, "curr_kl_coeffs_per_module", None) or {}
        return {str(m): float(v) for m, v in dict(coeffs).items()}

    found = [r.get() for r in group.foreach_learner(of)]  # type: ignore[no-untyped-call]
    return {"kl_coeffs": found[0] if found else {}}


def restore_learner_extras(algo: Algorithm, checkpoint: Path) -> dict[str, float]:
    """Put back what `learner_extras` saved, on every learner, and read it back: the
    coefficients each learner now holds (empty: nothing saved)."""
    path = checkpoint / LEARNER_FILE
    saved: dict[str, float] = json.loads(path.read_text())["kl_coeffs"] if path.is_file() else {}
    group = algo.learner_group
    assert group is not None
    if not saved:
        return {}

    def put(learner: Any, _: Any = None) -> dict[str, float]:
        import torch

        coeffs = learner.curr_kl_coeffs_per_module
        for module, value in saved.items():
            with torch.no_grad():
                coeffs[module].fill_(value)  # the tensor PPO's update scales in place
        return {m: float(coeffs[m]) for m in saved}

    results = group.foreach_learner(put)
    held: list[dict[str, float]] = [r.get() for r in results]  # type: ignore[no-untyped-call]
    for got in held:
        if any(abs(got[m] - v) > 1e-9 * max(1.0, abs(v)) for m, v in saved.items()):
            raise SystemExit(f"resume: a learner does not hold the restored KL coefficient {saved}")
    return held[0]


def restore_rng(algo: Algorithm, checkpoint: Path, seed: int) -> str:
    """Put back the random state saved with the checkpoint; runners it has none for (a
    checkpoint without rng.json, or more runners than before) are seeded anew from the
    seed and the iteration, so that no runner replays the run's first episodes."""
    group = algo.env_runner_group
    assert group is not None
    path = checkpoint / RNG_FILE
    saved: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    runners: dict[str, Any] = saved.get("runners", {})
    iteration = int(algo.iteration or 0)

    def put(runner: Any) -> bool:
        import random

        import numpy as np

        mine = runners.get(str(int(runner.worker_index)))
        envs = _runner_envs(runner)
        if mine is not None:
            _set_rng_of_process(mine, envs)
            return True
        fresh = (seed * 1_000_003 + iteration * 1_009 + int(runner.worker_index)) % 2**32
        random.seed(fresh)
        np.random.seed(fresh)
        try:
            import torch

            torch.manual_seed(fresh)
        except ImportError:  # pragma: no cover
            pass
        for k, env in enumerate(envs):
            env.np_random, _ = __import__("gymnasium").utils.seeding.np_random(fresh + k)
        return False

    if "driver" in saved:
        _set_rng_of_process(saved["driver"])
    restored = on_every_runner(algo, put, "take its random state")
    kept = sum(1 for r in restored if r)
    if not saved:
        return f"not in the checkpoint: {len(restored)} runner(s) seeded anew"
    return f"restored ({kept} of {len(restored)} runner(s); others seeded anew)"


def describe_device(d: dict[str, Any]) -> str:
    """`cuda:0 (Tesla T4) on 10.0.0.5` or `cpu on 10.0.0.5`."""
    gpu = f" ({d['gpu']})" if d.get("gpu") else ""
    return f"{d['device']}{gpu} on {d['node_ip']}"


def train(
    config: PPOConfig, budget: Budget, results: Path, saving: Saving | None = None
) -> dict[str, Any]:
    """Train until the budget says stop; write every result file; return the summary."""
    saving = saving or Saving()
    # the run's whole algorithm config, kept with its results (a run repeated from them)
    results.mkdir(parents=True, exist_ok=True)
    write_atomic(results / "config.json", json.dumps(resolved_config(config), indent=1) + "\n")
    algo = config.build_algo()
    resume = resume_path(results, saving.resume_from)
    if resume is not None:
        algo.restore_from_path(str(resume))  # type: ignore[no-untyped-call]
        handed = hand_over(algo, resume)
        rng = restore_rng(algo, resume, seed=int(algo.config.seed or 0))  # type: ignore[union-attr]
        kl = restore_learner_extras(algo, resume)
        held = ", ".join(f"{v:.4g}" for v in kl.values()) or "not in the checkpoint"
        print(
            f"resumed from {resume} at iteration {algo.iteration}: the restored weights "
            f"verified on {handed} env runner(s); random state {rng}; KL coefficient {held}",
            flush=True,
        )
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
            reason = stop_reason(row, budget) or ("sigterm" if TERMINATE.requested else None)
            # Progress first: whatever kills the run, progress.json is never behind the
            # newest checkpoint (`jobs list` after a head restart reads it from the disk).
            progress = progress_of(row, budget)
            write_atomic(results / "progress.json", json.dumps(progress))
            print(f"{PROGRESS_MARK} {json.dumps(progress)}", flush=True)
            if saving.every > 0 and row.iteration % saving.every == 0 and reason is None:
                save_checkpoint(algo, results, row.iteration, saving.keep)
        last = recorder.rows[-1]
        saved = (
            save_checkpoint(algo, results, last.iteration, saving.keep) if saving.final else None
        )
        node_hours = cluster_nodes() * (last.time_s - clock.time_before) / 3600
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
            # what the run occupied, for cost: every node of the cluster over this run's
            # training time (a resumed run counts its own time only)
            "cluster_nodes": cluster_nodes(),
            "node_hours": round(node_hours, 5),
            "cost": cost_of("node-hour", node_hours, price_per_hour()),
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
    if os.environ.get(SIGTERM_ENV):
        signal.signal(signal.SIGTERM, TERMINATE.handle)
    budget = Budget(args.target_return, args.max_env_steps, args.max_iterations)
    summary = train(config_for(args), budget, args.results, saving_of(args))
    print("summary: " + json.dumps(summary), flush=True)
    return summary
