"""Scaling benchmark: PPO with 1, 2, ... N env runners on a cluster, as a table and a plot.

    .venv/bin/python scripts/bench_scaling.py -i INVENTORY [--max-runners N] [-- PLAYBOOK ARGS]
    .venv/bin/python scripts/bench_scaling.py --address URL --token-file PATH ...

Submits playbooks/scaling.py with `provisioner submit`; the table (env steps/s, time to
the target return, nodes used per run) is printed, and results/JOB/scaling.png drawn.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from provisioner.cli import run

PLAYBOOK = Path(__file__).resolve().parents[1] / "playbooks" / "scaling.py"


def measure(
    inventory: Path, max_runners: int, playbook_args: list[str], results: Path, log: Path
) -> list[dict[str, Any]]:
    """Run this script as `provisioner submit` would; the scaling table's rows (one per count).

    The job's output goes to `log`; the table comes from results/JOB/scaling.json.
    """
    cmd = [sys.executable, __file__, "-i", str(inventory), "--max-runners", str(max_runners)]
    cmd += ["--results", str(results), "--", *playbook_args]
    with open(log, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    tables = sorted(results.glob("*/scaling.json"), key=lambda p: p.stat().st_mtime)
    if rc != 0 or not tables:
        raise SystemExit(f"the scaling job failed (rc {rc}); its output: {log}")
    rows: list[dict[str, Any]] = json.loads(tables[-1].read_text())
    return rows


def main(argv: list[str]) -> int:
    own, _, rest = (
        (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :])
        if "--" in argv
        else (argv, "", [])
    )
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-i", "--inventory")
    p.add_argument("--address")
    p.add_argument("--token-file")
    p.add_argument("--max-runners", type=int)
    p.add_argument("--results", default="results")
    args = p.parse_args(own)
    cli = ["submit", "--results", args.results]
    for flag, value in (
        ("-i", args.inventory),
        ("--address", args.address),
        ("--token-file", args.token_file),
    ):
        if value:
            cli += [flag, value]
    playbook_args = list(rest)
    if args.max_runners:
        playbook_args += ["--max-runners", str(args.max_runners)]
    return run([*cli, str(PLAYBOOK), "--", *playbook_args])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
