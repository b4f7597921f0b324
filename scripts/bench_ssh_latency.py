"""Benchmark one SSH command's latency: provisioner's sessions against OpenSSH's client.

    .venv/bin/python scripts/bench_ssh_latency.py [--lab NAME] [--repeat 30]

On the lab's head node, each repeat one after the other (medians, in seconds):
- `fresh`: a new connection (TCP, key exchange, authentication) and its first command
  (`true`), against OpenSSH's `ssh NODE true`;
- `next`: one more command on a connection already open, against OpenSSH's own reuse of
  a connection (`ssh -S SOCKET NODE true` through a ControlMaster, as Ansible runs).
Prints one JSON document; scripts/bench.py puts it in the record (the `ssh` rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from provisioner.inventory import Node, load_inventory
from provisioner.lab.nodes import LabInfo, load_lab
from provisioner.remote.session import Session


def _median(fn: Callable[[], float], repeat: int) -> float:
    return statistics.median(fn() for _ in range(repeat))


def _ssh(cmd: list[str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, check=False)
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {proc.stderr.decode(errors='replace')[-300:]}")
    return elapsed


def connect_and_run_true(node: Node) -> None:
    """A new connection to `node`, as every command makes one, its first command, closed."""
    session = Session.connect(node)
    try:
        session.run("true", timeout=30).check()
    finally:
        session.close()


def measure(lab: LabInfo, repeat: int) -> dict[str, float]:
    """Median seconds: ours and OpenSSH's, a fresh connection's first command and a
    command on an open connection, on the lab's head node."""
    inventory = load_inventory(lab.inventory)
    node = inventory.head
    target = lab.nodes[0]

    def fresh() -> float:
        t0 = time.monotonic()
        connect_and_run_true(node)
        return time.monotonic() - t0

    session = Session.connect(node)
    try:

        def again() -> float:
            t0 = time.monotonic()
            session.run("true", timeout=30).check()
            return time.monotonic() - t0

        again()
        ours_next = _median(again, repeat)
    finally:
        session.close()
    ours_fresh = _median(fresh, repeat)
    openssh_fresh = _median(lambda: _ssh([*lab.ssh_command(target), "true"]), repeat)
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp:
        control = str(Path(tmp) / "control")
        master = [*lab.ssh_command(target, "-o", "ControlMaster=yes", "-S", control), "-N"]
        proc = subprocess.Popen(master, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            muxed = [*lab.ssh_command(target, "-o", "ControlMaster=no", "-S", control), "true"]
            for _ in range(100):  # until the master listens
                if subprocess.run(muxed, capture_output=True, check=False).returncode == 0:
                    break
                time.sleep(0.1)
            openssh_next = _median(lambda: _ssh(muxed), repeat)
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "fresh_s": ours_fresh,
        "openssh_fresh_s": openssh_fresh,
        "next_s": ours_next,
        "openssh_next_s": openssh_next,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default=None)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    found = measure(load_lab(args.lab), args.repeat)
    print(json.dumps({k: round(v, 4) for k, v in found.items()}, indent=2))


if __name__ == "__main__":
    main()
