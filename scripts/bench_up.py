"""Benchmark: `provisioner up` vs `ray up` of the rendered file, same lab, image present.

Each is timed from its start until `ray status`, run in the head container with the
token, lists every node as active. Between runs everything is taken down, and Ray's
launcher-side state file is removed so `ray up` starts as it would on a new machine.
Usage: .venv/bin/python scripts/bench_up.py -i INVENTORY [--repeat N]
Not a test: prints one JSON line with the figures and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner.cluster import layout
from provisioner.inventory import Inventory, load_inventory
from provisioner.remote import Pool

PROVISIONER = [sys.executable, "-m", "provisioner"]
RAY = str(Path(sys.executable).parent / "ray")


def active_nodes(pool: Pool, inv: Inventory) -> int:
    name = shlex.quote(layout.container_name(inv.cluster))
    result = pool.session(inv.head).run(f"docker exec {name} ray status 2>&1", timeout=30)
    text = result.stdout
    if "Active:" not in text:
        return 0
    block = text.split("Active:", 1)[1].split("Pending:", 1)[0]
    return sum(int(m) for m in re.findall(r"^\s*(\d+) \S+", block, flags=re.M))


def timed(cmd: list[str], inv: Inventory, env: dict[str, str] | None, limit: float) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with Pool(inv) as pool:
        while active_nodes(pool, inv) < len(inv.nodes):
            if time.monotonic() - t0 > limit:
                return float("inf")
            time.sleep(0.5)
    return time.monotonic() - t0


def down(inventory: str) -> None:
    """`provisioner down` without collecting logs."""
    subprocess.run(
        [*PROVISIONER, "down", "-i", inventory, "--no-logs"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def provisioner_up(inv_path: Path, inv: Inventory, limit: float) -> float:
    """Seconds for `provisioner up` (from a stopped cluster) until all nodes are listed alive."""
    return timed([*PROVISIONER, "up", "-i", str(inv_path)], inv, None, limit)


def forget_launcher_state(inv: Inventory) -> None:
    from ray.autoscaler._private.local.config import get_state_path

    Path(get_state_path(inv.cluster)).unlink(missing_ok=True)


def side_by_side(inv_path: Path, repeat: int, limit: float) -> tuple[list[float], list[float]]:
    """`provisioner up` then `ray up` of the rendered file, `repeat` times; all down after."""
    inv = load_inventory(inv_path)
    ours: list[float] = []
    theirs: list[float] = []
    with tempfile.TemporaryDirectory() as home:
        yaml_path = Path(home) / "cluster.yaml"
        subprocess.run(
            [*PROVISIONER, "render", "-i", str(inv_path), "-o", str(yaml_path)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for _ in range(repeat):
            down(str(inv_path))
            ours.append(provisioner_up(inv_path, inv, limit))
            down(str(inv_path))
            forget_launcher_state(inv)
            theirs.append(timed([RAY, "up", "-y", str(yaml_path)], inv, env, limit))
            subprocess.run(
                [RAY, "down", "-y", str(yaml_path)],
                env=env,
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            down(str(inv_path))  # Ray's `ray down` may leave workers (see render.py's header)
            forget_launcher_state(inv)
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-i", "--inventory", type=Path, required=True)
    parser.add_argument("--limit", type=float, default=600)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    ours, theirs = side_by_side(args.inventory, args.repeat, args.limit)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(
        json.dumps(
            {
                "nodes": len(load_inventory(args.inventory).nodes),
                "provisioner_up_s": [round(x, 1) for x in ours],
                "ray_up_s": [round(x, 1) for x in theirs],
                "median_ratio": round(a / b, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
