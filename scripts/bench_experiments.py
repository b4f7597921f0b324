"""The experiment rows of `make bench` (`--rows experiments`): what issue 45's learning
thresholds ask, measured through the CLI as a user runs it, on the bench's lab cluster.

- SAC on Pendulum-v1 (continuous actions), examples/experiments/pendulum-sac.yaml
  (RLlib's tuned example): the best training return it reaches (target -400 or better);
- CartPole PPO, examples/experiments/cartpole-ppo.yaml with three seeds and a stop at
  return 200: `compare` of the three seeds (the plot kept as
  bench-results/compare-cartpole-seeds.png) and `eval` of the best trial's last checkpoint
  (20 episodes on the cluster, one video): its mean return over the training return at
  that checkpoint (target >= 0.9).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from provisioner.jobs.compare import result_lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "experiments"
CLI = (sys.executable, "-m", "provisioner")
CARTPOLE_STOP = 200.0  # the seeds' stop: a policy that has learned, in minutes


def _run(args: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    with log.open("a") as f:
        f.write(f"$ provisioner {' '.join(args)}\n{done.stdout}\n{done.stderr}\n")
    return done


def _submit(inventory: Path, file: Path, results: Path, log: Path) -> tuple[Path, float]:
    """`submit FILE` to its end: the job's results home and the seconds it took."""
    t0 = time.monotonic()
    done = _run(["submit", "-i", str(inventory), "--results", str(results), str(file)], log, 7200)
    seconds = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"submit {file.name} failed: {done.stderr[-2000:]}")
    homes = sorted(p for p in results.iterdir() if p.is_dir())
    return homes[-1], seconds


def _returns(home: Path) -> list[list[float]]:
    """Each trial's training returns, in order (Tune's result.json)."""
    found = []
    for path in sorted(home.glob("ray_results/*/*/result.json")):
        rows = result_lines(path)  # compare's one reader of Tune's result.json
        values = [r.get("env_runners", {}).get("episode_return_mean") for r in rows]
        found.append([float(v) for v in values if isinstance(v, int | float) and v == v])
    return found


def sac_pendulum(inventory: Path, workdir: Path, log: Path) -> dict[str, Any]:
    results = workdir / "sac"
    results.mkdir(parents=True, exist_ok=True)
    home, seconds = _submit(inventory, EXAMPLES / "pendulum-sac.yaml", results, log)
    (returns,) = _returns(home)
    return {
        "job": home.name,
        "seconds": round(seconds, 1),
        "best_return": max(returns),
        "final_return": returns[-1],
        "iterations": len(returns),
    }


def cartpole_seeds(inventory: Path, workdir: Path, out: Path, log: Path) -> dict[str, Any]:
    """Three seeds to return 200, compared; the best one's checkpoint evaluated."""
    source = yaml.safe_load((EXAMPLES / "cartpole-ppo.yaml").read_text())
    body = source["cartpole-ppo"]
    body["seeds"] = [0, 1, 2]
    body["stop"] = {"env_runners/episode_return_mean": CARTPOLE_STOP, "training_iteration": 60}
    book = workdir / "book"
    book.mkdir(parents=True, exist_ok=True)
    file = book / "cartpole-ppo-seeds.yaml"
    file.write_text(yaml.safe_dump({"cartpole-ppo-seeds": body}, sort_keys=False))
    results = workdir / "cartpole"
    results.mkdir(parents=True, exist_ok=True)
    home, seconds = _submit(inventory, file, results, log)
    png = out / "compare-cartpole-seeds.png"
    compared = _run(
        ["compare", "--results", str(results), home.name, "-o", str(png), "--json"], log, 600
    )
    if compared.returncode != 0:
        raise RuntimeError(f"compare failed: {compared.stderr[-2000:]}")
    evaluated = _run(
        ["eval", "-i", str(inventory), "--results", str(results), home.name,
         "--episodes", "20", "--video", "1", "--json"],
        log, 1800,
    )  # fmt: skip
    if evaluated.returncode != 0:
        raise RuntimeError(f"eval failed: {evaluated.stderr[-2000:]}")
    figures = json.loads(evaluated.stdout)["eval"]
    video = figures["videos"][0] if figures.get("videos") else None
    if video is not None:  # the recorded episode, kept beside the plot
        shutil.copy(next(home.glob("eval-*")) / video["file"], out / "eval-cartpole.mp4")
    return {
        "job": home.name,
        "seconds": round(seconds, 1),
        "compare": json.loads(compared.stdout),
        "eval": figures,
        "ratio": figures["ratio_to_training"],
    }


