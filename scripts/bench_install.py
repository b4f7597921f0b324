"""What the control machine installs: a venv of `pip install .` against one of
`pip install .[playbooks]` (the training stack a playbook's local run needs), side by side.

Each venv is made afresh in a temporary folder (pip upgraded first, not timed), then the
install is timed and the venv's files summed (links not followed). The record goes to
bench-results/install.json (`make bench-install`). pip resolves through this machine's
own configuration (an index, or a local folder of wheels): the times are this machine's,
the sizes any machine's that resolves the same versions.

    .venv/bin/python scripts/bench_install.py [--repeat N] [--out bench-results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"control plane": ".", "with the training stack": ".[playbooks]"}


def venv_bytes(venv: Path) -> int:
    return sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())


def one(target: str, work: Path) -> dict[str, Any]:
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-cache-dir"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=600)
    started = time.monotonic()
    subprocess.run([*pip, target], check=True, timeout=3600, cwd=ROOT)
    took = time.monotonic() - started
    code = "import importlib.util as u; print(u.find_spec('torch') is not None)"
    torch = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {"install_s": round(took, 1), "venv_bytes": venv_bytes(venv), "torch": torch == "True"}


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    values = [r[key] for r in runs]
    return {
        "runs": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results")
    a = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for i in range(a.repeat):  # interleaved, so a busy moment hits both alike
        order = list(KINDS) if i % 2 == 0 else list(reversed(KINDS))
        for kind in order:
            with tempfile.TemporaryDirectory(prefix="provisioner-install-") as tmp:
                print(f"{i + 1}/{a.repeat}: pip install {KINDS[kind]}", file=sys.stderr)
                runs[kind].append(one(KINDS[kind], Path(tmp)))
    light, full = runs["control plane"], runs["with the training stack"]
    doc = {
        "what": "the control machine's venv: `pip install .` vs `pip install .[playbooks]`",
        "command": " ".join(["scripts/bench_install.py", *argv]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "rows": [
            {
                "id": kind.replace(" ", "-"),
                "pip_install": KINDS[kind],
                "install_s": summary(runs[kind], "install_s"),
                "venv_bytes": summary(runs[kind], "venv_bytes"),
                "torch": all(r["torch"] for r in runs[kind]),
            }
            for kind in KINDS
        ],
        "ratio_bytes": round(
            statistics.median(r["venv_bytes"] for r in light)
            / statistics.median(r["venv_bytes"] for r in full),
            3,
        ),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "install.json").write_text(json.dumps(doc, indent=1) + "\n")
    for row in doc["rows"]:
        mb = row["venv_bytes"]["median"] / 1e6
        print(f"{row['pip_install']:14} {mb:8.0f} MB  {row['install_s']['median']:6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
