"""`provisioner eval`'s local side (pure logic over the files home): which checkpoint of a
run is evaluated, the training returns handed to the runner, the job it becomes, bad input;
and the runner's own figures (mean, std, Student-t interval; episodes over env runners).

What an RLlib checkpoint is here is what RLlib 2.60's `Algorithm.save_to_path` writes
(rllib_checkpoint.json and algorithm_state.pkl in its folder, its components below); the
end-to-end test restores a real one on the lab."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.experiment import eval_runner
from provisioner.jobs.evaluate import (
    CHECKPOINT_DIR,
    RUNNER_NAME,
    checkpoints_under,
    eval_spec,
    find_checkpoint,
    returns_by_iteration,
)
from tests.cli import cli


def checkpoint(folder: Path) -> Path:
    """A folder laid out as RLlib's Algorithm.save_to_path lays one out."""
    for rel in (
        "rllib_checkpoint.json",
        "algorithm_state.pkl",
        "class_and_ctor_args.pkl",
        "env_runner/state.pkl",
        "env_runner/metadata.json",
        "learner_group/learner/rl_module/default_policy/module_state.pkl",
        "learner_group/learner/rl_module/default_policy/metadata.json",
    ):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text("x")
    return folder


def trial(root: Path, name: str, returns: list[float], checkpoints: list[int]) -> Path:
    """A Tune trial folder: result.json (RLlib's new-stack keys) and checkpoint_NNNNNN/."""
    folder = root / name
    folder.mkdir(parents=True)
    rows = [
        {"training_iteration": i + 1, "env_runners": {"episode_return_mean": r}}
        for i, r in enumerate(returns)
    ]
    (folder / "result.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for index in checkpoints:
        checkpoint(folder / f"checkpoint_{index:06d}")
    return folder


def test_the_latest_checkpoint_of_the_best_trial(tmp_path: Path) -> None:
    tune = tmp_path / "results" / "sweep" / "ray_results" / "cartpole"
    trial(tune, "PPO_0_seed=1", [20, 80, 150], [0, 1, 2])
    trial(tune, "PPO_1_seed=2", [20, 90, 200], [0, 1, 2])
    trial(tune, "PPO_2_seed=3", [20, 40, 60], [0, 1, 2])
    found = find_checkpoint("sweep", tmp_path / "results")
    assert found.label == "ray_results/cartpole/PPO_1_seed=2/checkpoint_000002"
    assert found.trials == 3 and found.home == tmp_path / "results" / "sweep"
    assert found.training_return == 200  # the trial's last: the runner corrects it by iteration
    assert found.by_iteration == {1: 20, 2: 90, 3: 200}


def test_a_checkpoint_folder_given_as_a_path(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "elsewhere" / "my-ckpt")
    found = find_checkpoint(str(ckpt), tmp_path / "results")
    assert found.checkpoint == ckpt and found.label == "."
    assert found.home == tmp_path / "results" / "my-ckpt"
    assert found.training_return is None and found.by_iteration == {}


def test_a_checkpoints_components_are_not_checkpoints(tmp_path: Path) -> None:
    ckpt = checkpoint(tmp_path / "c")
    assert checkpoints_under(tmp_path) == [ckpt]


def test_a_playbooks_checkpoint_and_its_metrics_row(tmp_path: Path) -> None:
    home = tmp_path / "results" / "ppo-1"
    home.mkdir(parents=True)
    (home / "metrics.csv").write_text(
        "iteration,env_steps,episode_return_mean,time_s,env_steps_per_s\n"
        "1,1000,20.5,1.0,1000\n2,2000,60.0,2.0,1000\n3,3000,150.0,3.0,1000\n"
    )
    checkpoint(home / "checkpoints" / "iter-000002")
    checkpoint(home / "checkpoints" / "iter-000003")
    found = find_checkpoint("ppo-1", tmp_path / "results")
    assert found.label == "checkpoints/iter-000003" and found.training_return == 150.0
    assert returns_by_iteration(home / "checkpoints" / "iter-000002") == {
        1: 20.5,
        2: 60.0,
        3: 150.0,
    }


def test_no_run_and_no_checkpoint_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError) as caught:
        find_checkpoint("nope", tmp_path / "results")
    assert "no run or checkpoint 'nope'" in str(caught.value) and caught.value.exit_code == 2
    (tmp_path / "results" / "ppo-2").mkdir(parents=True)
    (tmp_path / "results" / "ppo-2" / "metrics.csv").write_text("iteration\n1\n")
    with pytest.raises(InputError) as caught:
        find_checkpoint("ppo-2", tmp_path / "results")
    assert "no RLlib checkpoint under" in str(caught.value)
    assert "checkpoint_frequency" in caught.value.fix


def test_the_eval_job_carries_the_checkpoint_and_the_runner(tmp_path: Path) -> None:
    tune = tmp_path / "results" / "run" / "ray_results" / "x"
    trial(tune, "PPO_0", [10, 30], [0])
    found = find_checkpoint("run", tmp_path / "results")
    work = tmp_path / "work"
    work.mkdir()
    spec = eval_spec(found, 20, 2, work)
    assert spec.playbook == work / RUNNER_NAME and spec.working_dir == work
    assert (work / CHECKPOINT_DIR / "rllib_checkpoint.json").is_file()
    assert (work / RUNNER_NAME).read_bytes() == Path(eval_runner.__file__).read_bytes()
    assert spec.job_id.startswith("eval-")
    (arg,) = spec.args
    body = json.loads(arg)
    assert body["episodes"] == 20 and body["video"] == 2 and body["checkpoint"] == "checkpoint"
    assert body["returns_by_iteration"] == {"1": 10, "2": 30}
    assert body["source_checkpoint"] == "ray_results/x/PPO_0/checkpoint_000000"


@pytest.mark.parametrize(
    ("episodes", "video", "said"), [(0, 0, "--episodes 0"), (5, -1, "--video -1")]
)
def test_bad_counts_exit_2(tmp_path: Path, episodes: int, video: int, said: str) -> None:
    checkpoint(tmp_path / "ck")
    done = cli("eval", str(tmp_path / "ck"), "--episodes", str(episodes), "--video", str(video))
    assert done.exit_code == 2 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stdout + done.stderr


def test_eval_of_nothing_home_exits_2(tmp_path: Path) -> None:
    done = cli("eval", "--results", str(tmp_path), "missing-job")
    assert done.exit_code == 2 and "no run or checkpoint" in done.stderr


# --- the runner's pure parts (it runs with the cluster's Python) ------------------------------


def test_the_runners_figures() -> None:
    found = eval_runner.figures([10.0, 12.0, 14.0])
    assert found["mean"] == 12.0 and found["std"] == 2.0 and found["episodes"] == 3
    half = 4.303 * 2.0 / math.sqrt(3)
    assert math.isclose(found["ci95_half_width"], half)
    assert found["ci95"] == [12.0 - found["ci95_half_width"], 12.0 + found["ci95_half_width"]]
    one = eval_runner.figures([7.0])
    assert one["std"] == 0.0 and one["ci95"] is None


def test_episodes_are_spread_over_the_runners() -> None:
    assert eval_runner.split(20, 3) == [7, 7, 6]
    assert eval_runner.split(2, 4) == [1, 1, 0, 0]
    assert sum(eval_runner.split(101, 7)) == 101
