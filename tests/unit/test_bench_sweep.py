"""The sweep rows of `make bench` (scripts/bench_experiments.py): the figures from the
trials' own result.json (pure; the rows themselves run on the lab)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    import bench_experiments

    return bench_experiments


def write_trial(home: Path, name: str, rows: list[tuple[float, float]]) -> None:
    """A trial's result.json: (timestamp, time_this_iter_s) per iteration."""
    folder = home / "ray_results" / "bench-sweep" / name
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"training_iteration": i + 1, "timestamp": t, "time_this_iter_s": d})
        for i, (t, d) in enumerate(rows)
    ]
    (folder / "result.json").write_text("\n".join(lines) + "\n")


def test_two_waves_on_two_cpus(bench: ModuleType, tmp_path: Path) -> None:
    # wave one: trained from 100 to 120; wave two began at 124 and 126 (first results 128, 130)
    write_trial(tmp_path, "a", [(110, 10), (120, 10)])
    write_trial(tmp_path, "b", [(110, 10), (120, 10)])
    write_trial(tmp_path, "c", [(128, 4), (140, 12)])
    write_trial(tmp_path, "d", [(130, 4), (140, 10)])
    got = bench.sweep_figures(bench.trial_spans(tmp_path), cluster_cpus=2)
    assert got["trials"] == 4 and got["seconds"] == 40
    assert got["utilization"] == pytest.approx((20 + 20 + 16 + 14) / (2 * 40))
    assert got["trial_start_s"] == [8, 10]  # from the slot freed at 120 to 128 and 130


def test_a_trials_start_is_when_tune_placed_it(bench: ModuleType, tmp_path: Path) -> None:
    write_trial(tmp_path, "a", [(110, 10), (120, 10)])
    rows = (tmp_path / "ray_results" / "bench-sweep" / "a" / "result.json").read_text()
    rows = rows.replace('"training_iteration"', '"trial_id": "t_00000", "training_iteration"')
    (tmp_path / "ray_results" / "bench-sweep" / "a" / "result.json").write_text(rows)
    state = {
        "trial_data": [[json.dumps({"trial_id": "t_00000"}), json.dumps({"start_time": 95.5})]]
    }
    (tmp_path / "ray_results" / "bench-sweep" / "experiment_state-x.json").write_text(
        json.dumps(state)
    )
    assert bench.trial_spans(tmp_path) == [(95.5, 110.0, 120.0)]


def test_a_lone_wave_has_no_trial_start_and_no_results_is_an_error(
    bench: ModuleType, tmp_path: Path
) -> None:
    write_trial(tmp_path, "a", [(10, 10)])
    assert bench.sweep_figures(bench.trial_spans(tmp_path), 1)["trial_start_s"] == []
    with pytest.raises(ValueError):
        bench.sweep_figures([], 1)


def test_the_bench_sweep_fills_the_cluster_twice(bench: ModuleType) -> None:
    body = yaml.safe_load(bench.sweep_file(6))["bench-sweep"]
    rates = body["config"]["lr"]["grid_search"]
    assert len(rates) == 6 and len(set(rates)) == 6 and len(body["seeds"]) == 2
    assert rates[0] == pytest.approx(1e-4) and rates[-1] == pytest.approx(1e-3)


def test_a_trial_holds_its_cpus_from_its_actor_asked_for_to_its_process_exit(
    bench: ModuleType, tmp_path: Path
) -> None:
    # Tune says RUNNING at 95.5, once the algorithm is built; Ray's state API says the
    # actor of pid 7 on 10.0.0.2 was asked for at 90 and its process exited at 123
    write_trial(tmp_path, "a", [(110, 10), (120, 10)])
    path = tmp_path / "ray_results" / "bench-sweep" / "a" / "result.json"
    path.write_text(
        path.read_text().replace(
            '"training_iteration"',
            '"trial_id": "t_0", "node_ip": "10.0.0.2", "pid": 7, "training_iteration"',
        )
    )
    state = {"trial_data": [[json.dumps({"trial_id": "t_0"}), json.dumps({"start_time": 95.5})]]}
    (tmp_path / "ray_results" / "bench-sweep" / "experiment_state-x.json").write_text(
        json.dumps(state)
    )
    got = bench.trial_spans(tmp_path, {("10.0.0.2", 7): (90.0, 123.0)})
    assert got == [(90.0, 110.0, 123.0)]
    # its exit not known: freed at its last result
    assert bench.trial_spans(tmp_path, {("10.0.0.2", 7): (90.0, None)}) == [(90.0, 110.0, 120.0)]
    # another process's actor, or none known: Tune's RUNNING and its last result
    assert bench.trial_spans(tmp_path, {("10.0.0.2", 8): (90.0, 123.0)}) == [(95.5, 110.0, 120.0)]
    assert bench.trial_spans(tmp_path, {}) == [(95.5, 110.0, 120.0)]
