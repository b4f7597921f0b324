"""What the watcher of Tune's results (`provisioner.jobs.tune_watch`) costs beside a driver.

A stand-in driver holds, as Tune's does, one result.json per trial open in Ray's layout
(and 200 more file descriptors, as a Ray driver has), writing one ~5 KB result per trial
per second; the watcher runs beside it exactly as the entrypoint starts it. Prints the
watcher's CPU seconds over the run.

    python scripts/bench_tune_watch.py [--seconds 60] [--trials 4]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time

from provisioner.jobs.watch import compact_source

DRIVER = """
import json, os, sys, time
root, trials, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
files = []
for t in range(trials):
    os.makedirs(f"{root}/T{t}")
    files.append(open(f"{root}/T{t}/result.json", "at"))
extra = [open(os.devnull) for _ in range(200)]
for i in range(seconds):
    for f in files:
        r = {"training_iteration": i, "num_env_steps_sampled_lifetime": 4000 * i,
             "env_runners": {"episode_return_mean": 1.0}, "config": {"x": "y" * 5000}}
        f.write(json.dumps(r) + "\\n")
        f.flush()
    time.sleep(1)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--trials", type=int, default=4)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = f"{tmp}/session/artifacts/TS/EXP/driver_artifacts"
        args = [root, str(opts.trials), str(opts.seconds)]
        driver = subprocess.Popen([sys.executable, "-c", DRIVER, *args])
        started = time.monotonic()
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", compact_source(), str(driver.pid)],
            stdout=subprocess.DEVNULL,
        )
        driver.wait()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        watcher.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    wall = time.monotonic() - started
    print(
        f"watcher: {cpu:.2f} CPU s over {wall:.0f} s beside a driver of {opts.trials} trials "
        f"({100 * cpu / wall:.2f}% of one core)"
    )


if __name__ == "__main__":
    main()
