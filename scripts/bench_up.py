"""Benchmark: `provisioner up` vs `ray up` of the rendered file, same lab, image present.

Each run is timed from the command's start to two moments:
- alive: the last node registered alive, by the GCS's own clock (each node's
  start_time_ms, read in the head container once all are listed; the lab's containers
  share this machine's clock), so polling costs nothing to either tool;
- returned: the command exited. `ray up` exits before its workers join (its autoscaler
  starts them afterwards), so for `ray up` the wait a user sees is the later of the two.
The Ray start itself (the head container's start to the last node registered) is
recorded too: no launcher can beat it.

Between runs everything is taken down, and Ray's launcher-side state file is removed so
`ray up` starts as it would on a new machine.
Usage: .venv/bin/python scripts/bench_up.py -i INVENTORY [--repeat N]
Not a test: prints one JSON line with the figures and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from provisioner.inventory import Inventory, load_inventory
from provisioner.node.token import ray_container
from provisioner.remote import Pool

PROVISIONER = [sys.executable, "-m", "provisioner"]
RAY = str(Path(sys.executable).parent / "ray")

# Run in the head's Ray container: every node the GCS knows, with its registration time.
GCS_NODES = """
import json
from ray._raylet import GcsClient
from ray.core.generated.gcs_pb2 import GcsNodeInfo
nodes = GcsClient(address=ADDRESS).get_all_node_info(timeout=10).values()
print(json.dumps([
    {"ip": n.node_manager_address, "alive": n.state == GcsNodeInfo.GcsNodeState.ALIVE,
     "start_ms": n.start_time_ms}
    for n in nodes
]))
"""


@dataclass(frozen=True)
class Timing:
    """Seconds from a command's start: it returned; the last node registered alive; and
    Ray's own part (the head container's start to the last node registered)."""

    returned: float
    alive: float
    ray_start: float

    @property
    def ready(self) -> float:
        """When the user has the whole cluster: both returned and every node alive."""
        return max(self.returned, self.alive)


def _exec(pool: Pool, inv: Inventory, command: str, stdin: bytes | None = None) -> str:
    result = pool.session(inv.head).run(command, timeout=60, stdin=stdin)
    return result.stdout


def gcs_nodes(pool: Pool, inv: Inventory) -> list[dict[str, Any]]:
    name = shlex.quote(ray_container(inv))
    address = f"{inv.head.address}:{inv.ports.gcs}"
    script = GCS_NODES.replace("ADDRESS", repr(address)).encode()
    out = _exec(pool, inv, f"docker exec -i {name} python - 2>/dev/null", stdin=script)
    for line in reversed(out.splitlines()):
        if line.startswith("["):
            nodes: list[dict[str, Any]] = json.loads(line)
            return nodes
    return []


def head_started_at(pool: Pool, inv: Inventory) -> float:
    """The head container's start, in seconds since the epoch."""
    name = shlex.quote(ray_container(inv))
    text = _exec(pool, inv, f"docker inspect -f '{{{{.State.StartedAt}}}}' {name}").strip()
    stamp, _, fraction = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(stamp + "+00:00").timestamp() + float(f"0.{fraction or 0}")


def timed(cmd: list[str], inv: Inventory, env: dict[str, str] | None, limit: float) -> Timing:
    t0_wall, t0 = time.time(), time.monotonic()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    returned = time.monotonic() - t0
    addresses = {n.address for n in inv.nodes}
    with Pool(inv) as pool:
        while True:
            alive = {n["ip"]: n for n in gcs_nodes(pool, inv) if n["alive"]}
            if addresses <= set(alive):
                break
            if time.monotonic() - t0 > limit:
                inf = float("inf")
                return Timing(returned, inf, inf)
            time.sleep(0.5)
        head_start = head_started_at(pool, inv)
    last = max(alive[a]["start_ms"] for a in addresses) / 1000
    return Timing(returned, last - t0_wall, last - head_start)


def down(inventory: str) -> None:
    """`provisioner down` without collecting logs."""
    subprocess.run(
        [*PROVISIONER, "down", "-i", inventory, "--no-logs"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def provisioner_up(inv_path: Path, inv: Inventory, limit: float) -> Timing:
    """`provisioner up` from a stopped cluster."""
    return timed([*PROVISIONER, "up", "-i", str(inv_path)], inv, None, limit)


def forget_launcher_state(inv: Inventory) -> None:
    from ray.autoscaler._private.local.config import get_state_path

    Path(get_state_path(inv.cluster)).unlink(missing_ok=True)


Guard = Callable[[str, Callable[[], Timing]], Timing | None]


def _unguarded(_label: str, fn: Callable[[], Timing]) -> Timing | None:
    return fn()


def side_by_side(
    inv_path: Path, repeat: int, limit: float, guard: Guard = _unguarded
) -> tuple[list[Timing | None], list[Timing | None]]:
    """`provisioner up` then `ray up` of the rendered file, `repeat` times; all down after.
    Each run goes through `guard(label, run)` (bench.py's: retried, failures recorded;
    None for a run given up)."""
    inv = load_inventory(inv_path)
    ours: list[Timing | None] = []
    theirs: list[Timing | None] = []
    with tempfile.TemporaryDirectory() as home:
        yaml_path = Path(home) / "cluster.yaml"
        subprocess.run(
            [*PROVISIONER, "render", "-i", str(inv_path), "-o", str(yaml_path)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env = {"HOME": home, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}

        def ray_down() -> None:
            subprocess.run(
                [RAY, "down", "-y", str(yaml_path)],
                env=env,
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            down(str(inv_path))  # Ray's `ray down` may leave workers (see render.py's header)
            forget_launcher_state(inv)

        def ours_once() -> Timing:
            down(str(inv_path))
            return provisioner_up(inv_path, inv, limit)

        def theirs_once() -> Timing:
            ray_down()
            return timed([RAY, "up", "-y", str(yaml_path)], inv, env, limit)

        for _ in range(repeat):
            ours.append(guard("bring-up/up", ours_once))
            theirs.append(guard("bring-up/ray up", theirs_once))
            ray_down()
    return ours, theirs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-i", "--inventory", type=Path, required=True)
    parser.add_argument("--limit", type=float, default=600)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    ours, theirs = side_by_side(args.inventory, args.repeat, args.limit)

    def figures(runs: list[Timing | None]) -> dict[str, list[float]]:
        return {
            k: [round(getattr(t, k), 2) for t in runs if t is not None]
            for k in ("alive", "returned", "ready", "ray_start")
        }

    a = statistics.median(t.alive for t in ours if t is not None)
    b = statistics.median(t.alive for t in theirs if t is not None)
    print(
        json.dumps(
            {
                "nodes": len(load_inventory(args.inventory).nodes),
                "provisioner_up_s": figures(ours),
                "ray_up_s": figures(theirs),
                "median_ratio_alive": round(a / b, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
