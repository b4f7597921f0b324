"""Capture Tune's own experiment state files for the unit tests of the sweep's progress
(tests/unit/golden/job_output/tune_experiment_state_{running,ended}.json).

A real Tune run with this machine's Ray (the image's version, pinned in images/requirements.in):
six trials of a function trainable (3 learning rates x 2 seeds, two at a time, the third
learning rate failing at its second result). One state file is copied while trials run,
one is pending and one has ended; one at the end. Each is trimmed to the fields
`jobs.tune_watch` reads (a trial's status, id and tag; its last result and failures),
without hostnames, pids or Tune's pickled fields.

    .venv/bin/python scripts/capture_tune_state.py
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "unit" / "golden" / "job_output"
DROPPED = ("hostname", "node_ip", "pid", "config", "date", "timestamp")


def trimmed(source: Path) -> dict[str, Any]:
    data = json.loads(source.read_text())
    trials = []
    for state, meta in data["trial_data"]:
        t, m = json.loads(state), json.loads(meta)
        keep = {k: t[k] for k in ("status", "trial_id", "experiment_tag")}
        last = {k: v for k, v in m["last_result"].items() if k not in DROPPED}
        trials.append(
            [json.dumps(keep), json.dumps({"last_result": last, "num_failures": m["num_failures"]})]
        )
    return {"trial_data": trials, "stats": data["stats"]}


def main() -> None:
    os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = "0"  # a state file after every step
    import ray
    from ray import tune

    work = Path(tempfile.mkdtemp())

    def trainable(config: dict[str, Any]) -> None:
        for i in range(3):
            if config["lr"] == 0.3 and i == 1:
                raise RuntimeError("a failing trial")
            time.sleep(0.5)
            ret = 10.0 * config["lr"] * (i + 1) + config["seed"]
            tune.report({"env_runners": {"episode_return_mean": ret}})

    class Snap(tune.Callback):  # type: ignore[misc]
        taken = False

        def on_trial_result(
            self, iteration: int, trials: list[Any], trial: Any, result: Any, **info: Any
        ) -> None:
            states = {t.status for t in trials}
            if not Snap.taken and {"PENDING", "RUNNING", "TERMINATED"} <= states:
                staging = trial.storage.experiment_driver_staging_path
                found = sorted(glob.glob(os.path.join(staging, "experiment_state-*.json")))
                if found:
                    shutil.copy(found[-1], work / "running.json")
                    Snap.taken = True

    ray.init(num_cpus=2, include_dashboard=False)
    space = {"lr": tune.grid_search([0.1, 0.2, 0.3]), "seed": tune.grid_search([1, 2])}
    tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=2),
        run_config=tune.RunConfig(
            name="sweep", storage_path=str(work / "store"), callbacks=[Snap()]
        ),
    ).fit()
    ended = sorted(glob.glob(str(work / "store" / "sweep" / "experiment_state-*.json")))[-1]
    for name, source in (("running", work / "running.json"), ("ended", Path(ended))):
        (GOLDEN / f"tune_experiment_state_{name}.json").write_text(
            json.dumps(trimmed(source), indent=1) + "\n"
        )
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
