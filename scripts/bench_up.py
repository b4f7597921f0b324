"""Benchmark: `provisioner up` vs `ray up` of the rendered file, same lab, image present.

Each is timed from start until every node is alive (`ray status` in the head container
lists all nodes). Usage: .venv/bin/python scripts/bench_up.py -i INVENTORY
Not a test: prints one JSON line with both figures and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provisioner.cluster import headprobe
from provisioner.inventory import load_inventory
from provisioner.remote import Pool

PROVISIONER = [sys.executable, "-m", "provisioner"]
RAY = str(Path(sys.executable).parent / "ray")


def all_alive(inventory_path: Path) -> bool:
    inv = load_inventory(inventory_path)
    with Pool(inv) as pool:
        try:
            nodes = headprobe.gcs_nodes(pool.session(inv.head), inv, timeout=20)
        except Exception:
            return False
    return {n.address for n in inv.nodes} <= headprobe.alive_addresses(nodes)


def timed(cmd: list[str], inventory: Path, env: dict[str, str] | None, limit: float) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    while not all_alive(inventory):
        if time.monotonic() - t0 > limit:
            return float("inf")
        time.sleep(1)
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-i", "--inventory", type=Path, required=True)
    parser.add_argument("--limit", type=float, default=600)
    args = parser.parse_args()
    inv = str(args.inventory)
    subprocess.run([*PROVISIONER, "down", "-i", inv, "--no-logs"], check=True)
    ours = timed([*PROVISIONER, "up", "-i", inv], args.inventory, None, args.limit)
    subprocess.run([*PROVISIONER, "down", "-i", inv, "--no-logs"], check=True)
    with tempfile.TemporaryDirectory() as home:
        yaml_path = Path(home) / "cluster.yaml"
        subprocess.run([*PROVISIONER, "render", "-i", inv, "-o", str(yaml_path)], check=True)
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        theirs = timed([RAY, "up", "-y", str(yaml_path)], args.inventory, env, args.limit)
        subprocess.run([RAY, "down", "-y", str(yaml_path)], env=env, check=False)
    print(json.dumps({"provisioner_up_s": ours, "ray_up_s": theirs, "ratio": ours / theirs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