# --- sweeps (issue 46) ---------------------------------------------------------------------

SWEEP_ITERATIONS = 20


def sweep_file(slots: int) -> str:
    """Two waves of trials of one length: as many learning rates as the cluster has
    slots, times two seeds (a sweep whose last wave fills the cluster: what is measured is
    the placing of trials, not the tail a sweep of another size leaves idle)."""
    rates = [round(1e-4 * 10 ** (i / max(1, slots - 1)), 6) for i in range(slots)]
    return (
        "bench-sweep:\n"
        "    env: CartPole-v1\n"
        "    run: PPO\n"
        f"    stop: {{training_iteration: {SWEEP_ITERATIONS}}}\n"
        "    config:\n"
        f"        lr: {{grid_search: {json.dumps(rates)}}}\n"
        "        train_batch_size_per_learner: 500\n"
        "        minibatch_size: 250\n"
        "        num_epochs: 2\n"
        "    seeds: [1, 2]\n"
        "    checkpoint_frequency: 4\n"
        "    resources: {env_runners: 0}\n"
    )


TRIAL_CPUS = 1.0  # a PPO trial without remote env runners: Tune's one bundle of 1 CPU


def trial_starts(home: Path) -> dict[str, float]:
    """trial id -> when Tune set it RUNNING (its actor built: the algorithm set up), from
    Tune's own experiment state home (`run_metadata.start_time` of each trial)."""
    starts: dict[str, float] = {}
    for path in sorted(home.glob("ray_results/*/experiment_state-*.json")):
        for state, meta in json.loads(path.read_text()).get("trial_data", []):
            trial, run = json.loads(state), json.loads(meta)
            if isinstance(run.get("start_time"), int | float):
                starts[str(trial.get("trial_id"))] = float(run["start_time"])
    return starts


# Run in the head's Ray container: every actor's creation task as Ray's state API keeps it
# (created: when Tune, its trial's resources ready, asked for the actor: the trial's
# CPUs held from there; a trial's algorithm is set up in it), with its worker's node
# address, pid and exit (the CPUs freed).
CREATION_TASKS = """
import json
from ray.util.state import list_tasks, list_workers
address = ADDRESS
def get(x, k):
    return x.get(k) if isinstance(x, dict) else getattr(x, k, None)
workers = {
    get(w, "worker_id"): w
    for w in list_workers(address=address, detail=True, limit=10000, raise_on_missing_output=False)
}
tasks = list_tasks(
    address=address, filters=[("type", "=", "ACTOR_CREATION_TASK")], detail=True,
    limit=10000, raise_on_missing_output=False,
)
found = []
for t in tasks:
    ran = get(t, "profiling_data") or {}
    worker = workers.get(ran.get("component_id"))
    found.append({
        "ip": ran.get("node_ip_address"), "pid": get(t, "worker_pid"),
        "created_ms": get(t, "creation_time_ms"), "worker_end_ms": get(worker, "end_time_ms"),
        "name": get(t, "func_or_class_name"),
    })
print(json.dumps(found))
"""

# (node address, pid) -> (its actor asked for, its worker's exit or None), seconds
Creations = dict[tuple[str, int], tuple[float, float | None]]


def actor_creations(inventory: Path) -> Creations:
    """(node address, pid) -> when the actor of that process was asked for, its resources
    ready, and when its process exited (seconds since the epoch), from Ray's state API on
    the head (its dashboard)."""
    import shlex

    from provisioner.inventory import load_inventory
    from provisioner.node.token import ray_container
    from provisioner.remote import Pool

    inv = load_inventory(inventory)
    script = CREATION_TASKS.replace("ADDRESS", repr(f"http://127.0.0.1:{inv.ports.dashboard}"))
    name = shlex.quote(ray_container(inv))
    with Pool(inv) as pool:
        out = (
            pool.session(inv.head)
            .run(f"docker exec -i {name} python - 2>/dev/null", timeout=120, stdin=script.encode())
            .stdout
        )
    found: Creations = {}
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            for t in json.loads(line):
                if t["ip"] and t["pid"] and t["created_ms"]:
                    ended = float(t["worker_end_ms"]) / 1000 if t["worker_end_ms"] else None
                    found[(str(t["ip"]), int(t["pid"]))] = (float(t["created_ms"]) / 1000, ended)
            break
    return found


