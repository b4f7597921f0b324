"""`submit --resume` and `--retries` of an unchanged Tune script (pure parts): which
experiment a job's results hold, the head's copy of it into the new job's results, and
the entrypoint that runs the script through `jobs.tune_resume`. The restore itself runs
on the lab (tests/e2e/test_jobs.py)."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.jobs.resume import find_source, head_copy_command, latest_experiment
from provisioner.jobs.spec import RESUME_ENV, TUNE_RESUME_ENV, make_spec
from provisioner.jobs.watch import RESUME_SOURCE, compact_source


def experiment(results: Path, name: str, age: float = 0.0) -> Path:
    folder = results / "ray_results" / name
    (folder / "train_abc_00000").mkdir(parents=True)
    state = folder / "experiment_state-2026-12-06_06-00-00.json"
    state.write_text("{}")
    stamp = time.time() - age
    os.utime(state, (stamp, stamp))
    return folder


def test_the_experiment_tune_saved_last_is_the_one_resumed(tmp_path: Path) -> None:
    experiment(tmp_path, "train_old", age=100)
    newest = experiment(tmp_path, "train_new")
    (tmp_path / "ray_results" / "not_an_experiment").mkdir()
    assert latest_experiment(tmp_path) == newest
    assert latest_experiment(newest) == newest  # the experiment's folder itself
    assert latest_experiment(tmp_path / "ray_results" / "not_an_experiment") is None


def test_a_folder_name_that_could_not_travel_is_not_an_experiment(tmp_path: Path) -> None:
    experiment(tmp_path, "-rf")
    assert latest_experiment(tmp_path) is None
    experiment(tmp_path, "ok")  # a positive control
    assert latest_experiment(tmp_path) == tmp_path / "ray_results" / "ok"


def test_a_jobs_playbook_checkpoint_comes_first_then_its_tune_experiment(tmp_path: Path) -> None:
    job = tmp_path / "job-1"
    folder = experiment(job, "train_x")
    source = find_source("job-1", tmp_path)
    assert source.tune and source.checkpoint == folder and source.job_id == "job-1"
    assert source.on_head == "ray_results/train_x"
    (job / "checkpoints" / "iter-000002").mkdir(parents=True)
    playbook = find_source("job-1", tmp_path)
    assert not playbook.tune and playbook.checkpoint.name == "iter-000002"
    with pytest.raises(InputError):
        find_source("job-2", tmp_path)  # nothing of it here


def sh(root: Path, command: str) -> subprocess.CompletedProcess[bytes]:
    home = root.parents[3]  # ROOT is HOME/.provisioner/clusters/c/results
    return subprocess.run(
        ["bash", "-c", command], env={**os.environ, "HOME": str(home)}, capture_output=True
    )


def test_the_head_copies_the_experiment_into_the_new_jobs_resume_folder(tmp_path: Path) -> None:
    root = tmp_path / ".provisioner" / "clusters" / "c" / "results"
    old = experiment(root / "old", "train_x")
    (old / "train_abc_00000" / "checkpoint_000001").mkdir()
    (old / "train_abc_00000" / "checkpoint_000001" / "state.json").write_text('{"i": 1}')
    (root / "new").mkdir()
    into = "resume/tune/train_x"
    done = sh(root, head_copy_command("c", "old", "ray_results/train_x", "new", into, ()))
    assert done.returncode == 0, done.stderr
    copied = root / "new" / "resume" / "tune" / "train_x"
    assert (copied / "train_abc_00000" / "checkpoint_000001" / "state.json").read_text() == (
        '{"i": 1}'
    )
    assert not (root / "new" / "metrics.csv").exists()
    gone = head_copy_command("c", "gone", "ray_results/train_x", "n2", into, ())
    assert sh(root, gone).returncode == 3  # the head lacks it: sent from here instead


def test_a_tune_resume_runs_the_script_through_the_restorer_and_says_where(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    spec = make_spec(script, ["--x", "a b"], job_id="j2")
    plain = spec.entrypoint()
    assert plain.endswith(shlex.join(["python3", "-u", "train.py", "--x", "a b"]))
    tune = replace(spec, resumed_from="j1", tune_experiment="train_x")
    words = shlex.split(tune.entrypoint().rsplit("&& exec ", 1)[1])
    assert words[:3] == ["python3", "-u", "-c"] and words[4:] == ["train.py", "--x", "a b"]
    env = tune.runtime_env()["env_vars"]
    assert env[TUNE_RESUME_ENV] == "resume/tune/train_x" and RESUME_ENV not in env
    assert replace(spec, resumed_from="j1").runtime_env()["env_vars"][RESUME_ENV]


def test_the_restorer_runs_an_unchanged_script_as_python_would(tmp_path: Path) -> None:
    """Without an experiment to restore, the script runs as `python3 -u SCRIPT ARGS`:
    its own folder on sys.path, its arguments, `__main__`, its exit code."""
    (tmp_path / "helper.py").write_text("VALUE = 7\n")
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, helper\nprint(__name__, sys.argv[1:], helper.VALUE)\nsys.exit(3)\n"
    )
    code = compact_source(RESUME_SOURCE)
    env = {**os.environ, TUNE_RESUME_ENV: "resume/tune/absent", "PROVISIONER_RESULTS_DIR": "."}
    done = subprocess.run(
        ["python3", "-u", "-c", code, "train.py", "--x", "a b"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 3, done.stderr
    assert "__main__ ['--x', 'a b'] 7" in done.stdout
    assert "no experiment at ./resume/tune/absent: the script starts afresh" in done.stdout


TUNE_SCRIPT = """
import json, os, signal, time
from ray import tune


