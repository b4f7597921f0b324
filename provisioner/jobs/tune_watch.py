"""A job's progress read from Tune's own results: a small watcher started beside the driver.

A script that trains through Tune (RLlib's example runner included) needs no line of ours:
Tune's driver writes each trial's results, one JSON object per iteration, to the trial's
`result.json` (Ray 2.60: `JsonLoggerCallback`, in the trial's driver staging folder
`SESSION/artifacts/TIMESTAMP/EXPERIMENT/driver_artifacts/TRIAL/`, flushed after every
result). The job's entrypoint (`JobSpec.entrypoint`) starts this file's source as
`python3 -c SOURCE $$ &` just before it execs the driver (the shell's pid is the driver's):
it finds the result files the driver holds open (`/proc/DRIVER/fd`; this job's and
no other's, wherever Ray's session lives), reads their new whole lines twice a second and
prints each trial's latest as the playbooks' `PROVISIONER-PROGRESS {json}` line into the
job's output, which the follower shows as the live line and job.log leaves out.

A sweep (more than one trial): Tune's own experiment state
(`experiment_state-*.json`, which Tune's controller writes into the same staging folder
every few seconds) says each trial's status and last result; from it, a mark
`{"sweep": {...}}` each time the trials' counts or the best so far change: running,
pending (with the job's `PROVISIONER_TRIALS`, the trials an experiment file makes, those
Tune has not created yet), paused, done, failed, the best trial by `PROVISIONER_METRIC`
and `PROVISIONER_MODE` (default: the mean return, highest), and the trials Tune ran again
after a failure. The same figures go to the job's `progress.json` for `jobs list`.

It ends with the driver (the process it watches is gone or a zombie; Ray's stop ends the
driver's children with it), reads what was left once more, and never fails the job: any
error ends it quietly, and the driver's exit code is the job's (the shell execs it).
Standard library only: it runs in the cluster's Python, where provisioner is not installed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any

MARK = "PROVISIONER-PROGRESS"
RESULT_FILE = "result.json"
STATE_FILE = re.compile(r"^experiment_state-.*\.json\Z")  # Tune's controller's state
MAX_STATE = 32 * 1024 * 1024  # the most of one experiment state file read
TRIALS_ENV = "PROVISIONER_TRIALS"  # how many trials the experiment file makes
METRIC_ENV = "PROVISIONER_METRIC"  # what the best trial is judged by
MODE_ENV = "PROVISIONER_MODE"  # max or min
RESULTS_ENV = "PROVISIONER_RESULTS_DIR"  # the job's results directory: progress.json there
DEFAULT_METRIC = "env_runners/episode_return_mean"
# Tune's trial statuses, as the sweep's mark counts them
COUNTED = {
    "RUNNING": "running",
    "PENDING": "pending",
    "PAUSED": "paused",
    "TERMINATED": "done",
    "ERROR": "failed",
}
TAG = re.compile(r"[^A-Za-z0-9_.,=:+-]")  # what of a trial's tag is shown
MAX_TAG = 80
POLL_S = 0.5
MAX_METRICS = 4  # a plain trainable's scalars shown on the line, in the order it reports them
MAX_READ = 4 * 1024 * 1024  # the most read of one file per poll
NAME = re.compile(r"^[A-Za-z0-9_./:-]{1,40}\Z")  # a metric's name as shown (others left out)

# Tune's own keys in every result: not the trainable's metrics.
TUNE_KEYS = frozenset(
    {
        "training_iteration",
        "trial_id",
        "date",
        "timestamp",
        "time_this_iter_s",
        "time_total_s",
        "time_since_restore",
        "iterations_since_restore",
        "timesteps_since_restore",
        "timesteps_total",
        "episodes_total",
        "pid",
        "hostname",
        "node_ip",
        "done",
        "config",
        "checkpoint_dir_name",
        "should_checkpoint",
        "experiment_tag",
    }
)


def _number(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _first(result: dict[str, Any], *paths: str) -> float | int | None:
    """The first of `paths` (`a/b`: key b of the dict at key a) that holds a number."""
    for path in paths:
        value: Any = result
        for key in path.split("/"):
            value = value.get(key) if isinstance(value, dict) else None
        found = _number(value)
        if found is not None:
            return found
    return None


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """The progress figures of one Tune result: iteration, env steps and mean return
    (RLlib's new stack, then its old keys), or a plain trainable's first scalars."""
    out: dict[str, Any] = {"source": "tune"}
    iteration = _first(result, "training_iteration")
    if iteration is not None:
        out["iteration"] = iteration
    steps = _first(
        result,
        "num_env_steps_sampled_lifetime",
        "env_runners/num_env_steps_sampled_lifetime",
        "num_env_steps_sampled",
        "timesteps_total",
    )
    ret = _first(result, "env_runners/episode_return_mean", "episode_reward_mean")
    if steps is not None:
        out["env_steps"] = steps
    if ret is not None:
        out["episode_return_mean"] = ret
    if steps is None and ret is None:  # not RLlib: what the trainable reports
        metrics: dict[str, float | int] = {}
        for key, value in result.items():
            number = _number(value)
            if key in TUNE_KEYS or number is None or not NAME.match(key):
                continue
            metrics[key] = number
            if len(metrics) == MAX_METRICS:
                break
        if metrics:
            out["metrics"] = metrics
    return out


def _better(value: float, than: float, mode: str) -> bool:
    return value < than if mode == "min" else value > than


def sweep_of(
    state: Any, total: int | None = None, metric: str = DEFAULT_METRIC, mode: str = "max"
) -> dict[str, Any] | None:
    """A sweep's figures from Tune's experiment state (the parsed file): how many trials
    are running, pending, paused, done and failed, how many Tune ran again after a
    failure, and the best so far by `metric` (its last result) under `mode`. `total`: the
    trials the job makes, of which Tune may not have created all yet (pending). None for
    fewer than two trials."""
    entries = state.get("trial_data") if isinstance(state, dict) else None
    if not isinstance(entries, list):
        return None
    counts = dict.fromkeys(COUNTED.values(), 0)
    best: tuple[float, str] | None = None
    known = repeated = 0
    for entry in entries:
        try:
            trial, meta = json.loads(entry[0]), json.loads(entry[1])
        except (ValueError, TypeError, IndexError, KeyError):
            continue
        if not isinstance(trial, dict) or not isinstance(meta, dict):
            continue
        status = COUNTED.get(str(trial.get("status")))
        if status is None:
            continue
        known += 1
        counts[status] += 1
        failures = meta.get("num_failures")
        if isinstance(failures, int) and not isinstance(failures, bool):
            # run again after a failure: a trial that failed and goes on (or ended well),
            # or one that failed again after its second start
            repeated += failures > (1 if status == "failed" else 0)
        last = meta.get("last_result")
        value = _first(last, metric) if isinstance(last, dict) else None
        if value is not None and (best is None or _better(value, best[0], mode)):
            best = (float(value), str(trial.get("experiment_tag") or trial.get("trial_id") or ""))
    if total is not None and total > known:
        counts["pending"] += total - known
    trials = max(known, total or 0)
    if trials < 2:
        return None
    out: dict[str, Any] = {"trials": trials, **counts, "repeated": repeated}
    if best is not None:
        out["best"] = {"value": best[0], "trial": TAG.sub("", best[1])[:MAX_TAG]}
        out["metric"] = metric if NAME.match(metric) else "metric"
    return out


class Watcher:
    """Tune's result files of one driver, read as they grow, and its experiment state."""

    def __init__(
        self,
        driver: int,
        total: int | None = None,
        metric: str = DEFAULT_METRIC,
        mode: str = "max",
        results: str | None = None,
    ) -> None:
        self.driver = driver
        self.total, self.metric, self.mode, self.results = total, metric, mode, results
        self.experiments: set[str] = set()  # driver_artifacts folders seen open
        self.offsets: dict[str, int] = {}  # result file -> bytes read (whole lines)
        self.trials: dict[str, dict[str, Any]] = {}  # result file -> its latest figures
        self.state_read: tuple[str, float, int] | None = None  # the state file last read
        self.sweep: dict[str, Any] | None = None  # the sweep's figures last said

    def open_results(self) -> list[str]:
        """The result files the driver holds open now."""
        found = []
        fds = f"/proc/{self.driver}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            return []
        for name in names:
            try:
                path = os.readlink(os.path.join(fds, name))
            except OSError:
                continue
            if os.path.basename(path) == RESULT_FILE:
                found.append(path)
        return found

    def files(self) -> list[str]:
        """Every trial's result file of the experiments this driver runs (a trial whose
        file was opened and closed between two looks is found beside the others)."""
        for path in self.open_results():
            self.experiments.add(os.path.dirname(os.path.dirname(path)))
        paths = set(self.offsets)
        for folder in self.experiments:
            try:
                trials = os.listdir(folder)
            except OSError:
                continue
            for trial in trials:
                path = os.path.join(folder, trial, RESULT_FILE)
                if os.path.isfile(path):
                    paths.add(path)
        return sorted(paths)

    def new_results(self, path: str) -> list[dict[str, Any]]:
        """The whole lines written to `path` since the last look, as results."""
        start = self.offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(MAX_READ)
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:  # no whole line yet; one longer than MAX_READ is passed over
            self.offsets[path] = start + (len(data) if len(data) == MAX_READ else 0)
            return []
        self.offsets[path] = start + end + 1
        results = []
        for line in data[:end].split(b"\n"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                results.append(value)
        return results

    def poll(self) -> list[dict[str, Any]]:
        """The progress marks' figures of what is new: each trial's latest result (with
        the trial's number and the count of trials, when there are several)."""
        new: dict[str, dict[str, Any]] = {}
        for path in self.files():
            results = self.new_results(path)
            self.trials.setdefault(path, {})
            if results:
                new[path] = self.trials[path] = figures(results[-1])
        if len(self.trials) > 1:
            order = sorted(self.trials)
            for path, mark in new.items():
                mark["trial"] = order.index(path) + 1
                mark["trials"] = len(order)
        marks = list(new.values())
        sweep = self.read_sweep()
        if sweep is not None and sweep != self.sweep:
            self.sweep = sweep
            marks.append({"source": "tune", "sweep": sweep})
            self.keep(marks[-1])
        elif self.sweep is None and marks:  # one trial (no sweep): its latest figures
            self.keep(marks[-1])
        return marks

    def state_file(self) -> str | None:
        """The newest experiment state file of the driver's experiments."""
        found: list[tuple[float, str]] = []
        for folder in self.experiments:
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                if STATE_FILE.match(name):
                    path = os.path.join(folder, name)
                    try:
                        found.append((os.stat(path).st_mtime, path))
                    except OSError:
                        continue
        return max(found)[1] if found else None

    def read_sweep(self) -> dict[str, Any] | None:
        """The sweep's figures from the newest state file when it changed (a file read
        while Tune writes it is read again at the next look); else the last ones."""
        path = self.state_file()
        if path is None:
            return self.sweep
        try:
            st = os.stat(path)
            if (path, st.st_mtime, st.st_size) == self.state_read or st.st_size > MAX_STATE:
                return self.sweep
            with open(path, "rb") as f:
                state = json.loads(f.read(MAX_STATE))
        except (OSError, ValueError):
            return self.sweep
        self.state_read = (path, st.st_mtime, st.st_size)
        return sweep_of(state, self.total, self.metric, self.mode) or self.sweep

    def keep(self, mark: dict[str, Any]) -> None:
        """The sweep's figures into the job's progress.json (`jobs list`), replaced whole."""
        if not self.results:
            return
        path = os.path.join(self.results, "progress.json")
        try:
            with open(path + ".tmp", "w") as f:
                json.dump(mark, f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def emit(marks: list[dict[str, Any]]) -> None:
    for mark in marks:
        sys.stdout.write(f"{MARK} {json.dumps(mark)}\n")
    sys.stdout.flush()


def started(pid: int) -> str | None:
    """When process `pid` started (its /proc stat), or None when it has ended (gone, or a
    zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # after the command's name, which may hold ")"
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return fields[19]


def main() -> None:
    """`python3 -c SOURCE PID`: watch the driver PID's results until it ends."""
    try:
        driver = int(sys.argv[1])
        if driver == os.getpid():  # a pid taken in the wrong process: nothing to watch
            return
        total = os.environ.get(TRIALS_ENV, "")
        watcher = Watcher(
            driver,
            total=int(total) if total.isdigit() else None,
            metric=os.environ.get(METRIC_ENV) or DEFAULT_METRIC,
            mode=os.environ.get(MODE_ENV) or "max",
            results=os.environ.get(RESULTS_ENV) or None,
        )
        first = started(driver)
        while first is not None and started(driver) == first:
            emit(watcher.poll())
            time.sleep(POLL_S)
        emit(watcher.poll())  # what the driver wrote last
    except BaseException:
        pass  # the watcher never fails the job


if __name__ == "__main__":
    main()
