"""`make soak`: one PPO run of about 15 minutes with `submit --retries`, under a storm of
at least 10 faults of 6 kinds at random moments (tests/labtools/storm.py), on a lab of
its own. The run must end SUCCEEDED with every result file home and verified.

The record goes to bench-results/soak.json: each fault's kind, when it happened, the time
until training went on, the iterations computed twice, and whether the learning curve
stayed continuous; then the targets and whether they were met.

    make soak                      # defaults: 10 faults, seed 1
    make soak SOAK_ARGS="--faults 12 --seed 7"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from provisioner.image.build import BuildOptions, build_image
from provisioner.lab.config import LabConfig
from provisioner.lab.images import ensure_base_image
from provisioner.lab.nodes import lab_down, lab_up

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.labtools: the lab's helpers
from tests.labtools.storm import Storm, schedule

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "images"
CHECKPOINT_EVERY = 2


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "provisioner", *args], capture_output=True, text=True, check=False
    )


def verified_home(home: Path) -> dict[str, Any]:
    """Every file the manifest lists is here with its recorded sha256."""
    manifest = json.loads((home / ".pulled.json").read_text())
    bad = [
        name
        for name, entry in manifest.items()
        if not (home / name).is_file()
        or hashlib.sha256((home / name).read_bytes()).hexdigest() != entry["sha256"]
    ]
    return {"files": len(manifest), "bad": bad}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--faults", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--iterations", type=int, default=320, help="the run's --max-iterations")
    p.add_argument("--retries", type=int, default=None, help="default: faults + 2")
    p.add_argument("--gap", type=float, nargs=2, default=(15.0, 45.0), metavar=("MIN", "MAX"))
    p.add_argument("--lab", default="soak")
    p.add_argument("--subnet", default="10.250.150.0/24")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "soak.json")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "soak")
    p.add_argument("--keep-lab", action="store_true")
    a = p.parse_args()
    retries = a.retries if a.retries is not None else a.faults + 2

    cfg = LabConfig(name=a.lab, subnet=a.subnet, nodes=3)
    opts = BuildOptions(
        images_dir=IMAGES,
        wheelhouse=IMAGES / ".wheelhouse",
        lock_path=IMAGES / "image.lock.json",
        base=ensure_base_image(print),
    )
    pin = build_image(opts, print).lock_path
    info = lab_up(cfg, print, pin)
    started = time.time()
    try:
        up = cli("up", "-i", str(info.inventory))
        if up.returncode != 0:
            print(up.stderr[-3000:])
            return 1
        kinds = schedule(a.faults, a.seed)
        args = ["--env-runners", "2", "--train-batch", "1000"]
        args += ["--checkpoint-every", str(CHECKPOINT_EVERY), "--target-return", "1e9"]
        args += ["--max-env-steps", "100000000", "--max-iterations", str(a.iterations)]
        storm = Storm(
            lab=info,
            inventory=info.inventory,
            results=a.work / "results",
            playbook=ROOT / "playbooks" / "ppo_cartpole.py",
            args=args,
            retries=retries,
            work=a.work,
            seed=a.seed,
        )
        storm.start()
        error = None
        try:
            storm.run(kinds, gap=tuple(a.gap), warmup=8, timeout=900)  # type: ignore[arg-type]
        except Exception as exc:  # recorded, and the run is still waited for
            error = f"{type(exc).__name__}: {exc}"
            print("storm stopped:", error)
        doc = storm.finish(3600)
        home = a.work / "results" / str(doc.get("job_id") or storm.watch.job())
        check = verified_home(home)
        rows = (home / "metrics.csv").read_text().splitlines()[1:]
        iterations = [int(r.split(",")[0]) for r in rows]
        records = storm.to_json()
        lost_ok = all(r["iterations_lost"] <= CHECKPOINT_EVERY for r in records)
        continuous = all(r["continuous"] is not False for r in records)
        record = {
            "what": "one PPO CartPole run with submit --retries under a storm of faults",
            "command": f"make soak SOAK_ARGS='--faults {a.faults} --seed {a.seed}'",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": f"{platform.machine()}, {platform.python_version()}",
            "duration_s": round(time.time() - started, 1),
            "retries": retries,
            "checkpoint_every": CHECKPOINT_EVERY,
            "status": doc.get("status") or (doc.get("error") or {}).get("message"),
            "attempts": len(json.loads((home / "attempts.json").read_text())),
            "iterations": iterations[-1] if iterations else 0,
            "metrics_rows_contiguous": iterations == list(range(1, len(iterations) + 1)),
            "results_home": check,
            "storm_error": error,
            "faults": records,
            "kinds": sorted({r["kind"] for r in records}),
            "targets": {
                "succeeded": doc.get("status") == "SUCCEEDED",
                "no_result_lost_or_corrupted": not check["bad"],
                "at_most_checkpoint_every_lost_per_fault": lost_ok,
                "every_recovery_continuous": continuous,
                "at_least_10_faults_of_5_kinds": len(records) >= 10
                and len({r["kind"] for r in records}) >= 5,
            },
        }
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(record, indent=1) + "\n")
        print(json.dumps(record["targets"], indent=1))
        print(f"record: {a.out}")
        return 0 if all(record["targets"].values()) else 1
    finally:
        cli("down", "-i", str(info.inventory), "--no-logs", "--yes")
        if not a.keep_lab:
            lab_down(cfg)


if __name__ == "__main__":
    sys.exit(main())
