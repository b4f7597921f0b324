"""Benchmark: this machine's CPU per GiB pushed through one SSH session, by cipher.

The same bytes (1 GiB by default, random, in 1 MiB chunks) go into `cat > /dev/null` on
a node through:
- provisioner's Session (paramiko, AES-GCM preferred: remote/session.py);
- the same Session with paramiko's own order (AES-CTR and HMAC-SHA2-256 first);
- OpenSSH's client (its own choice of cipher), fed by this process.
Interleaved, `--repeat` times; CPU is this process's and its children's (user + system),
so paramiko's thread and OpenSSH's client are both counted, and the node's side is not.

Usage: .venv/bin/python scripts/bench_ssh_cpu.py -i INVENTORY [--mib 1024] [--repeat 3]
       [--out bench-results/ssh-cpu.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from bench import shown_path
from bench_link import ssh_argv

from provisioner.inventory import Inventory, Node, load_inventory
from provisioner.remote import Pool
from provisioner.remote import session as session_mod

MIB = 1 << 20


def cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def chunks(mib: int) -> Iterator[bytes]:
    block = os.urandom(MIB)
    for _ in range(mib):
        yield block


def through_session(inv: Inventory, mib: int, paramiko_order: bool) -> dict[str, Any]:
    # paramiko's own order: provisioner's reordering left out for this connection
    order = mock.patch.object(session_mod, "preferred_ciphers", lambda c: c)
    with order if paramiko_order else contextlib.nullcontext(), Pool(inv) as pool:
        session = pool.session(inv.head)
        session.run("true", timeout=30).check()
        cipher = session._transport().local_cipher
        c0, t0 = cpu_s(), time.monotonic()
        session.run_streaming_stdin("cat > /dev/null", chunks(mib), timeout=600).check()
        return {"cipher": cipher, "cpu_s": cpu_s() - c0, "wall_s": time.monotonic() - t0}


def through_openssh(node: Node, mib: int) -> dict[str, Any]:
    argv = ssh_argv(node, "cat > /dev/null")  # the link bench's OpenSSH command line
    c0, t0 = cpu_s(), time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE)
    assert proc.stdin is not None
    for block in chunks(mib):
        proc.stdin.write(block)
    proc.stdin.close()
    if proc.wait() != 0:
        raise SystemExit(f"ssh failed (exit {proc.returncode})")
    return {"cipher": "OpenSSH's choice", "cpu_s": cpu_s() - c0, "wall_s": time.monotonic() - t0}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-i", "--inventory", type=Path, required=True)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    inv = load_inventory(args.inventory)
    runs: dict[str, list[dict[str, Any]]] = {"provisioner": [], "paramiko-order": [], "openssh": []}
    for _ in range(args.repeat):
        runs["provisioner"].append(through_session(inv, args.mib, paramiko_order=False))
        runs["paramiko-order"].append(through_session(inv, args.mib, paramiko_order=True))
        runs["openssh"].append(through_openssh(inv.head, args.mib))
    gib = args.mib / 1024

    def summary(rs: list[dict[str, Any]]) -> dict[str, Any]:
        per = [r["cpu_s"] / gib for r in rs]
        return {
            "cipher": rs[0]["cipher"],
            "cpu_s_per_gib": round(statistics.median(per), 2),
            "cpu_s_per_gib_range": [round(min(per), 2), round(max(per), 2)],
            "wall_s": [round(r["wall_s"], 2) for r in rs],
        }

    doc = {
        # no machine path in a committed record: the inventory as bench.py keeps paths
        "command": " ".join(
            [
                "python",
                *(shown_path(args.inventory) if a == str(args.inventory) else a for a in sys.argv),
            ]
        ),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "mib": args.mib,
        "repeat": args.repeat,
        "results": {k: summary(v) for k, v in runs.items()},
    }
    text = json.dumps(doc, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
