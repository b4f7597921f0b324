"""The control plane alone: `pip install .` (no extras) drives the lab end to end.

torch, RLlib and gymnasium live in the image (or the nodes' own Python); the laptop gets
the CLI and what it needs (Ray's client side at the cluster's version, paramiko, docker,
rich, matplotlib...). This venv is made with the plain `pip install .` a user runs, kept
in build/ while pyproject.toml is unchanged, and every verb runs from it: doctor, up,
submit, jobs, tunnel, down.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from provisioner.lab.nodes import LabInfo
from tests.e2e.faults.lab import sigint_as_at_a_terminal

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"
HEAVY = ("torch", "ray.rllib", "gymnasium")


def _imports(python: Path, module: str) -> bool:
    """Whether `module` imports in that interpreter (Ray's wheel carries RLlib's sources
    in every install; without its extra's packages, importing it fails)."""
    code = f"import {module}"
    done = subprocess.run([str(python), "-c", code], capture_output=True, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def light_venv() -> Path:
    """A venv with `pip install .`: made once per pyproject.toml (build/light-venv)."""
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    venv = ROOT / "build" / "light-venv"
    stamp = venv / ".made-from"
    if not (stamp.is_file() and stamp.read_text() == key):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "--upgrade", "pip"], check=True, timeout=600)
        started = time.monotonic()
        subprocess.run([*pip, str(ROOT)], check=True, timeout=1800)
        took = time.monotonic() - started
        size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
        record = {"install_s": round(took, 1), "venv_bytes": size}
        (ROOT / "build" / "light-venv.json").write_text(json.dumps(record) + "\n")
        stamp.write_text(key)
    return venv


def test_the_control_plane_venv_lacks_the_training_stack(light_venv: Path) -> None:
    python = light_venv / "bin" / "python"
    for module in HEAVY:
        assert not _imports(python, module), f"{module} is in the light venv"
    # positive control: the probe finds them where they are (the dev venv)
    for module in HEAVY:
        assert _imports(Path(sys.executable), module), f"{module} not found in the dev venv"
    assert _imports(python, "ray.job_submission") and _imports(python, "paramiko")


def _prov(venv: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return subprocess.run(
        [str(venv / "bin" / "provisioner"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=str(ROOT / "build"),  # not the repository: its sources are not on sys.path
        env=env,
    )


def test_every_verb_runs_from_the_control_plane_venv(
    light_venv: Path, cluster_inventory: Path, lab: LabInfo, tmp_path: Path
) -> None:
    inv = str(cluster_inventory)
    where = _prov(light_venv, "--help")
    assert where.returncode == 0, where.stderr
    origin = subprocess.run(
        [
            str(light_venv / "bin" / "python"),
            "-c",
            "import provisioner; print(provisioner.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=str(ROOT / "build"),
    ).stdout
    assert str(light_venv) in origin, origin  # the installed copy, not the checkout

    doctor = _prov(light_venv, "doctor", "-i", inv, "--json")
    assert doctor.returncode == 0, doctor.stdout[-2000:] + doctor.stderr[-2000:]
    up = _prov(light_venv, "up", "-i", inv, "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    status = _prov(light_venv, "status", "-i", inv, "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["alive_nodes"] == len(lab.nodes)

    results = tmp_path / "results"
    submit = _prov(
        light_venv,
        "submit",
        "-i",
        inv,
        "--results",
        str(results),
        "--json",
        str(PLAYBOOKS / "ppo_cartpole.py"),
        "--",
        "--env-runners",
        "2",
        "--train-batch",
        "300",
        "--max-iterations",
        "2",
    )
    assert submit.returncode == 0, submit.stderr[-3000:]
    doc = json.loads(submit.stdout)
    assert doc["status"] == "SUCCEEDED", doc
    job = results / doc["job_id"]
    rows = (job / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert (job / "training.png").read_bytes()[:4] == b"\x89PNG"  # plotted here, no torch

    listed = _prov(light_venv, "jobs", "list", "-i", inv, "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert doc["job_id"] in listed.stdout
    logs = _prov(light_venv, "jobs", "logs", "-i", inv, doc["job_id"])
    assert logs.returncode == 0 and "iter" in logs.stdout + logs.stderr, logs.stderr[-2000:]

    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    tunnel = subprocess.Popen(
        [str(light_venv / "bin" / "provisioner"), "tunnel", "-i", inv, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=str(ROOT / "build"),
        env=env,
        preexec_fn=sigint_as_at_a_terminal,  # it is ended with Ctrl-C's SIGINT below
    )
    try:
        assert tunnel.stdout is not None
        text = ""
        while True:  # one JSON document (indented), printed once the tunnels are up
            line = tunnel.stdout.readline()
            assert line, tunnel.stderr.read() if tunnel.stderr else ""
            text += line
            if line.rstrip() == "}":
                break
        opened = json.loads(text)
        url, secret = opened["dashboard"]["url"], Path(opened["token_path"]).read_text().strip()
        # the Jobs API answers through the tunnel, with the token, and lists the job
        import urllib.request

        asked = urllib.request.Request(
            f"{url}/api/jobs/", headers={"Authorization": f"Bearer {secret}"}
        )
        with urllib.request.urlopen(asked, timeout=30) as answer:
            assert doc["job_id"] in answer.read().decode()
    finally:
        tunnel.send_signal(signal.SIGINT)
        try:
            tunnel.wait(30)
        except subprocess.TimeoutExpired:
            tunnel.kill()

    down = _prov(light_venv, "down", "-i", inv, "--json")
    assert down.returncode == 0, down.stderr[-2000:]
    gone = _prov(light_venv, "status", "-i", inv, "--json")
    assert gone.returncode == 1 and json.loads(gone.stdout)["alive_nodes"] == 0, gone.stdout