def trial_spans(home: Path, creations: Creations | None = None) -> list[tuple[float, float, float]]:
    """Each trial's (took its CPUs, first iteration ended, freed its CPUs), in seconds
    since the epoch. From Ray's state API where it has the trial's actor (`creations`, by
    the node address and pid its results name): took them when Tune asked for its actor,
    its resources ready (the algorithm is set up after that, on them); freed them when
    its process exited (after its last result: the final checkpoint, the actor's stop).
    Else from Tune's own records: took them at Tune's RUNNING (after the set-up), else its
    first result's timestamp less its time_this_iter_s; freed them at its last result."""
    starts = trial_starts(home)
    spans = []
    for path in sorted(home.glob("ray_results/*/*/result.json")):
        rows = result_lines(path)  # compare's one reader of Tune's result.json
        if not rows:
            continue
        first, last = rows[0], rows[-1]
        trained = float(first["timestamp"]) - float(first.get("time_this_iter_s") or 0.0)
        began = starts.get(str(first.get("trial_id")), trained)
        ended = float(last["timestamp"])
        actor = (creations or {}).get((str(first.get("node_ip")), int(first.get("pid") or 0)))
        if actor is not None:
            began = min(began, actor[0])
            ended = max(ended, actor[1] or ended)
        spans.append((began, float(first["timestamp"]), ended))
    return spans


def sweep_figures(
    spans: list[tuple[float, float, float]], cluster_cpus: float, trial_cpus: float = TRIAL_CPUS
) -> dict[str, Any]:
    """sweep-utilization: the CPU-seconds the trials held (their CPUs x from Tune placing
    them to their last result) over the CPU-seconds the cluster offered from the first
    trial's start to the last one's end. trial-start-s: for each trial that waited for a
    slot (placed after another trial ended), from the latest end before it was placed to
    its first iteration's result: Tune placing it, its actor and algorithm built, one
    iteration."""
    if not spans:
        raise ValueError("no trial results")
    start = min(s[0] for s in spans)
    end = max(s[2] for s in spans)
    used = sum(trial_cpus * (last - began) for began, _, last in spans)
    offered = cluster_cpus * (end - start)
    starts = []
    for began, first, _ in spans:
        freed = [last for _, _, last in spans if last <= began]
        if freed:
            starts.append(first - max(freed))
    return {
        "trials": len(spans),
        "seconds": round(end - start, 1),
        "cluster_cpus": cluster_cpus,
        "utilization": used / offered if offered > 0 else None,
        "trial_start_s": sorted(round(s, 2) for s in starts),
    }


def sweep(inventory: Path, workdir: Path, log: Path) -> dict[str, Any]:
    """A sweep of two trials per CPU of the cluster (`sweep_file`), as many at once as its
    CPUs allow; its figures from the trials' results home."""
    from provisioner.jobs.experiment import cluster_capacity
    from provisioner.jobs.link import target_for

    cpus = cluster_capacity(target_for(inventory, None, None)).cpus
    book = workdir / "sweep-book"
    book.mkdir(parents=True, exist_ok=True)
    file = book / "bench-sweep.yaml"
    file.write_text(sweep_file(int(cpus // TRIAL_CPUS)))
    results = workdir / "sweep"
    results.mkdir(parents=True, exist_ok=True)
    home, seconds = _submit(inventory, file, results, log)
    spans = trial_spans(home, actor_creations(inventory))
    running = trial_spans(home)  # Tune's records alone: its RUNNING, after the set-up
    return {
        "job": home.name,
        "submit_seconds": round(seconds, 1),
        "trials_from_ray_state": sum(1 for a, b in zip(spans, running, strict=True) if a != b),
        "set_up_s": sorted(round(b[0] - a[0], 1) for a, b in zip(spans, running, strict=True)),
        "utilization_from_tune_running": sweep_figures(running, float(cpus))["utilization"],
        # each trial's (took its CPUs, first result, last result), seconds from the first
        "spans": [
            [round(t - min(a for a, _, _ in spans), 1) for t in span] for span in sorted(spans)
        ],
        **sweep_figures(spans, float(cpus)),
    }
