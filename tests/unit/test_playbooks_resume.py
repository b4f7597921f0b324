"""Resume on real RLlib (a local Ray, no lab): the learning goes on, not only the counters.

The cluster's condition is made here on purpose: RLlib's own restore sends the restored
weights to remote env runners fire-and-forget, and its actor manager drops that call while
an earlier one with the same tag is still in flight. On a cluster the setup-time weight
sync is often still in flight (it fetches the weights from another node); on one machine
it is done in milliseconds. So each test leaves a slow call with that tag in flight, as a
remote runner would, and then resumes.

The positive control: without the playbooks' hand-over, the resumed run samples with a
fresh policy, and its first return is the fresh run's first return again.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "playbooks"))

import rlrun

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
ARGS = ["--env-runners", "2", "--train-batch", "1000", "--checkpoint-every", "6"]


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    import ray  # the dev install has the training stack

    for tries_left in (1, 0):  # Ray gives its raylet 30 s to register: a loaded machine may not
        try:
            ray.init(
                num_cpus=3,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": str(PLAYBOOKS)}},
            )
            break
        except Exception as exc:
            ray.shutdown()
            if not tries_left or "timed out during startup" not in str(exc):
                raise
    yield
    ray.shutdown()


@pytest.fixture
def rllib_drops_its_restore_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.rllib.algorithms.algorithm import Algorithm

    restore = Algorithm.restore_from_path

    def as_on_a_cluster(self: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        manager = self.env_runner_group._worker_manager
        manager.fetch_ready_async_reqs(tags="set_state", timeout_seconds=30)
        sent = self.env_runner_group.foreach_env_runner_async(
            lambda runner: time.sleep(3), tag="set_state"
        )
        assert sent == 2  # one slow call in flight on each runner
        return restore(self, path, *args, **kwargs)

    monkeypatch.setattr(Algorithm, "restore_from_path", as_on_a_cluster)


def train(results: Path, *extra: str) -> dict[str, Any]:
    p = rlrun.parser("test", target_return=1e9, max_env_steps=10**7)
    args = p.parse_args([*ARGS, "--results", str(results), *extra])
    budget = rlrun.Budget(args.target_return, args.max_env_steps, args.max_iterations)
    config = rlrun.ppo_config(args, "CartPole-v1")
    return rlrun.train(config, budget, results, rlrun.saving_of(args))


def returns(results: Path) -> dict[int, float]:
    return {r.iteration: r.episode_return_mean for r in rlrun.read_rows(results / "metrics.csv")}


@pytest.fixture(scope="module")
def trained(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six iterations of PPO on CartPole, checkpointed at the sixth."""
    results = tmp_path_factory.mktemp("trained")
    train(results, "--max-iterations", "6")
    got = returns(results)
    assert got[6] > 3 * got[1], got  # it learned: a fresh policy is far below
    return results


def resume(trained: Path, into: Path, *extra: str) -> dict[int, float]:
    into.mkdir(exist_ok=True)
    for name in ("metrics.csv", "checkpoints"):
        src = trained / name
        dest = into / name
        if src.is_dir():
            import shutil

            shutil.copytree(src, dest)
        else:
            dest.write_bytes(src.read_bytes())
    train(into, "--max-iterations", "8", "--resume-from", "checkpoints/iter-000006", *extra)
    return returns(into)


def test_resumed_learning_goes_on_when_rllib_drops_its_own_weight_sync(
    trained: Path, tmp_path: Path, rllib_drops_its_restore_sync: None, capsys: Any
) -> None:
    got = resume(trained, tmp_path)
    before = returns(trained)
    assert got[7] > 0.5 * before[6] and got[7] > 3 * before[1], (before, got)
    out = capsys.readouterr().out
    assert "the restored weights verified on 2 env runner(s)" in out
    assert "random state restored (2 of 2 runner(s)" in out


