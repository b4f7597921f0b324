"""What TLS on Ray's channels costs a PPO run: env steps/s with TLS on and off, on the same
lab cluster, each run from a fresh `up` (a change of `ray.tls` takes effect when Ray
starts), interleaved so that a busy moment of the machine hits both alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "playbooks" / "ppo_cartpole.py"


def inventory_with_tls(inventory: Path, target: Path, *, on: bool) -> Path:
    """A copy of the lab's inventory (paths made absolute) with `ray: {tls: ON}`."""
    document = yaml.safe_load(inventory.read_text())
    base = inventory.parent
    for key in ("key", "known_hosts"):
        if key in document.get("ssh", {}):
            document["ssh"][key] = str((base / document["ssh"][key]).resolve())
    if document.get("image", {}).get("lock"):
        document["image"]["lock"] = str((base / document["image"]["lock"]).resolve())
    document.setdefault("ray", {})["tls"] = on
    target.write_text(yaml.safe_dump(document))
    return target


def _cli(*args: str, log: Path) -> subprocess.CompletedProcess[str]:
    with open(log, "a") as err:
        return subprocess.run(
            [sys.executable, "-m", "provisioner", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            check=False,
        )


def steps_per_s(
    inventory: Path, runners: int, steps: int, batch: int, results: Path, log: Path
) -> float:
    """Ray restarted (down, up) as the inventory says, then one PPO run with `runners`
    env runners: its env steps/s over the whole run (summary.json)."""
    _cli("down", "-i", str(inventory), "--no-logs", log=log)
    up = _cli("up", "-i", str(inventory), log=log)
    if up.returncode != 0:
        raise RuntimeError(f"up failed (rc {up.returncode}); see {log}")
    job = _cli(
        "submit", "-i", str(inventory), "--results", str(results), "--json", str(PLAYBOOK),
        "--", "--env-runners", str(runners), "--max-env-steps", str(steps),
        "--train-batch", str(batch), "--target-return", "100000",
        log=log,
    )  # fmt: skip
    if job.returncode != 0:
        raise RuntimeError(f"the PPO job failed (rc {job.returncode}); see {log}")
    job_id = json.loads(job.stdout)["job_id"]
    summary = json.loads((results / job_id / "summary.json").read_text())
    return float(summary["env_steps_per_s"])