class Counter(tune.Trainable):
    def setup(self, config):
        self.n = 0

    def step(self):
        self.n += 1
        time.sleep(0.1)
        return {"n": self.n}

    def save_checkpoint(self, folder):
        with open(os.path.join(folder, "n"), "w") as f:
            f.write(str(self.n))

    def load_checkpoint(self, folder):
        with open(os.path.join(folder, "n")) as f:
            self.n = int(f.read())


class LoseTheNode(tune.Callback):
    # trial x=2's actor killed as its third result comes in, with its save in flight
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if os.environ.get("KILL") == "1" and trial.config["x"] == 2:
            if result["training_iteration"] == 3:
                os.kill(result["pid"], signal.SIGKILL)


def say(grid):
    got = sorted([r.config["x"], r.metrics["training_iteration"], r.metrics["n"]] for r in grid)
    print("RESULT " + json.dumps(got), flush=True)


def run_config(callback):
    # 6 iterations, a checkpoint each, in $STORE/s; a local Ray of 2 CPUs
    import ray
    ray.init(num_cpus=2, include_dashboard=False)
    return tune.RunConfig(
        name="s", storage_path=os.environ["STORE"], stop={"training_iteration": 6},
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1), callbacks=[callback],
    )


if __name__ == "__main__":
    run = run_config(LoseTheNode())
    say(tune.Tuner(Counter, param_space={"x": tune.grid_search([1, 2])}, run_config=run).fit())