def test_without_the_hand_over_the_resumed_run_samples_a_fresh_policy(
    trained: Path,
    tmp_path: Path,
    rllib_drops_its_restore_sync: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The positive control: what users saw before the hand-over."""
    monkeypatch.setattr(rlrun, "hand_over", lambda algo, checkpoint: 0)
    monkeypatch.setattr(rlrun, "restore_rng", lambda algo, checkpoint, seed: "untouched")
    got = resume(trained, tmp_path)
    before = returns(trained)
    assert got[7] < 2 * before[1], (before, got)  # a fresh policy's return
    assert got[7] == pytest.approx(before[1])  # and its very episodes: the RNG replayed


def test_a_checkpoint_carries_every_runners_random_state(trained: Path) -> None:
    saved = json.loads((trained / "checkpoints" / "iter-000006" / rlrun.RNG_FILE).read_text())
    assert sorted(saved["runners"]) == ["1", "2"]
    for state in saved["runners"].values():
        assert {"python", "numpy", "torch", "envs"} <= set(state) and state["envs"]
    assert saved["runners"]["1"] != saved["runners"]["2"]


def test_digest_is_the_same_for_a_tensor_and_its_array_and_differs_on_a_change() -> None:
    import numpy as np
    import torch

    weights = {"b": np.arange(3, dtype=np.float32), "a": {"w": np.ones((2, 2))}}
    as_tensors = {"a": {"w": torch.ones((2, 2))}, "b": torch.arange(3, dtype=torch.float32)}
    assert rlrun.digest(weights) == rlrun.digest(as_tensors)
    changed = {"b": np.arange(3, dtype=np.float32), "a": {"w": np.ones((2, 2)) * 1.0001}}
    assert rlrun.digest(weights) != rlrun.digest(changed)


def test_the_random_state_of_a_process_goes_through_json_and_back() -> None:
    import random

    import numpy as np

    random.seed(1)
    np.random.seed(1)
    saved = json.loads(json.dumps(rlrun._rng_of_process()))
    first = (random.random(), float(np.random.rand()))
    random.seed(2)
    np.random.seed(2)
    rlrun._set_rng_of_process(saved)
    assert (random.random(), float(np.random.rand())) == first


def test_the_cells_playbook_resumes_its_learning_too(
    local_ray: None, tmp_path: Path, rllib_drops_its_restore_sync: None
) -> None:
    """ppo_cells.py (this project's own environment, with an observation filter) goes
    through the same restore: after the resume its runners act with the trained policy."""
    import ppo_cells
    from cell_network import CellNetwork

    def cells(results: Path, *extra: str) -> dict[int, float]:
        p = rlrun.parser("test", target_return=1e9, max_env_steps=10**7)
        p.set_defaults(lr=1e-3, gamma=0.5)
        args = p.parse_args([*ARGS, "--obs-filter", "--results", str(results), *extra])
        args.cells, args.users, args.horizon = 4, 4, 50
        budget = rlrun.Budget(args.target_return, args.max_env_steps, args.max_iterations)
        rlrun.train(ppo_cells.config(args), budget, results, rlrun.saving_of(args))
        return returns(results)

    assert CellNetwork is not None
    first = tmp_path / "first"
    before = cells(first, "--max-iterations", "6")
    assert before[6] > before[1] + 0.2 * abs(before[1]), before  # it learned
    again = tmp_path / "again"
    again.mkdir()
    import shutil

    shutil.copytree(first / "checkpoints", again / "checkpoints")
    (again / "metrics.csv").write_bytes((first / "metrics.csv").read_bytes())
    got = cells(again, "--max-iterations", "7", "--resume-from", "checkpoints/iter-000006")
    # nearer the trained policy's return than a fresh one's
    assert abs(got[7] - before[6]) < abs(got[7] - before[1]), (before, got)


def test_a_remote_learner_resumes_its_learning_too(
    local_ray: None, tmp_path: Path, rllib_drops_its_restore_sync: None, capsys: Any
) -> None:
    """A learner in its own actor, as a GPU learner is (`--num-learners 1`, here on CPU:
    the GPU's part is the device, not the path the weights take on a resume)."""
    first = tmp_path / "first"
    train(first, "--max-iterations", "6", "--num-learners", "1")
    before = returns(first)
    assert before[6] > 3 * before[1], before  # it learned
    assert "the restored weights verified" not in capsys.readouterr().out
    got = resume(first, tmp_path / "again", "--num-learners", "1")
    assert got[7] > 0.5 * before[6] and got[7] > 3 * before[1], (before, got)
    assert "the restored weights verified on 2 env runner(s)" in capsys.readouterr().out


def test_a_resume_gives_the_learner_back_ppos_kl_coefficient(
    local_ray: None, tmp_path: Path, rllib_drops_its_restore_sync: None, capsys: Any
) -> None:
    """PPO adapts its KL coefficient after each update whose KL leaves [0.5, 2] x its
    target; RLlib's learner state leaves it out, so a plain restore starts again from the
    config's value (0.2). A large learning rate moves it within a few iterations."""
    first = tmp_path / "first"
    train(first, "--max-iterations", "3", "--lr", "0.01", "--checkpoint-every", "3")
    saved = json.loads((first / "checkpoints" / "iter-000003" / rlrun.LEARNER_FILE).read_text())
    (coeff,) = saved["kl_coeffs"].values()
    assert coeff != pytest.approx(0.2), saved  # it moved: the restore has something to do
    capsys.readouterr()
    p = rlrun.parser("test", target_return=1e9, max_env_steps=10**7)
    again = ["--lr", "0.01", "--max-iterations", "4", "--resume-from", "checkpoints/iter-000003"]
    args = p.parse_args([*ARGS, "--results", str(first), *again])
    budget = rlrun.Budget(args.target_return, args.max_env_steps, args.max_iterations)
    rlrun.train(rlrun.ppo_config(args, "CartPole-v1"), budget, first, rlrun.saving_of(args))
    out = capsys.readouterr().out
    assert f"KL coefficient {coeff:.4g}" in out, out[-2000:]


def adam_of(learner_state: dict[str, Any]) -> dict[int, tuple[float, Any, Any]]:
    """The learner's Adam state per parameter: (step count, first moment, second moment)."""
    from ray.rllib.core import COMPONENT_OPTIMIZER

    (optimizer,) = learner_state[COMPONENT_OPTIMIZER].values()  # one module, one optimizer
    return {
        int(i): (float(s["step"]), s["exp_avg"], s["exp_avg_sq"])
        for i, s in optimizer["state"]["state"].items()
    }


def learner_state_of(algo: Any) -> dict[str, Any]:
    from ray.rllib.core import COMPONENT_LEARNER

    state: dict[str, Any] = algo.learner_group.get_state()[COMPONENT_LEARNER]
    return state


@pytest.mark.parametrize("learners", ["0", "1"], ids=["driver_learner", "remote_learner"])
def test_a_resume_gives_the_learner_back_its_optimizer_state(
    trained: Path,
    tmp_path: Path,
    rllib_drops_its_restore_sync: None,
    monkeypatch: pytest.MonkeyPatch,
    learners: str,
) -> None:
    """Adam's step count and moments, as the learner holds them when training goes on
    after a resume, are the ones saved with the checkpoint: the updates after the resume
    are the run's next updates, not a fresh optimizer's first. With the driver's own
    learner and with a remote one (as a GPU learner is: `--num-learners 1`)."""
    import pickle

    import numpy as np

    saved_file = trained / "checkpoints" / "iter-000006" / "learner_group" / "learner"
    saved = adam_of(pickle.loads((saved_file / "state.pkl").read_bytes()))
    assert saved and all(step > 0 for step, _, _ in saved.values())  # it has trained

    held: list[dict[str, Any]] = []
    where = rlrun.runner_nodes

    def after_the_restore(algo: Any) -> list[dict[str, Any]]:  # just before training goes on
        held.append(learner_state_of(algo))
        return where(algo)

    monkeypatch.setattr(rlrun, "runner_nodes", after_the_restore)
    into = tmp_path / "again"
    into.mkdir()
    shutil.copytree(trained / "checkpoints", into / "checkpoints")
    (into / "metrics.csv").write_bytes((trained / "metrics.csv").read_bytes())
    # stops at once (the budget is the checkpoint's iteration): the state as restored
    train(into, "--max-iterations", "6", "--num-learners", learners,
          "--resume-from", "checkpoints/iter-000006")  # fmt: skip
    (resumed,) = held
    got = adam_of(resumed)
    assert sorted(got) == sorted(saved)
    for i, (step, first, second) in saved.items():
        assert got[i][0] == step, (i, got[i][0], step)
        assert np.array_equal(got[i][1], first) and np.array_equal(got[i][2], second), i

    # The positive control: a fresh algorithm's learner holds another optimizer state.
    p = rlrun.parser("test", target_return=1e9, max_env_steps=10**7)
    args = p.parse_args([*ARGS, "--num-learners", learners, "--results", str(tmp_path / "f")])
    fresh_algo = rlrun.ppo_config(args, "CartPole-v1").build_algo()
    try:
        fresh = adam_of(learner_state_of(fresh_algo))
    finally:
        fresh_algo.stop()
    # (Adam makes its moments at the first update: a fresh one has none, or others)
    steps = {i: step for i, (step, _, _) in fresh.items()}
    assert steps != {i: step for i, (step, _, _) in saved.items()}, steps


def test_a_checkpoint_part_saved_through_a_private_folder_is_made_readable(tmp_path: Path) -> None:
    """A learner on another node saves its part through RLlib's own mkdtemp (0700): the
    checkpoint gets the results directory's read access, so it can come home."""
    results = tmp_path / "results"
    results.mkdir(mode=0o755)
    results.chmod(0o755)
    part = results / ".tmp-iter-000002" / "learner_group" / "learner"
    part.mkdir(parents=True)
    part.chmod(0o700)
    (part / "state.pkl").write_bytes(b"x")
    (part / "state.pkl").chmod(0o600)
    assert part.stat().st_mode & 0o077 == 0  # the positive control: unreadable to others
    rlrun.readable_like(results / ".tmp-iter-000002", results)
    assert part.stat().st_mode & 0o777 == 0o755
    assert (part / "state.pkl").stat().st_mode & 0o777 == 0o644
