"""`provisioner compare`: curves read from what runs wrote, grouped by config, the mean and
95% interval over seeds, the table's figures; bad input exits 2.

The Tune results are a real capture (tests/unit/golden/compare/cartpole-lr-seeds/: RLlib
2.60's PPO on CartPole-v1 through Tune, a grid of 2 learning rates x 3 seeds, 4 iterations
each; only the host name and address in each result replaced by the lab's).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.jobs.compare import (
    band,
    compare,
    compare_runs,
    config_key,
    curve_from_results,
    interpolate,
    read_run,
    stat,
    t95,
)
from tests.cli import cli

GOLDEN = Path(__file__).parent / "golden" / "compare" / "cartpole-lr-seeds"


def tune_run(tmp_path: Path, job: str = "sweep") -> Path:
    """results/JOB/ as an experiment's run comes home: Tune's folder under ray_results/."""
    home = tmp_path / "results" / job
    shutil.copytree(GOLDEN, home / "ray_results" / "cartpole")
    return home


def results_of(trial: str) -> list[dict[str, object]]:
    folder = next(GOLDEN.glob(f"*{trial}*"))
    return [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]


def test_a_trials_curve_is_what_rllib_wrote() -> None:
    folder = next(GOLDEN.glob("*00000*"))
    curve = curve_from_results((folder / "result.json").open(), "sweep", folder.name)
    assert curve is not None
    rows = results_of("00000")
    assert curve.returns == tuple(r["env_runners"]["episode_return_mean"] for r in rows)  # type: ignore[index]
    assert curve.env_steps == tuple(float(r["num_env_steps_sampled_lifetime"]) for r in rows)  # type: ignore[arg-type]
    assert curve.wall_s == tuple(r["time_total_s"] for r in rows)
    assert curve.seed == 1 and "seed" not in curve.config
    assert curve.config["lr"] == 0.0003 and curve.config["env"] == "CartPole-v1"
    assert curve.ended == rows[-1]["timestamp"]


def test_seeds_of_one_config_are_one_group_and_the_learning_rates_two(tmp_path: Path) -> None:
    found = compare([read_run("sweep", tune_run(tmp_path))])
    assert len(found.groups) == 2
    by_lr = {g.curves[0].config["lr"]: g for g in found.groups}
    assert set(by_lr) == {0.0003, 0.001}
    for lr, group in by_lr.items():
        assert sorted(c.seed for c in group.curves) == [1, 2, 3]  # type: ignore[type-var]
        assert f"lr={lr}" in group.label, group.label  # what tells the groups apart
        assert "seed" not in group.label
        finals = [c.final_return for c in group.curves]
        assert group.final_return is not None
        assert math.isclose(group.final_return.mean, sum(finals) / 3)
        assert group.final_return.n == 3 and group.final_return.half_width is not None


def test_the_band_is_the_mean_and_interval_where_every_seed_has_data(tmp_path: Path) -> None:
    group = compare([read_run("sweep", tune_run(tmp_path))]).groups[0]
    curves = group.curves
    b = group.by_steps
    assert b is not None
    # from the latest first point to the earliest last one
    assert b.x[0] == max(c.env_steps[0] for c in curves)
    assert b.x[-1] == min(c.env_steps[-1] for c in curves)
    # every seed samples the same steps per iteration here: at a grid point on the data,
    # the mean is the plain mean of the seeds' returns there
    at = b.x[-1]
    values = [interpolate(c.env_steps, c.returns, at) for c in curves]
    assert math.isclose(b.mean[-1], sum(values) / len(values))
    want = stat(values)
    assert want is not None and want.half_width is not None
    assert math.isclose(b.high[-1] - b.mean[-1], want.half_width)
    assert all(lo <= m <= hi for lo, m, hi in zip(b.low, b.mean, b.high, strict=True))
    assert group.by_time is not None and len(group.by_time.x) == len(b.x)


def test_the_interval_is_students_t() -> None:
    found = stat([1.0, 2.0, 3.0])  # mean 2, sd 1, n 3: t(2) = 4.303
    assert found is not None and found.mean == 2.0
    assert found.half_width is not None
    assert math.isclose(found.half_width, 4.303 / math.sqrt(3), rel_tol=1e-9)
    one = stat([5.0])
    assert one is not None and one.half_width is None and one.text() == "5.0"
    assert stat([]) is None
    assert t95(2) == 12.706 and t95(31) == 2.042 and t95(500) == 1.96


def test_interpolation_between_points_and_at_the_ends() -> None:
    assert interpolate([0, 10], [0.0, 100.0], 2.5) == 25.0
    assert interpolate([0, 10], [0.0, 100.0], -5) == 0.0
    assert interpolate([0, 10], [0.0, 100.0], 50) == 100.0
    assert band([], "env_steps") is None


def test_time_to_target_from_the_experiment_files_stop(tmp_path: Path) -> None:
    home = tune_run(tmp_path)
    everything = [r for t in ("00000", "00002", "00004") for r in results_of(t)]
    returns = sorted(r["env_runners"]["episode_return_mean"] for r in everything)  # type: ignore[index]
    target = returns[len(returns) // 2]  # some results reach it, others not
    (home / "experiment.yaml").write_text(
        f"cartpole:\n  env: CartPole-v1\n  run: PPO\n  stop:\n"
        f"    env_runners/episode_return_mean: {target}\n    training_iteration: 4\n"
    )
    run = read_run("sweep", home)
    assert run.target == target
    group = next(g for g in compare([run]).groups if g.curves[0].config["lr"] == 0.0003)
    expected = []
    for curve in group.curves:
        hits = [w for w, r in zip(curve.wall_s, curve.returns, strict=True) if r >= target]
        if hits:
            expected.append(hits[0])
    assert group.reached == len(expected)
    if expected:
        assert group.time_to_target is not None
        assert math.isclose(group.time_to_target.mean, sum(expected) / len(expected))
    # --target wins over the file's
    other = compare([run], target=-1.0).groups[0]
    assert other.target == -1.0 and other.reached == len(other.curves)


def test_node_hours_from_the_nodes_submitted_over_the_trials_span(tmp_path: Path) -> None:
    home = tune_run(tmp_path)
    (home / "submitted.json").write_text(json.dumps({"job_id": "sweep", "nodes": 3}))
    run = read_run("sweep", home)
    rows = [r for t in ("0000",) for f in GOLDEN.glob(f"*{t}*") for r in results_of(f.name)]
    start = min(r["timestamp"] - r["time_total_s"] for r in rows if r["training_iteration"] == 1)  # type: ignore[operator]
    end = max(r["timestamp"] for r in rows)  # type: ignore[type-var]
    assert run.nodes == 3 and run.node_hours is not None
    assert math.isclose(run.node_hours, 3 * (end - start) / 3600, rel_tol=1e-6)  # type: ignore[operator]
    # the two groups are one job: each says the job's node-hours
    assert {g.node_hours for g in compare([run]).groups} == {run.node_hours}


def test_a_playbooks_metrics_csv_with_its_config_target_and_cost(tmp_path: Path) -> None:
    def playbook_run(job: str, seed: int, returns: list[float]) -> Path:
        home = tmp_path / "results" / job
        home.mkdir(parents=True)
        rows = ["iteration,env_steps,episode_return_mean,time_s,env_steps_per_s"]
        rows += [
            f"{i + 1},{1000 * (i + 1)},{r},{2.0 * (i + 1)},500.0" for i, r in enumerate(returns)
        ]
        (home / "metrics.csv").write_text("\n".join(rows) + "\n")
        (home / "config.json").write_text(json.dumps({"lr": 5e-5, "seed": seed}))
        (home / "submitted.json").write_text(
            json.dumps({"playbook": "ppo_cartpole.py", "args": ["--target-return=150"]})
        )
        (home / "summary.json").write_text(
            json.dumps({"cost": {"unit": "node-hour", "hours": 0.01}})
        )
        return home

    a = read_run("ppo-a", playbook_run("ppo-a", 1, [20.0, 90.0, 160.0]))
    b = read_run("ppo-b", playbook_run("ppo-b", 2, [25.0, 155.0, 170.0]))
    assert a.target == 150.0 and a.node_hours == 0.01
    (group,) = compare([a, b]).groups  # one config but the seed: one group over two runs
    assert group.label == "ppo-a+ppo-b"
    assert group.reached == 2 and group.time_to_target is not None
    assert group.time_to_target.mean == (6.0 + 4.0) / 2
    assert group.node_hours == pytest.approx(0.02)
    assert group.steps_per_s is not None and group.steps_per_s.mean == 500.0


def test_a_function_in_the_config_does_not_split_the_seeds() -> None:
    one = {"callbacks": "<function on_episode at 0x7f3a1c2b>", "lr": 1e-3}
    two = {"callbacks": "<function on_episode at 0x7f99e0d0>", "lr": 1e-3}
    assert config_key(one) == config_key(two)
    assert config_key(one) != config_key({**one, "lr": 2e-3})


def test_a_result_cut_short_by_a_trial_still_writing_is_passed_over() -> None:
    folder = next(GOLDEN.glob("*00001*"))
    lines = (folder / "result.json").read_text().splitlines()
    cut = [*lines[:3], lines[3][: len(lines[3]) // 2]]
    curve = curve_from_results(iter(cut), "sweep", folder.name)
    assert curve is not None and len(curve.returns) == 3


def test_an_unknown_run_names_the_runs_there(tmp_path: Path) -> None:
    tune_run(tmp_path, "ppo-20261206-1")
    with pytest.raises(InputError) as caught:
        compare_runs(["nope"], tmp_path / "results")
    assert "no run 'nope'" in str(caught.value) and "ppo-20261206-1" in str(caught.value)
    assert caught.value.exit_code == 2 and caught.value.fix


def test_a_run_without_training_results_is_refused(tmp_path: Path) -> None:
    (tmp_path / "results" / "empty").mkdir(parents=True)
    (tmp_path / "results" / "empty" / "job.log").write_text("nothing learned\n")
    with pytest.raises(InputError) as caught:
        compare_runs(["empty"], tmp_path / "results")
    assert "no training results" in str(caught.value) and "jobs results" in caught.value.fix


def test_the_cli_draws_the_plot_and_gives_the_figures_as_json(tmp_path: Path) -> None:
    tune_run(tmp_path)
    png = tmp_path / "cmp.png"
    done = cli("compare", "--results", str(tmp_path / "results"), "sweep", "-o", str(png), "--json")
    assert done.exit_code == 0, done.stderr
    doc = done.json()
    assert doc["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [len(g["seeds"]) for g in doc["groups"]] == [3, 3]
    assert all(g["final_return"]["n"] == 3 for g in doc["groups"])
    done = cli("compare", "--results", str(tmp_path / "results"), "sweep")
    assert done.exit_code == 0, done.stderr
    assert "final return" in done.stdout and "lr=0.001" in done.stdout
    assert "± " in done.stdout
    assert (tmp_path / "results" / "compare.png").is_file()  # the default plot's place


def test_the_cli_refuses_bad_input_with_exit_2(tmp_path: Path) -> None:
    done = cli("compare", "--results", str(tmp_path), "missing")
    assert done.exit_code == 2 and "Traceback" not in done.stdout + done.stderr
    assert "no run 'missing'" in done.stderr
