"""An unchanged script's own work on the cluster, as a user sees it (issue 44): RLlib's own
examples and a plain Tune script submitted as they are, their progress shown live from
Tune's own results, their own lines, Ray's noise only under `--verbose`, no escape sequence
off a terminal, Tune's folder home from the storage every node shares, a checkpoint made
on a worker loaded here by `Algorithm.from_checkpoint`. Then experiment files (issue 45):
validated and run through Tune, three seeds compared (`compare`), checkpoints evaluated on
the cluster with videos (`eval`: CartPole, and MuJoCo's humanoid rendered headless), and
APPO, IMPALA, DQN and SAC (continuous actions) each trained from a file, all four at once.

On the two-network lab (conftest.data_lab: SSH on one network, Ray's traffic and the
head's store on the other), in the second e2e process: the cluster is up for this module
and down at its end (the data network's own tests start from no cluster).
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from tests.e2e.helpers import (  # noqa: F401 (the fixtures lab, inventory)
    cli,
    cli_json,
    data_cluster_for_module,
    data_lab_for_module,
)


def ray_address(node: LabNode) -> str:
    """The address Ray knows the node by: its data network's."""
    return node.data_address or node.address


# Holds every CPU of the head (an actor pinned there) until stopped: a trial started
# meanwhile runs on a worker, and its checkpoints must reach storage every node shares.
HOLD_THE_HEAD = """\
import time
import ray

ray.init()
head = ray.util.get_node_ip_address()
cpus = next(n["Resources"]["CPU"] for n in ray.nodes() if n["NodeManagerAddress"] == head)

@ray.remote
class Hold:
    def where(self):
        return ray.util.get_node_ip_address()

hold = Hold.options(num_cpus=cpus, resources={f"node:{head}": 0.01}).remote()
print("HOLDING", ray.get(hold.where.remote()), cpus, flush=True)
time.sleep(900)
"""
RLLIB_MULTI_AGENT = "rllib/examples/multi_agent/multi_agent_cartpole.py"  # in the Ray wheel


def test_rllibs_own_example_checkpoints_at_end_and_restores_here(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """A second of RLlib's own examples, unchanged (multi-agent CartPole), its trial on a
    worker (the head's CPUs held by another job), submitted with `--verbose`: it
    checkpoints at its end, Ray's noise and Tune's tables are shown (the positive control
    of the test below; no escape sequence either), Tune's folder comes home,
    `Algorithm.from_checkpoint` loads it."""
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    holder = tmp_path / "holder"
    holder.mkdir()
    (holder / "hold.py").write_text(HOLD_THE_HEAD)
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(tmp_path / "h"), "--detach", "--json",
        str(holder / "hold.py"),
    )  # fmt: skip
    assert code == 0, err[-2000:]
    held = json.loads(out)["job_id"]
    try:
        deadline = time.monotonic() + 120
        log = ""
        while "HOLDING" not in log and time.monotonic() < deadline:
            time.sleep(2)
            log = cli("jobs", "logs", held, "-i", inventory)[1]
        assert f"HOLDING {ray_address(lab.nodes[0])}" in log, log[-2000:]
        book = tmp_path / "example"
        book.mkdir()
        script = Path(shutil.copy(Path(spec.origin).parent / RLLIB_MULTI_AGENT, book))
        code, shown = submit_as_a_user(
            inventory, tmp_path / "r", script,
            "--num-agents", "2", "--num-env-runners", "2", "--stop-iters", "1",
            "--checkpoint-at-end", flags=("--verbose",),
        )  # fmt: skip
    finally:
        cli("jobs", "stop", held, "-i", inventory)
    assert code == 0 and "SUCCEEDED" in shown, shown[-3000:]
    # Ray's noise and Tune's own tables: shown under --verbose (they say each iteration:
    # no progress line of ours beside them off a terminal; the test below has it)
    assert "(PPO pid=" in shown and "Number of trials: 1/1 (1 TERMINATED)" in shown, shown[-3000:]
    assert "\x1b" not in shown and "x1b" not in shown
    (home,) = (tmp_path / "r").iterdir()
    (result,) = (home / "ray_results").glob("*/*/result.json")
    ran_on = {json.loads(line)["node_ip"] for line in result.read_text().splitlines()}
    assert ran_on and ray_address(lab.nodes[0]) not in ran_on, ran_on  # on a worker
    found = sorted(result.parent.glob("checkpoint_*"))
    assert found, sorted(p.name for p in home.rglob("*"))[:50]
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
    from ray.tune.registry import register_env

    # the example registers its env under "env" when it runs: so does the user here
    register_env("env", lambda _: MultiAgentCartPole(config={"num_agents": 2}))
    algo = Algorithm.from_checkpoint(str(found[-1]))
    try:
        assert algo.iteration == 1
    finally:
        algo.stop()


