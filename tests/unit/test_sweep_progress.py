"""A sweep's progress (issue 46): `jobs.tune_watch` reads Tune's own experiment state and
says the trials running, pending, paused, done and failed, those run again, and the best
so far; the follower shows it as one live line on a terminal and one line per change
elsewhere; `jobs list` reads the same figures from progress.json.

The golden state files are Tune's own (Ray 2.60, `scripts/capture_tune_state.py`: six
trials of a function trainable, two at a time, two failing), trimmed to the fields read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli.jobs import make_handlers, progress_text, sweep_text
from provisioner.console import Output
from provisioner.experiment.file import parse_experiment
from provisioner.jobs import tune_watch
from provisioner.jobs.experiment import experiment_spec
from provisioner.jobs.tune_watch import Watcher, sweep_of

GOLDEN = Path(__file__).parent / "golden" / "job_output"
RETURN = "env_runners/episode_return_mean"


def state(name: str) -> dict[str, Any]:
    data = json.loads((GOLDEN / f"tune_experiment_state_{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def trials_of(data: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(json.loads(t), json.loads(m)) for t, m in data["trial_data"]]


def test_a_running_sweep_counts_tunes_own_statuses_and_the_trials_not_yet_made() -> None:
    data = state("running")
    statuses = [t["status"] for t, _ in trials_of(data)]
    got = sweep_of(data, total=6)
    assert got is not None
    # Tune had made only some trials (two at a time): the rest of the six are pending
    assert got["running"] == statuses.count("RUNNING") and got["running"] >= 1
    assert got["done"] == statuses.count("TERMINATED") >= 1
    assert got["pending"] == statuses.count("PENDING") + 6 - len(statuses)
    assert got["trials"] == 6 and got["failed"] == 0
    assert sum(got[k] for k in ("running", "pending", "paused", "done", "failed")) == 6
    # without the total, only what Tune made is counted
    alone = sweep_of(data)
    assert alone is not None and alone["trials"] == len(statuses)


def test_an_ended_sweep_names_its_best_trial_by_the_metric_and_mode() -> None:
    data = state("ended")
    got = sweep_of(data, total=6)
    assert got is not None
    assert (got["done"], got["failed"], got["repeated"]) == (4, 2, 0)  # failed once, not rerun
    values = {t["experiment_tag"]: m["last_result"]["env_runners"]["episode_return_mean"]
              for t, m in trials_of(data)}  # fmt: skip
    best = max(values, key=values.__getitem__)
    assert got["best"] == {"value": values[best], "trial": best} and got["metric"] == RETURN
    low = sweep_of(data, total=6, mode="min")
    assert low is not None and low["best"]["value"] == min(values.values())
    assert "best" not in sweep_of(data, metric="no/such_metric")  # type: ignore[operator]
    text = sweep_text(got)
    assert text.startswith("trials 6: 4 done, 2 failed  best return ") and f"({best})" in text


def test_a_trial_run_again_after_a_failure_is_counted() -> None:
    data = state("ended")
    entries = []
    for trial, meta in trials_of(data):
        if trial["status"] == "ERROR":  # as Tune leaves a trial it retried (max_failures)
            trial["status"] = "TERMINATED"
        entries.append([json.dumps(trial), json.dumps(meta)])
    got = sweep_of({"trial_data": entries})
    assert got is not None and (got["done"], got["failed"], got["repeated"]) == (6, 0, 2)
    assert "(2 run again)" in sweep_text(got)


def test_one_trial_is_no_sweep_and_a_broken_state_says_nothing() -> None:
    one = {"trial_data": state("ended")["trial_data"][:1]}
    assert sweep_of(one) is None
    assert sweep_of(one, total=2) is not None  # the file makes two: one is pending
    for broken in ({}, {"trial_data": "x"}, {"trial_data": [["{", "}"], [1]]}, [], None):
        assert sweep_of(broken) is None


def test_a_hostile_tag_or_metric_reaches_no_terminal() -> None:
    entries = []
    for trial, meta in trials_of(state("ended")):
        trial["experiment_tag"] = "\x1b]0;pwned\x07" + trial["experiment_tag"] + "\x1b[2J"
        entries.append([json.dumps(trial), json.dumps(meta)])
    got = sweep_of({"trial_data": entries})
    assert got is not None and "\x1b" not in got["best"]["trial"] and "\x07" not in str(got)
    forged = {**got, "metric": "\x1b[2Jx", "best": {"value": 1.0, "trial": "a\x1b[2Jb"}}
    text = sweep_text(forged)
    assert "\x1b" not in text and "best metric 1" in text and "(a" not in text


def write_trial(folder: Path, name: str, results: list[dict[str, Any]]) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in results)
    (folder / name / "result.json").write_text(lines)


def test_the_watcher_says_the_sweep_when_tunes_state_changes_and_keeps_it(
    tmp_path: Path,
) -> None:
    experiment = tmp_path / "artifacts" / "exp" / "driver_artifacts"
    write_trial(experiment, "trial_0", [{"training_iteration": 1}])
    write_trial(experiment, "trial_1", [{"training_iteration": 1}])
    results = tmp_path / "results"
    results.mkdir()
    watcher = Watcher(driver=0, total=6, results=str(results))
    watcher.experiments.add(str(experiment))
    assert not [m for m in watcher.poll() if "sweep" in m]  # no state file yet
    path = experiment / "experiment_state-2026-12-06_10-00-00.json"
    text = json.dumps(state("running"))
    path.write_text(text[: len(text) // 2])  # as Tune writes it: read again at the next look
    assert not [m for m in watcher.poll() if "sweep" in m]
    path.write_text(text)
    marks = [m for m in watcher.poll() if "sweep" in m]
    assert len(marks) == 1 and marks[0]["sweep"] == sweep_of(state("running"), total=6)
    assert json.loads((results / "progress.json").read_text()) == marks[0]  # for jobs list
    assert not [m for m in watcher.poll() if "sweep" in m]  # unchanged: nothing said
    newer = experiment / "experiment_state-2026-12-06_10-05-00.json"
    newer.write_text(json.dumps(state("ended")))  # a later session (a restored run)
    marks = [m for m in watcher.poll() if "sweep" in m]
    assert len(marks) == 1 and marks[0]["sweep"]["done"] == 4
    assert progress_text(json.loads((results / "progress.json").read_text())).startswith(
        "trials 6: 4 done, 2 failed"
    )


def test_a_state_file_too_large_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tune_watch, "MAX_STATE", 64)
    watcher = Watcher(driver=0, total=6)
    watcher.experiments.add(str(tmp_path))
    (tmp_path / "experiment_state-x.json").write_text(json.dumps(state("ended")))
    assert watcher.poll() == []


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def sweep_mark(name: str, **change: Any) -> dict[str, Any]:
    got = sweep_of(state(name), total=6)
    assert got is not None
    return {"source": "tune", "sweep": {**got, **change}}


def trial_mark(trial: int, iteration: int) -> dict[str, Any]:
    return {"source": "tune", "iteration": iteration, "trial": trial, "trials": 3}


def test_elsewhere_a_line_per_change_of_the_counts_or_the_best_trial() -> None:
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    show = make_handlers(out, False, False).on_progress
    show(trial_mark(1, 1))
    running = sweep_mark("running")
    show(running)
    show(trial_mark(1, 2))  # each trial's own line per iteration, as before
    value = running["sweep"]["best"]["value"]
    moved = {**running["sweep"], "best": {**running["sweep"]["best"], "value": value + 1}}
    show({"source": "tune", "sweep": moved})  # the best's value moved: no new sweep line
    show(running)  # nor the same figures again
    show(sweep_mark("ended"))  # the counts changed: a line
    lines = [line for line in out.stderr.getvalue().splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert len(lines) == 4, lines
    assert "trial 1/3  iter 1" in lines[0] and "trial 1/3  iter 2" in lines[2]
    assert "trials 6: " in lines[1] and "pending" in lines[1]
    assert "trials 6: 4 done, 2 failed  best return" in lines[3]


def test_on_a_terminal_the_line_is_the_sweep_then_the_latest_trial(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    out = Output(stdout=Tty(), stderr=Tty())
    show = make_handlers(out, False, False).on_progress
    show(sweep_mark("running"))
    show(trial_mark(2, 7))
    drawn = out.stderr.getvalue().split("\r\x1b[2K")  # type: ignore[attr-defined]
    last = drawn[-1]
    assert last.startswith("trials 6: ") and "|  trial 2/3  iter 7" in last
    assert all(len(d) < 100 for d in drawn)  # one screen line each: \r rewrites it whole


def test_an_experiment_sweep_tells_the_watcher_its_trials_and_metric(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        "s:\n  env: CartPole-v1\n  run: PPO\n  stop: {training_iteration: 2}\n"
        "  config:\n    lr: {grid_search: [0.001, 0.0001]}\n  seeds: [1, 2]\n  mode: max\n"
    )
    env = experiment_spec(parse_experiment(path, path.read_text())).runtime_env()["env_vars"]
    assert env[tune_watch.TRIALS_ENV] == "4"
    assert (env[tune_watch.METRIC_ENV], env[tune_watch.MODE_ENV]) == (RETURN, "max")
    one = tmp_path / "one.yaml"
    one.write_text("o:\n  env: CartPole-v1\n  run: PPO\n  stop: {training_iteration: 2}\n")
    env = experiment_spec(parse_experiment(one, one.read_text())).runtime_env()["env_vars"]
    assert tune_watch.TRIALS_ENV not in env


def test_one_trials_latest_figures_are_kept_for_jobs_list(tmp_path: Path) -> None:
    """A run of one trial (an experiment file with one seed, an unchanged RLlib script) has
    no sweep to say: `jobs list` shows its latest iteration, steps and return."""
    experiment = tmp_path / "artifacts" / "exp" / "driver_artifacts"
    first = {
        "training_iteration": 1,
        "num_env_steps_sampled_lifetime": 100,
        "env_runners": {"episode_return_mean": -900.5},  # as Tune writes it: nested
    }
    write_trial(experiment, "trial_0", [first])
    results = tmp_path / "results"
    results.mkdir()
    watcher = Watcher(driver=0, total=1, results=str(results))
    watcher.experiments.add(str(experiment))
    watcher.poll()
    kept = json.loads((results / "progress.json").read_text())
    assert kept == {
        "source": "tune",
        "iteration": 1,
        "env_steps": 100,
        RETURN.split("/")[1]: -900.5,
    }
    second = {**first, "training_iteration": 2, "num_env_steps_sampled_lifetime": 200}
    second["env_runners"] = {"episode_return_mean": -700.0}
    write_trial(experiment, "trial_0", [first, second])
    (experiment / "experiment_state-x.json").write_text(json.dumps({"trial_data": []}))
    watcher.poll()
    text = progress_text(json.loads((results / "progress.json").read_text()))
    assert "iter 2" in text and "200" in text and "-700.0" in text, text
