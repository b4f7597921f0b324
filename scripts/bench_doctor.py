"""Benchmark the doctor: the 3-node lab, then N SSH endpoints against an OpenSSH fan-out.

    .venv/bin/python scripts/bench_doctor.py [--lab NAME] [--endpoints 50] [--parallel 32]

N endpoints are one extra sshd inside the lab's head node listening on N ports (each
port is one "node" to the doctor). The baseline is `ssh HOST true` to every endpoint
with the same parallelism. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from provisioner.doctor import run_doctor
from provisioner.inventory import load_inventory
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import load_lab

BASE_PORT = 2201


PORTS_PER_SSHD = 16  # one sshd listens on at most 16 sockets


def start_endpoints(container: str, count: int) -> None:
    for first in range(0, count, PORTS_PER_SSHD):
        last = min(first + PORTS_PER_SSHD, count)
        ports = " ".join(f"-p {BASE_PORT + i}" for i in range(first, last))
        pidfile = f"/run/bench-sshd-{first}.pid"
        rc, out = exec_rc(
            container, f"/usr/sbin/sshd -o AddressFamily=inet -o PidFile={pidfile} {ports}"
        )
        if rc != 0:
            raise SystemExit(f"cannot start the bench sshd: {out}")


def stop_endpoints(container: str) -> None:
    exec_rc(container, "for f in /run/bench-sshd-*.pid; do kill $(cat $f); rm -f $f; done")


def bench_inventory(
    lab_inventory: Path, known_hosts: Path, address: str, count: int, out: Path
) -> Path:
    document = yaml.safe_load(lab_inventory.read_text())
    document["ssh"]["key"] = str(lab_inventory.parent / document["ssh"]["key"])
    document["ssh"]["known_hosts"] = str(known_hosts)
    document["ssh"]["host_key_policy"] = "accept-new"
    document["cluster"] = "bench"
    document["head"] = {"name": f"ep-{BASE_PORT}", "address": address, "port": BASE_PORT}
    document["workers"] = [
        {"name": f"ep-{BASE_PORT + i}", "address": address, "port": BASE_PORT + i}
        for i in range(1, count)
    ]
    out.write_text(yaml.safe_dump(document))
    return out


def openssh_fan_out(
    key: Path, known_hosts: Path, user: str, address: str, count: int, parallel: int
) -> float:
    def one(port: int) -> tuple[int, str]:
        proc = subprocess.run(
            [
                "ssh",
                "-i",
                str(key),
                "-p",
                str(port),
                "-o",
                f"UserKnownHostsFile={known_hosts}",
                "-o",
                "StrictHostKeyChecking=accept-new",
                "-o",
                "BatchMode=yes",
                f"{user}@{address}",
                "true",
            ],
            capture_output=True,
            check=False,
        )
        return proc.returncode, proc.stderr.decode(errors="replace")

    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(one, range(BASE_PORT, BASE_PORT + count)))
    if any(c != 0 for c, _ in codes):
        failed = [err for c, err in codes if c != 0]
        raise SystemExit(f"OpenSSH fan-out failed on {len(failed)} endpoint(s): {failed[0]}")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default=None)
    parser.add_argument("--endpoints", type=int, default=50)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/provisioner-bench-doctor"))
    args = parser.parse_args()
    lab = load_lab(args.lab)
    args.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, object] = {}
    report = run_doctor(load_inventory(lab.inventory), parallelism=args.parallel)
    result["lab_3_nodes"] = {
        "elapsed_s": round(report.elapsed_s, 2),
        "errors": len(report.errors),
        "round_trips_per_node": report.round_trips,
        "timings_s": report.timings,
    }
    head = lab.nodes[0]
    known = args.workdir / "known_hosts"
    known.unlink(missing_ok=True)
    start_endpoints(head.container, args.endpoints)
    try:
        time.sleep(0.5)
        inventory = bench_inventory(
            lab.inventory, known, head.address, args.endpoints, args.workdir / "inventory.yaml"
        )
        openssh_fan_out(
            lab.key, known, head.user, head.address, args.endpoints, args.parallel
        )  # record keys
        baseline = openssh_fan_out(
            lab.key, known, head.user, head.address, args.endpoints, args.parallel
        )
        inv = load_inventory(inventory)
        full = run_doctor(inv, parallelism=args.parallel)
        facts_only = run_doctor(inv, parallelism=args.parallel, reachability=False)
    finally:
        stop_endpoints(head.container)
    result["endpoints"] = {
        "count": args.endpoints,
        "parallel": args.parallel,
        "openssh_true_s": round(baseline, 2),
        "doctor_s": round(full.elapsed_s, 2),
        "doctor_no_reachability_s": round(facts_only.elapsed_s, 2),
        "ratio": round(full.elapsed_s / baseline, 2),
        "ratio_no_reachability": round(facts_only.elapsed_s / baseline, 2),
        "round_trips_per_node": full.round_trips,
        "timings_s": {k: round(v, 2) for k, v in full.timings.items()},
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
