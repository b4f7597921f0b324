"""The playbooks' pure parts: the CellNetwork environment and the stopping rule."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "playbooks"))

import rlrun
from cell_network import CellNetwork, nearest_cell


def test_cell_network_is_a_valid_gymnasium_env() -> None:
    check_env(CellNetwork(), skip_render_check=True)


def test_a_cell_shares_its_capacity_among_the_users_it_serves() -> None:
    env = CellNetwork({"cells": 4, "users": 2})
    env.reset(seed=0)
    env.users = np.array([env.cells[0], env.cells[0]])
    alone = env.throughput(np.array([0, 1]))
    shared = env.throughput(np.array([0, 0]))
    assert alone[0] == pytest.approx(1.0)
    assert shared == pytest.approx([0.5, 0.5])


def _mean_return(policy: str, episodes: int = 20) -> float:
    env = CellNetwork()
    total = 0.0
    for seed in range(episodes):
        env.reset(seed=seed)
        env.action_space.seed(seed)
        done = False
        while not done:
            action = env.action_space.sample() if policy == "random" else nearest_cell(env)
            _, reward, terminated, truncated, _ = env.step(action)
            total += reward
            done = terminated or truncated
    return total / episodes


def test_serving_from_the_nearest_cell_beats_random_so_there_is_something_to_learn() -> None:
    assert _mean_return("nearest") > 1.5 * _mean_return("random")


def test_a_runs_cost_is_its_node_hours_times_the_price_it_was_given() -> None:
    assert rlrun.price_per_hour({}) is None
    assert rlrun.price_per_hour({rlrun.PRICE_ENV: "0.5"}) == 0.5
    for bad in ("cheap", "-1", "nan", "inf"):
        assert rlrun.price_per_hour({rlrun.PRICE_ENV: bad}) is None
    cost = rlrun.cost_of("node-hour", 3 * 1200 / 3600, 0.5)
    assert cost == {"unit": "node-hour", "hours": 1.0, "price_per_hour": 0.5, "cost": 0.5}
    assert rlrun.cost_of("node-hour", 1.0, None)["cost"] is None


def test_training_stops_at_the_first_budget_reached() -> None:
    budget = rlrun.Budget(target_return=100, max_env_steps=1000, max_iterations=5)
    row = rlrun.Row(
        iteration=1, env_steps=500, episode_return_mean=50, time_s=1, env_steps_per_s=500
    )
    assert rlrun.stop_reason(row, budget) is None
    assert rlrun.stop_reason(rlrun.Row(2, 1000, 50, 2, 500), budget) == "max_env_steps"
    assert rlrun.stop_reason(rlrun.Row(2, 600, 120, 2, 300), budget) == "target_return"
    assert rlrun.stop_reason(rlrun.Row(5, 600, 10, 2, 300), budget) == "max_iterations"


def test_learners_train_on_the_clusters_gpus_by_default() -> None:
    assert rlrun.learner_plan(0, None, None) == (0, 0.0)  # CPU: the driver's own learner
    assert rlrun.learner_plan(4, None, None) == (4, 1.0)  # one remote learner per GPU
    assert rlrun.learner_plan(4, 0.5, None) == (8, 0.5)
    assert rlrun.learner_plan(4, 1, 2) == (2, 1)
    assert rlrun.learner_plan(4, 0, None) == (0, 0)  # asked for CPU learners


@pytest.mark.parametrize(("gpus", "per", "learners"), [(0, 1.0, None), (2, 1.0, 3), (1, -1, 0)])
def test_more_learner_gpus_than_the_cluster_has_are_refused(
    gpus: float, per: float, learners: int | None
) -> None:
    with pytest.raises(SystemExit, match="GPU"):
        rlrun.learner_plan(gpus, per, learners)


def test_trained_on_names_device_gpu_and_node() -> None:
    cuda = {"device": "cuda:0", "gpu": "Tesla T4", "node_ip": "10.0.0.5"}
    assert rlrun.describe_device(cuda) == "cuda:0 (Tesla T4) on 10.0.0.5"
    cpu = {"device": "cpu", "gpu": None, "node_ip": "10.0.0.4"}
    assert rlrun.describe_device(cpu) == "cpu on 10.0.0.4"