"""

RESTORE_ONLY = """
import sys, ray
from ray import tune
sys.path.insert(0, sys.argv[2])
import train
ray.init(num_cpus=2, include_dashboard=False)
tuner = tune.Tuner.restore(sys.argv[1], train.Counter, resume_unfinished=True, resume_errored=True)
train.say(tuner.fit())
"""


def _result(done: subprocess.CompletedProcess[str]) -> list[list[int]]:
    import json

    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout[-3000:] + done.stderr[-3000:]
    found: list[list[int]] = json.loads(lines[-1][len("RESULT ") :])
    return found


def _python(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`python3 -u ARGS` in `tmp_path` (a local Ray's Tune run, five minutes at most)."""
    import sys

    return subprocess.run(
        [sys.executable, "-u", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def _restored_alone(tmp_path: Path, env: dict[str, str], copy: Path) -> list[list[int]]:
    """The control: Tune's own `Tuner.restore` of the experiment copied to `copy`."""
    return _result(_python(tmp_path, env, "-c", RESTORE_ONLY, str(copy), str(tmp_path)))


def _restored_through_the_restorer(
    tmp_path: Path, env: dict[str, str], script: str, results: Path
) -> list[list[int]]:
    """`script` run as a resume runs it: the restorer's source, the experiment under
    `results`/resume/tune/s, Tune's storage $RAY_STORAGE = `tmp_path`/shared."""
    extra = {"RAY_STORAGE": str(tmp_path / "shared"), TUNE_RESUME_ENV: "resume/tune/s",
             "PROVISIONER_RESULTS_DIR": str(results)}  # fmt: skip
    done = _python(tmp_path, {**env, **extra}, "-c", compact_source(RESUME_SOURCE), script)
    assert "Tune's experiment restored from" in done.stdout, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    return _result(done)


def test_a_trial_lost_during_a_save_goes_on_to_the_stop_after_the_restore(
    tmp_path: Path,
) -> None:
    """Ray 2.60 writes a STOP it held for a save in flight into the experiment state; a
    trial whose node was lost during a save is restored with it and stops after one
    iteration (the control: Tuner.restore alone). Through the restorer, which drops
    those decisions, it goes on to the run's stop. A real Tune run (a class trainable
    with checkpoints every iteration), its trial's actor killed at its third result."""
    import shutil

    script = tmp_path / "train.py"
    script.write_text(TUNE_SCRIPT)
    env = {**os.environ, "STORE": str(tmp_path / "store"), "RAY_DEDUP_LOGS": "0"}
    first = _python(tmp_path, {**env, "KILL": "1"}, str(script))
    assert _result(first) == [[1, 6, 6], [2, 3, 3]]  # x=2 lost at its third iteration
    assert "ActorDiedError" in first.stdout + first.stderr
    experiment = tmp_path / "store" / "s"
    control = tmp_path / "control" / "s"
    shutil.copytree(experiment, control)
    # the control: Tune's own restore stops the restored trial one iteration on (2 -> 3)
    assert _restored_alone(tmp_path, env, control) == [[1, 6, 6], [2, 3, 3]]
    results = tmp_path / "results"
    shutil.copytree(experiment, results / "resume" / "tune" / "s")
    mended = _restored_through_the_restorer(
        tmp_path, {**env, "STORE": str(tmp_path / "fresh")}, "train.py", results
    )
    assert mended == [[1, 6, 6], [2, 6, 6]]  # on from its checkpoint to the stop


SWEEP_SCRIPT = """
import os, signal
from ray import tune
from train import Counter, run_config, say


class StopAtTheSecondTrial(tune.Callback):
    # the run interrupted (SIGINT: Tune saves its state and ends) at x=2's third result,
    # x=1 finished, x=3 not made yet (one trial at a time)
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if os.environ.get("STOP") == "1" and trial.config["x"] == 2:
            if result["training_iteration"] == 3:
                os.kill(os.getpid(), signal.SIGINT)


if __name__ == "__main__":
    run = run_config(StopAtTheSecondTrial())
    space = {"x": tune.grid_search([1, 2, 3])}
    config = tune.TuneConfig(max_concurrent_trials=1)
    say(tune.Tuner(Counter, param_space=space, run_config=run, tune_config=config).fit())
"""


def _trial_checkpoints(experiment: Path) -> dict[int, int]:
    """x -> how many checkpoints its trial's folder in `experiment` holds (a trial's
    checkpoints may sit in a folder without its params.json: the folder's name says x)."""
    import re

    found: dict[int, int] = {}
    for folder in experiment.glob("Counter_*"):
        x = int(re.findall(r"_x=(\d+)_", folder.name)[0])
        found[x] = found.get(x, 0) + len(list(folder.glob("checkpoint_*")))
    return found


def test_a_trial_made_after_a_restore_elsewhere_checkpoints_in_the_new_place(
    tmp_path: Path,
) -> None:
    """A sweep of 3 trials, one at a time, interrupted at the second trial's third
    iteration, restored at another path (the next attempt's storage): the third trial,
    made after the restore, keeps its checkpoints there. The control: Tune's own restore
    of a moved copy puts them in the first experiment's folder."""
    import shutil

    (tmp_path / "train.py").write_text(TUNE_SCRIPT)
    script = tmp_path / "sweep.py"
    script.write_text(SWEEP_SCRIPT)
    env = {**os.environ, "STORE": str(tmp_path / "store"), "RAY_DEDUP_LOGS": "0"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    first = _python(tmp_path, {**env, "STOP": "1"}, str(script))
    experiment = tmp_path / "store" / "s"
    assert _trial_checkpoints(experiment) == {1: 6, 2: 3}, first.stdout[-2000:] + first.stderr
    pristine = tmp_path / "pristine"
    shutil.copytree(experiment, pristine)
    control = tmp_path / "control" / "s"
    shutil.copytree(pristine, control)
    assert _restored_alone(tmp_path, env, control) == [[1, 6, 6], [2, 6, 6], [3, 6, 6]]
    # the control: Tune's own restore puts x=3's checkpoints in the first folder
    assert _trial_checkpoints(experiment).get(3) == 6 and not _trial_checkpoints(control)[3]
    shutil.rmtree(experiment)
    shutil.copytree(pristine, experiment)
    results = tmp_path / "results"
    shutil.copytree(pristine, results / "resume" / "tune" / "s")
    mended = _restored_through_the_restorer(tmp_path, env, "sweep.py", results)
    assert mended == [[1, 6, 6], [2, 6, 6], [3, 6, 6]]
    assert _trial_checkpoints(tmp_path / "shared" / "s") == {1: 6, 2: 6, 3: 6}
    assert 3 not in _trial_checkpoints(experiment)  # nothing of x=3 in the first folder
