"""The `make bench` harness on the smallest sizes, so it cannot rot.

`make bench-smoke` runs it, not `make test` (it takes 6-13 minutes of the suite's 2
cores): run it after changing scripts/bench*.py. Every row group runs once on a lab of
its own, as `make bench` makes one (3 nodes, started and removed by the harness): 3 SSH
endpoints, one repeat, a 16 MB test image instead of the pin for the push rows, 1 and 2
env runners on a tiny training budget. The test asserts the harness writes every row
with its figures, its target and how to re-run it; it asserts no timing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.lab.config import LabConfig
from provisioner.lab.nodes import lab_down

BENCH = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"
NAME = os.environ.get("PROVISIONER_BENCH_LAB_NAME", "e2e-bench")
SUBNET = os.environ.get("PROVISIONER_BENCH_LAB_SUBNET", "10.250.104.0/24")
NODES = 3  # what the harness starts

pytestmark = pytest.mark.bench


def test_bench_harness_writes_every_row(image_pin: Path, tmp_path: Path) -> None:
    lab_down(LabConfig(name=NAME, subnet=SUBNET, nodes=NODES))  # a leftover of a killed run
    out = tmp_path / "results"
    args = ["--lab", NAME, "--subnet", SUBNET, "--lock", str(image_pin), "--out", str(out)]
    args += ["--repeat", "1", "--endpoints", "3", "--delays", "0,50", "--small-image", "16"]
    args += ["--runners", "2", "--train-steps", "1000", "--train-batch", "500"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]

    doc = json.loads((out / "bench.json").read_text())
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["memory_gib"] > 0
    rows = {r["benchmark"]: r for r in doc["rows"]}
    n = NODES
    expected = [
        f"bring-up, {n} nodes: until every node is alive",
        f"bring-up, {n} nodes: until the command is done and every node alive",
        f"bring-up, {n} nodes: Ray's own start",
        f"bring-up, {n} nodes: what `up` adds to Ray's own start",
        "fan-out, 3 endpoints: doctor vs OpenSSH",
        "fan-out, 3 endpoints: doctor vs Ansible",
        "fan-out, 3 endpoints: doctor's facts round vs facts.sh alone",
        "fan-out, 3 endpoints: facts.sh alone vs Ansible",
        "fan-out, 3 endpoints: control-machine CPU, doctor vs Ansible",
        "fan-out, 3 endpoints: doctor's facts round vs OpenSSH running facts.sh",
        "fan-out, 3 endpoints: the node's CPU, doctor's facts round vs facts.sh alone",
        "SSH's cost on the node against facts.sh's, one at a time",
        "SSH: a new connection and its first command",
        "SSH: a command on an open connection",
        f"latency: doctor, {n} nodes, +0 ms",
        f"latency: up, {n} nodes, +0 ms",
        f"latency: doctor, {n} nodes, +50 ms",
        f"latency: up, {n} nodes, +50 ms",
        "push throughput, 1 node",
        "re-push, 1 node",
        "push at 50 Mbit/s vs pipe",
        "push at 50 Mbit/s vs gzip pipe",
        "push at 50 Mbit/s, cached, vs gzip pipe",
        "push, lab link",
        f"control-machine bytes, {n} nodes",
        "training: env steps/s, 1 vs 2 env runners",
        "PPO env steps/s: TLS on Ray's channels (the default) vs off",
    ]
    assert sorted(rows) == sorted(expected)
    no_baseline = {"re-push, 1 node", f"latency: up, {n} nodes, +0 ms"}
    for name, row in rows.items():
        assert row["what"] and row["rerun"].endswith(f"--rows {row['group']}"), name
        assert len(row["ours"]["runs"]) >= 1, name
        if name in no_baseline:
            continue
        assert row["ours"]["median"] > 0, name
        assert row["baseline"] is not None and row["baseline"]["median"] > 0, name
        # a plain figure (up-overhead-s) has a value in its ratio's place
        assert row["ratio"] is not None or row.get("value") is not None, name
    assert rows["re-push, 1 node"]["ours"]["runs"] == [0.0]  # the node holds the image

    # the harness removed the lab it made
    assert not LabConfig(name=NAME, subnet=SUBNET, nodes=NODES).state_dir.exists()

    table = (out / "bench.md").read_text()
    assert f"{doc['machine']['cores']} cores" in table
    for name in expected:
        assert f"| {name} |" in table
