"""Scale: how bring-up, the doctor, teardown and the push grow with the number of nodes.

For each N (one lab at a time: made, measured, removed), on a lab of N nodes:
- push of a small test image (one layer of fixed pseudo-random bytes) to every node that
  holds none of it, three ways: direct, star (`--star`), chain
  (`--chain`): total seconds, bytes the control machine sent and bytes the busiest
  node sent, both counted on the wire by the kernel (tests/labtools/wire.py);
- the pin itself to every node (the chain), then `provisioner up` vs `ray up` of
  the rendered file until every node is alive, with Ray's own start (bench_up.py);
- the doctor on the N nodes; `provisioner down`.
scripts/bench.py (`--rows scale --scale-nodes 3,6,10`) turns this into rows, a plot and
a table. Every measured run goes through bench_repeats.Repeats (retried, recorded).
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_doctor
import bench_push
import bench_up
from bench_repeats import Repeats

from provisioner.console import quiet
from provisioner.image.pin import Pin, read_pin
from provisioner.inventory import load_inventory
from provisioner.lab.config import LabConfig
from provisioner.lab.nodes import LabInfo, lab_down, lab_up
from provisioner.runtime.docker.push import PushOptions, push_image
from provisioner.runtime.docker.push_plan import LOAD_FACTOR

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.labtools: the lab's helpers
from tests.labtools import wire

MODES = ("direct", "star", "forward")
PROVISIONER = [sys.executable, "-m", "provisioner"]


def subnet_for(base: str, step: int) -> str:
    """The base subnet moved `step` whole subnets up (10.250.140.0/24, 1 -> .141.0/24)."""
    net = ipaddress.ip_network(base)
    return str(
        ipaddress.ip_network(f"{net.network_address + step * net.num_addresses}/{net.prefixlen}")
    )


def push_three_ways(lab: LabInfo, pin: Pin, rep: Repeats, n: int, cache: Path) -> dict[str, Any]:
    inv = load_inventory(lab.inventory)
    out: dict[str, Any] = {}
    for mode in MODES:

        def once(mode: str = mode) -> dict[str, Any]:
            bench_push.remove_pin(inv, list(inv.nodes), pin, pin.tag)
            wire.start(lab)
            opts = PushOptions(
                tag=pin.tag,
                star=mode == "star",
                chain=mode == "forward",
                parallelism=max(4, n) if mode == "direct" else 4,
                cache_dir=cache,
            )
            report = push_image(inv, None, quiet, pin=pin, opts=opts)
            counted = wire.read(lab)
            if not report.ok:
                raise SystemExit(f"push ({mode}) failed: {report.errors}")
            return {
                "seconds": round(report.seconds, 2),
                "control_wire_bytes": sum(w.from_control for w in counted.values()),
                "busiest_wire_bytes": max(w.to_nodes for w in counted.values()),
                "busiest_node": max(counted, key=lambda k: counted[k].to_nodes),
                "control_bytes_reported": report.control_bytes,
                "busiest_bytes_reported": report.busiest_node_bytes,
                "mode_taken": report.mode,
            }

        out[mode] = rep.run(f"scale/{n}/push/{mode}", once)
    bench_push.remove_pin(inv, list(inv.nodes), pin, pin.tag)
    wire.stop(lab)
    return out


def timed(fn: Callable[[], object]) -> float:
    t0 = time.monotonic()
    fn()
    return round(time.monotonic() - t0, 2)


def doctor_once(lab: LabInfo) -> float:
    """The doctor's own elapsed time on the lab (its findings do not matter here: a node
    may lack the pin before it is pushed)."""
    return float(str(bench_doctor.lab_doctor(lab, 64)["elapsed_s"]))


def down_after_up(inv_path: Path) -> float:
    """Seconds of `provisioner down` (without logs) of the cluster `provisioner up` started."""
    bench_up.down(str(inv_path))
    subprocess.run([*PROVISIONER, "up", "-i", str(inv_path)], check=True, capture_output=True)
    return timed(lambda: bench_up.down(str(inv_path)))


def measure(
    n: int,
    cfg: LabConfig,
    lock: Path,
    small: Pin,
    rep: Repeats,
    log: Callable[[str], None],
    *,
    limit: float,
    bring_up: bool,
    workdir: Path,
) -> dict[str, Any]:
    """Every scale figure at N nodes, on a lab made here and removed after."""
    result: dict[str, Any] = {"nodes": n, "lab": cfg.name, "subnet": cfg.subnet}
    t0 = time.monotonic()
    lab = lab_up(cfg, log, lock)
    result["lab_up_s"] = round(time.monotonic() - t0, 1)
    try:
        log(f"scale {n}: push of {small.size / 1e6:.0f} MB three ways")
        result["push"] = push_three_ways(lab, small, rep, n, workdir / "cache")
        log(f"scale {n}: doctor")
        result["doctor_s"] = rep.run(f"scale/{n}/doctor", lambda: doctor_once(lab))
        pin = read_pin(lock)
        short = disk_short(n, pin, cfg.state_dir, at_once=n)
        one_by_one = bool(short) and not disk_short(n, pin, cfg.state_dir, at_once=1)
        if one_by_one:  # one node loading at a time fits: direct, one node after another
            short = ""
        if bring_up and short:
            result["bring_up_skipped"] = short
            log(f"scale {n}: no bring-up rows: {short}")
        if bring_up and not short:
            inv = load_inventory(lab.inventory)
            how = "direct, one node at a time (disk)" if one_by_one else "chain"
            log(f"scale {n}: the pin ({pin.size / 1e9:.1f} GB) to every node, {how}")
            t1 = time.monotonic()
            opts = PushOptions(parallelism=1) if one_by_one else PushOptions(chain=True)
            pushed = push_image(inv, None, quiet, pin=pin, opts=opts)
            result["pin_push"] = {
                "ok": pushed.ok,
                "seconds": round(time.monotonic() - t1, 1),
                "mode": pushed.mode,
                "control_bytes": pushed.control_bytes,
                "busiest_node_bytes": pushed.busiest_node_bytes,
                "errors": {k: str(v) for k, v in pushed.errors.items()},
            }
            if pushed.ok:
                log(f"scale {n}: up vs ray up")
                ours, theirs = bench_up.side_by_side(lab.inventory, 1, limit, guard=scoped(rep, n))
                result["up"] = [None if t is None else t.__dict__ for t in ours]
                result["ray_up"] = [None if t is None else t.__dict__ for t in theirs]
                log(f"scale {n}: down")
                result["down_s"] = rep.run(f"scale/{n}/down", lambda: down_after_up(lab.inventory))
        result["failures"] = {
            k: [a.to_json() for a in v]
            for k, v in rep.failures.items()
            if k.startswith(f"scale/{n}/")
        }
    finally:
        t2 = time.monotonic()
        try:
            bench_up.down(str(lab.inventory))
        except subprocess.CalledProcessError as exc:
            log(f"scale {n}: down before removing the lab failed: {exc}")
        lab_down(cfg, log)
        result["lab_down_s"] = round(time.monotonic() - t2, 1)
    return result


SPARE_DISK = 8e9  # left free for everyone else on this machine


def disk_short(n: int, pin: Pin, where: Path, at_once: int) -> str:
    """Why the pin cannot go to n lab nodes on this disk ('' when it can), `at_once` nodes
    loading at the same time (a chain: all of them): a node's `docker load` holds the
    received tar and the unpacked layers at once (plan.LOAD_FACTOR), the others keep the
    image they loaded."""
    free = shutil.disk_usage(where if where.exists() else Path.home()).free
    need = (n + at_once * (LOAD_FACTOR - 1)) * pin.size + SPARE_DISK
    if free >= need:
        return ""
    return (
        f"the pin on {n} nodes ({at_once} loading at once) and {SPARE_DISK / 1e9:.0f} GB spare "
        f"need {need / 1e9:.0f} GB, {free / 1e9:.0f} GB free on this machine's disk"
    )


def scoped(
    rep: Repeats, n: int
) -> Callable[[str, Callable[[], bench_up.Timing]], bench_up.Timing | None]:
    """bench_up's guard, with the labels under scale/N/."""
    return lambda label, fn: rep.run(f"scale/{n}/{label}", fn)


def small_pin(lock: Path, megabytes: int) -> Pin:
    return bench_push.small_pin(read_pin(lock), megabytes)


def lab_config(base_name: str, base_subnet: str, n: int, index: int) -> LabConfig:
    return LabConfig(name=f"{base_name}-b{n}", subnet=subnet_for(base_subnet, index + 1), nodes=n)