# --- an unchanged script's output (issue 44): progress from Tune's own results, its own
# lines, Ray's noise only under --verbose, no escape sequence off a terminal

RLLIB_EXAMPLE = "rllib/examples/envs/custom_gym_env.py"  # in the Ray wheel
# one trial, 2 env runners; `--as-test` prints the script's own verdict (the low reward
# target is met by the first iteration, which ends the run there)
RLLIB_ARGS = ("--num-env-runners", "2", "--stop-iters", "2", "--as-test", "--stop-reward=-1000")
# (no return before the first episode has ended: an iteration may end none)
PROGRESS = re.compile(r"iter (\d+)  steps (\d+)(?:  return (-?\d+\.\d\d))?$", re.M)
TUNE_SCRIPT = """
import time
from ray import tune

def trainable(config):
    for i in range(3):
        time.sleep(1)
        tune.report({"score": (i + 1) * config["k"], "loss": 1.0 / (i + 1)})

grid = tune.Tuner(trainable, param_space={"k": tune.grid_search([1, 2])}).fit()
print("best score", grid.get_best_result(metric="score", mode="max").metrics["score"])
"""


def submit_as_a_user(
    inventory: str, results: Path, script: Path, *args: str, flags: tuple[str, ...] = ()
) -> tuple[int, str]:
    """`provisioner submit` as a user runs it, its output a pipe (not a terminal): the
    exit code and everything it showed (stdout, then stderr)."""
    command = [sys.executable, "-m", "provisioner", "submit", "-i", inventory]
    command += ["--results", str(results), *flags, str(script), "--", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr


def tune_results_home(home: Path) -> list[Any]:
    """Every result Tune wrote for the job's trials: their result.json, in Tune's folder
    as it came home from the storage every node shares (results/JOB/ray_results/EXP/)."""
    found = sorted(home.glob("ray_results/*/*/result.json"))
    assert found, sorted(str(p.relative_to(home)) for p in home.rglob("*"))[:50]
    lines = [line for path in found for line in path.read_text().splitlines()]
    return [json.loads(line) for line in lines if line.strip()]


def test_an_unchanged_rllib_example_shows_its_progress_and_prints_not_rays_noise(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    spec = importlib.util.find_spec("ray")
    assert spec is not None and spec.origin is not None
    book = tmp_path / "book"
    book.mkdir()
    script = Path(shutil.copy(Path(spec.origin).parent / RLLIB_EXAMPLE, book))
    code, shown = submit_as_a_user(inventory, tmp_path / "r", script, *RLLIB_ARGS)
    assert code == 0 and "SUCCEEDED" in shown, shown[-3000:]
    (home,) = (tmp_path / "r").iterdir()
    results = tune_results_home(home)
    returns = [r["env_runners"].get("episode_return_mean") for r in results]
    written = {
        (r["training_iteration"], r["num_env_steps_sampled_lifetime"],
         "" if ret is None else f"{ret:.2f}")
        for r, ret in zip(results, returns, strict=True)
    }  # fmt: skip
    progress = {(int(i), int(s), r) for i, s, r in PROGRESS.findall(shown)}
    assert progress and progress <= written, (progress, written, shown[-3000:])
    assert "`env_runners/episode_return_mean` of -1000.0 reached! ok" in shown  # its own
    assert "DeprecationWarning" not in shown and "(PPO pid=" not in shown, shown[-3000:]
    assert "\x1b" not in shown and "x1b" not in shown
    # positive control: the noise is there (--verbose shows it: the test above)
    kept = (home / "job.log").read_text()
    assert "DeprecationWarning" in kept and "(PPO pid=" in kept  # job.log keeps every line,
    assert "\x1b" not in kept  # without Ray's colours


def test_a_tune_trainables_trials_and_metrics_are_its_progress(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    book = tmp_path / "book"
    book.mkdir()
    (book / "tune_grid.py").write_text(TUNE_SCRIPT)
    code, shown = submit_as_a_user(inventory, tmp_path / "r", book / "tune_grid.py")
    assert code == 0 and "best score 6" in shown, shown[-3000:]
    (home,) = (tmp_path / "r").iterdir()
    written = {(r["training_iteration"], r["score"], r["loss"]) for r in tune_results_home(home)}
    lines = re.findall(r"trial ([12])/2  iter (\d)  score (\d)  loss ([\d.]+)", shown)
    assert lines, shown[-3000:]
    assert {(int(i), int(s), round(float(x), 4)) for _, i, s, x in lines} <= {
        (i, s, round(x, 4)) for i, s, x in written
    }
    assert "Trial status:" not in shown  # Tune's tables: under --verbose


# --- an experiment file (issue 45): validated before anything is sent, run through Tune,
# its file and resolved config kept with its results

EXPERIMENT = """\
# CartPole PPO in the tuned example's shape, stopped early (CI time)
cartpole-ppo:
    env: CartPole-v1
    run: PPO
    stop: {training_iteration: 2}
    config:
        lr: 0.0003
        num_epochs: 2
        minibatch_size: 128
        train_batch_size_per_learner: 500
    seeds: [3]
    checkpoint_frequency: 1
    resources: {env_runners: 2}
"""


def without_facts(inventory: str, tmp_path: Path) -> Path:
    """A copy of the inventory (beside it: its relative paths hold) whose pin names no
    experiment facts, as a pin built before them."""
    import yaml

    from provisioner.image.pin import pin_from_dict, pin_to_dict, write_pin

    source = Path(inventory)
    doc = yaml.safe_load(source.read_text())
    pin_path = Path(doc["image"]["lock"])
    data = json.loads(pin_path.read_text())
    assert "facts" in data.get("extra", {}), data  # the build kept them: the control
    data["extra"].pop("facts")
    older = tmp_path / "older.lock.json"
    write_pin(pin_from_dict(data, str(pin_path)), older)
    assert "facts" not in pin_to_dict(pin_from_dict(data, str(pin_path))).get("extra", {})
    doc["image"]["lock"] = str(older)
    copy = source.with_name(f".{source.stem}-older-pin.yaml")
    copy.write_text(yaml.safe_dump(doc, sort_keys=False))
    return copy


def test_an_experiment_file_runs_through_tune_and_keeps_its_file_and_config(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """A bad file (an old-stack key) exits 2 naming its line with nothing submitted (its
    facts captured on the head: the pin is older than them); the tuned-example CartPole
    PPO file succeeds through Tune: result.json home, experiment.yaml and config.json
    home as sent and resolved (config.json is what the trial ran, key for key); `jobs
    list` shows the good job and none of the bad file; the kept file is submitted again."""
    book = tmp_path / "book"
    book.mkdir()
    good, bad = book / "cartpole-ppo.yaml", book / "old-keys.yaml"
    good.write_text(EXPERIMENT)
    bad.write_text(EXPERIMENT.replace("num_epochs: 2", "num_sgd_iter: 2"))
    older = without_facts(inventory, tmp_path)
    try:
        code, shown = submit_as_a_user(str(older), tmp_path / "bad", bad)
    finally:
        older.unlink()
    assert code == 2, shown[-3000:]
    assert f"{bad}:8" in shown and "num_sgd_iter" in shown and "num_epochs" in shown, shown
    assert "capturing them on the head" in shown and "Traceback" not in shown, shown
    assert not (tmp_path / "bad").exists()

    code, shown = submit_as_a_user(inventory, tmp_path / "r", good)
    assert code == 0 and "SUCCEEDED" in shown, shown[-3000:]
    assert "capturing them on the head" not in shown  # the pin's own facts
    (home,) = (tmp_path / "r").iterdir()
    assert home.name.startswith("cartpole-ppo-")
    results = tune_results_home(home)
    assert max(r["training_iteration"] for r in results) == 2, results[-1]
    assert (home / "experiment.yaml").read_text() == EXPERIMENT
    config = json.loads((home / "config.json").read_text())
    ran = results[-1]["config"]  # the trial's config, as Tune recorded it
    assert config["seed"] == ran["seed"] == 3
    # every number and switch (a class is written by name here, by repr in Tune's file)
    numbers = {k: v for k, v in config.items() if isinstance(v, int | float | bool)}
    assert len(numbers) > 100 and numbers["_train_batch_size_per_learner"] == 500
    differ = {k: (v, ran.get(k)) for k, v in numbers.items() if v != ran.get(k)}
    assert not differ, differ
    assert config["env"] == ran["env"] == "CartPole-v1" and config["lr"] == 0.0003
    (trial,) = {p.parent for p in home.glob("ray_results/cartpole-ppo/*/result.json")}
    assert sorted(p.name for p in trial.glob("checkpoint_*")), sorted(os.listdir(trial))
    submitted = json.loads((home / "submitted.json").read_text())
    assert submitted["playbook"] == "cartpole-ppo.yaml" and submitted["runner"]

    code, listed, err = cli_json("jobs", "list", "-i", inventory)
    assert code == 0, err[-2000:]
    names = {j["job_id"]: j["playbook"] for j in listed["jobs"]}
    assert names.get(home.name) == "cartpole-ppo.yaml", names  # the positive control
    assert "old-keys.yaml" not in names.values(), names
    # its one trial's latest figures, kept on the head by the job's Tune watcher
    row = {j["job_id"]: j for j in listed["jobs"]}[home.name]
    assert row["progress"]["iteration"] == 2 and row["progress"]["env_steps"] > 0, row

    # repeated from its results: the kept file, alone, validated and running again
    code, out, err = cli_json(
        "submit", "-i", inventory, "--results", str(tmp_path / "again"), "--detach",
        str(home / "experiment.yaml"),
    )  # fmt: skip
    assert code == 0, err[-3000:]
    again = out["job_id"]
    try:
        assert again.startswith("cartpole-ppo-") and again != home.name
        assert out["upload"]["files"] == 1, out["upload"]
        deadline = time.monotonic() + 180
        log = ""
        while "provisioner: experiment cartpole-ppo" not in log and time.monotonic() < deadline:
            time.sleep(2)
            log = cli("jobs", "logs", again, "-i", inventory)[1]
        assert "provisioner: experiment cartpole-ppo (experiment.yaml): PPO" in log, log[-2000:]
    finally:
        cli("jobs", "stop", again, "-i", inventory)
    kept = tmp_path / "again" / again
    assert (kept / "experiment.yaml").read_text() == EXPERIMENT
    assert json.loads((kept / "config.json").read_text()) == config


SEEDS = EXPERIMENT.replace("seeds: [3]", "seeds: [1, 2, 3]").replace(
    "cartpole-ppo:", "cartpole-seeds:"
)


def ffprobe(video: Path) -> dict[str, Any]:
    """What ffprobe (the reference decoder) reads of the video's first stream, frames
    counted by decoding them."""
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-select_streams", "v:0", "-show_entries",
         "stream=codec_name,width,height,nb_read_frames", "-of", "json", str(video)],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    (stream,) = json.loads(done.stdout)["streams"]
    return dict(stream)


def test_three_seeds_are_compared_and_the_best_checkpoint_evaluated_with_a_video(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """Three seeds of one experiment file: `compare` draws them as one group (n=3, its
    figures from the trials' own result.json); `eval` restores the best trial's last
    checkpoint on the cluster with RLlib's Algorithm.from_checkpoint, runs 20 episodes on its
    env runners and records one as MP4: eval.json and episodes.csv agree, the training return
    it names is the trial's own at the restored iteration, and ffprobe decodes the video with
    the frames the episode had (the reset's, then one per step)."""
    book = tmp_path / "book"
    book.mkdir()
    (book / "cartpole-seeds.yaml").write_text(SEEDS)
    results = tmp_path / "r"
    code, shown = submit_as_a_user(inventory, results, book / "cartpole-seeds.yaml")
    assert code == 0 and "SUCCEEDED" in shown, shown[-3000:]
    (home,) = results.iterdir()
    trials = sorted(home.glob("ray_results/cartpole-seeds/*/result.json"))
    assert len(trials) == 3, sorted(str(p) for p in home.rglob("*"))[:40]
    submitted = json.loads((home / "submitted.json").read_text())
    assert submitted["nodes"] == len(lab.nodes)

    png = tmp_path / "compare.png"
    code, doc, err = cli_json("compare", "--results", str(results), home.name, "-o", str(png))
    assert code == 0, err[-3000:]
    (group,) = doc["groups"]
    assert sorted(group["seeds"]) == [1, 2, 3] and group["final_return"]["n"] == 3
    finals = []
    for path in trials:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        finals.append(rows[-1]["env_runners"]["episode_return_mean"])
    assert abs(group["final_return"]["mean"] - sum(finals) / 3) < 1e-9
    assert group["node_hours"] and group["node_hours"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    code, doc, err = cli_json(
        "eval", "-i", inventory, "--results", str(results), home.name,
        "--episodes", "20", "--video", "1",
    )  # fmt: skip
    assert code == 0, (err[-3000:], doc.get("log_tail"))
    (evaluated,) = home.glob("eval-*/eval.json")
    figures = json.loads(evaluated.read_text())
    assert doc["eval"] == figures
    assert figures["episodes"] == 20 and figures["algorithm"] == "PPO"
    assert figures["env"] == "CartPole-v1" and figures["explore"] is False
    with (evaluated.parent / "episodes.csv").open() as f:
        episodes = list(csv.DictReader(f))
    returns = [float(e["return"]) for e in episodes]
    assert len(returns) == 20 and abs(figures["mean"] - sum(returns) / 20) < 1e-9
    cluster = {ray_address(n) for n in lab.nodes}
    assert set(figures["nodes"]) <= cluster and figures["nodes"], figures["nodes"]
    # the checkpoint of the best trial (its last return), taken at its last iteration
    best = max(range(3), key=lambda i: finals[i])
    rows = [json.loads(line) for line in trials[best].read_text().splitlines() if line.strip()]
    assert figures["checkpoint"].startswith(
        f"ray_results/cartpole-seeds/{trials[best].parent.name}/"
    )
    assert figures["training_iteration"] == rows[-1]["training_iteration"] == 2
    assert figures["training_return"] == rows[-1]["env_runners"]["episode_return_mean"]
    (video,) = figures["videos"]
    path = evaluated.parent / video["file"]
    probed = ffprobe(path)
    assert probed["codec_name"] == "h264" and (probed["width"], probed["height"]) == (600, 400)
    assert int(probed["nb_read_frames"]) == video["frames"] == video["length"] + 1, probed


HUMANOID = """\
# MuJoCo's humanoid (the thesis's PyBullet humanoid's MuJoCo counterpart), a few iterations
humanoid-ppo:
    env: Humanoid-v5
    run: PPO
    stop: {training_iteration: 2}
    config:
        num_epochs: 1
        minibatch_size: 128
        train_batch_size_per_learner: 400
    seeds: [0]
    checkpoint_frequency: 1
    resources: {env_runners: 2}
    evaluation: {episodes: 2, video: 1}
"""


def test_a_mujoco_humanoid_trains_and_its_evaluation_is_recorded_headless(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """MuJoCo's Humanoid-v5 (continuous actions, 17 of them) from an experiment file trains
    two iterations on the cluster; the file's `evaluation:` then evaluates its checkpoint,
    rendering the humanoid through OSMesa in the head's container (no display, no GPU): an
    MP4 ffprobe decodes, one frame per step and the reset's, and a return that is the
    episode's."""
    book = tmp_path / "book"
    book.mkdir()
    (book / "humanoid-ppo.yaml").write_text(HUMANOID)
    results = tmp_path / "r"
    code, doc, err = cli_json(
        "submit", "-i", inventory, "--results", str(results), str(book / "humanoid-ppo.yaml")
    )
    assert code == 0 and doc["status"] == "SUCCEEDED", (err[-3000:], doc.get("log_tail"))
    home = results / doc["job_id"]
    rows = tune_results_home(home)
    assert max(r["training_iteration"] for r in rows) == 2
    assert rows[-1]["config"]["env"] == "Humanoid-v5"
    assert doc["evaluation"]["status"] == "SUCCEEDED", doc["evaluation"]
    (evaluated,) = home.glob("eval-*/eval.json")
    figures = json.loads(evaluated.read_text())
    assert doc["evaluation"]["eval"] == figures
    assert figures["env"] == "Humanoid-v5" and figures["episodes"] == 2
    assert figures["video_error"] is None
    (video,) = figures["videos"]
    probed = ffprobe(evaluated.parent / video["file"])
    assert probed["codec_name"] == "h264" and (probed["width"], probed["height"]) == (480, 480)
    assert int(probed["nb_read_frames"]) == video["frames"] == video["length"] + 1, probed
    # Humanoid-v5 pays 5 for each step it stays up (not the last, where it falls), less a
    # little for its controls: the return is about 5 per step
    assert 4 * (video["length"] - 1) <= video["return"] <= 6 * video["length"], video


# RLlib's other new-stack algorithms, each from a file, stopped once its learner trained
# (APPO's and IMPALA's first iterations may end before their env runner's first samples
# come: they do not wait for them); their defaults shortened: an iteration's minimum time,
# the steps before learning
ALGORITHMS = {
    "appo-cartpole": """\
appo-cartpole:
    env: CartPole-v1
    run: APPO
    stop: {learners/__all_modules__/num_env_steps_trained_lifetime: 1, training_iteration: 30}
    config: {min_time_s_per_iteration: 2}
    checkpoint_frequency: 1
    resources: {env_runners: 1}
""",
    "impala-cartpole": """\
impala-cartpole:
    env: CartPole-v1
    run: IMPALA
    stop: {learners/__all_modules__/num_env_steps_trained_lifetime: 1, training_iteration: 30}
    config: {min_time_s_per_iteration: 2}
    checkpoint_frequency: 1
    resources: {env_runners: 1}
""",
    "dqn-cartpole": """\
dqn-cartpole:
    env: CartPole-v1
    run: DQN
    stop: {learners/__all_modules__/num_env_steps_trained_lifetime: 1, training_iteration: 30}
    config:
        num_steps_sampled_before_learning_starts: 200
        min_sample_timesteps_per_iteration: 400
    checkpoint_frequency: 1
    resources: {env_runners: 0}
""",
    "sac-pendulum": """\
sac-pendulum:
    env: Pendulum-v1
    run: SAC
    stop: {learners/__all_modules__/num_env_steps_trained_lifetime: 1, training_iteration: 30}
    config:
        num_steps_sampled_before_learning_starts: 50
        model_config: {fcnet_hiddens: [64, 64]}
    checkpoint_frequency: 1
    resources: {env_runners: 0}
""",
}


def losses(result: dict[str, Any]) -> dict[str, float]:
    """The learner's losses in one of Tune's results (RLlib's `learners/default_policy`)."""
    learned = (result.get("learners") or {}).get("default_policy") or {}
    return {k: v for k, v in learned.items() if "loss" in k and isinstance(v, int | float)}


def test_appo_impala_dqn_and_sac_each_train_from_a_file_at_once(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """Four experiment files submitted at once, as from four terminals (their 6 CPUs are
    the cluster's): APPO, IMPALA and DQN on CartPole (discrete actions), SAC on Pendulum
    (continuous, with its model's layers from `model_config`). Each SUCCEEDED; Tune's
    results home say its algorithm sampled and its learner trained (the file's stop,
    reached before its iteration bound; the learner's losses); its checkpoint is home;
    the file kept is the one sent."""
    book = tmp_path / "book"
    book.mkdir()
    running = {}
    for name, text in ALGORITHMS.items():
        (book / f"{name}.yaml").write_text(text)
        command = [sys.executable, "-m", "provisioner", "submit", "-i", inventory, "--json"]
        command += ["--results", str(tmp_path / name), str(book / f"{name}.yaml")]
        running[name] = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    done = {name: proc.communicate(timeout=600) for name, proc in running.items()}
    for name, (out, err) in done.items():
        assert running[name].returncode == 0, (name, err[-3000:])
        doc = json.loads(out)
        assert doc["status"] == "SUCCEEDED", (name, doc.get("log_tail"))
        home = tmp_path / name / doc["job_id"]
        rows = tune_results_home(home)
        last = max(rows, key=lambda r: r["training_iteration"])
        trained = last["learners"]["__all_modules__"]["num_env_steps_trained_lifetime"]
        assert trained >= 1 and last["training_iteration"] < 30, (name, trained)
        algorithm = ALGORITHMS[name].split("run: ")[1].split("\n")[0]
        assert last["config"]["env"] in ("CartPole-v1", "Pendulum-v1"), last["config"]
        assert last["num_env_steps_sampled_lifetime"] > 0, (name, last)
        assert losses(last), (name, sorted(last.get("learners", {}).get("default_policy", {})))
        config = json.loads((home / "config.json").read_text())
        assert config["env"] == last["config"]["env"]
        kept = (home / "experiment.yaml").read_text()
        assert kept == ALGORITHMS[name] and f"run: {algorithm}" in kept
        checkpoints = list(home.glob(f"ray_results/{name}/*/checkpoint_*/rllib_checkpoint.json"))
        assert checkpoints, sorted(str(p.relative_to(home)) for p in home.rglob("*"))[:40]
    sac = json.loads((next((tmp_path / "sac-pendulum").iterdir()) / "config.json").read_text())
    assert sac["_model_config"] == {"fcnet_hiddens": [64, 64]}
