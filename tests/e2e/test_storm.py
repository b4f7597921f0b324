"""A short storm (the long one is `make soak`): one PPO run with `submit --retries 4`
while a worker's Ray container is killed, the following client is SIGKILLed and
reattached (`jobs logs --follow --retries`), and the head's Ray container is killed.

The run must end SUCCEEDED with every result file home and verified, each fault costing
at most `--checkpoint-every` iterations computed twice, and the learning curve going on
across every recovery (the mean return after it at least half the one before, the run
having learned well past a fresh policy's return first).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from provisioner.lab.nodes import LabInfo
from tests.e2e.helpers import cli, record_returns
from tests.labtools.storm import Storm

PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "ppo_cartpole.py"
EVERY = 2
# the run's length: the last fault came at iteration 32 of 60 (seed 3), and its window of
# returns after the resume needs 5 more; 45 leaves room for a slower machine
LAST = 45


@pytest.fixture(scope="module")
def inventory(cluster_inventory: Path) -> Path:
    code, _, err = cli("up", "-i", str(cluster_inventory))
    assert code == 0, err[-3000:]
    return cluster_inventory


def test_a_run_goes_on_through_a_short_storm_of_faults(
    inventory: Path, lab: LabInfo, tmp_path: Path
) -> None:
    args = ["--env-runners", "2", "--train-batch", "1000", "--checkpoint-every", str(EVERY)]
    args += [
        "--target-return",
        "1e9",
        "--max-env-steps",
        "100000000",
        "--max-iterations",
        str(LAST),
    ]
    storm = Storm(
        lab=lab,
        inventory=inventory,
        results=tmp_path / "results",
        playbook=PLAYBOOK,
        args=args,
        retries=4,
        work=tmp_path,
        seed=3,
    )
    storm.start()
    try:
        storm.run(["worker_kill", "client_kill", "head_kill"], gap=(3, 8), warmup=8, timeout=600)
        doc = storm.finish(900)
    finally:
        if storm.client is not None and storm.client.poll() is None:
            storm.client.kill()
    record = Path(__file__).resolve().parents[2] / "build" / "storm-short.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(storm.to_json(), indent=1))  # the figures, for the notes
    assert doc["status"] == "SUCCEEDED", doc
    home = tmp_path / "results" / doc["job_id"]
    rows = (home / "metrics.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, LAST + 1))
    manifest = json.loads((home / ".pulled.json").read_text())
    for name, entry in manifest.items():
        assert hashlib.sha256((home / name).read_bytes()).hexdigest() == entry["sha256"], name
    assert (home / "summary.json").is_file() and (home / "training.png").is_file()
    attempts = json.loads((home / "attempts.json").read_text())
    # a lost runner fails its attempt (Ray says FAILED); a lost head leaves it UNKNOWN (no
    # Ray is left to say), the client having found the head's Ray stopped
    assert [a["status"] for a in attempts] == ["FAILED", "UNKNOWN", "SUCCEEDED"], attempts
    assert len({a["job_id"] for a in attempts}) == 3
    # the head's attempt says why it ended: its Ray container was found stopped (not a
    # link given up after two minutes): `follow`'s verdict on the head's Ray, exactly
    head_lost = attempts[1]
    assert head_lost["message"].startswith("the head's Ray is not running ("), head_lost
    assert head_lost["message"].endswith("): the job was lost with it"), head_lost
    by_kind = {r["kind"]: r for r in storm.to_json()}
    # the two container kills failed an attempt each; the client's death cost nothing
    assert by_kind["client_kill"]["resumed_from"] is None
    assert by_kind["client_kill"]["iterations_lost"] == 0
    for kind in ("worker_kill", "head_kill"):
        rec = by_kind[kind]
        assert rec["resumed_from"] is not None, rec
        assert rec["iterations_lost"] <= EVERY, rec
    fresh = sum(float(r.split(",")[2]) for r in rows[:2]) / 2
    paths = {
        "worker_kill": "--retries after a worker loss (short storm)",
        "client_kill": "the client SIGKILLed, jobs logs --follow --retries (short storm)",
        "head_kill": "--retries after a head kill (short storm)",
    }
    for rec in storm.to_json():  # the figures, for the notes: build/resume-returns.jsonl
        at = rec["resumed_from"] if rec["resumed_from"] is not None else rec["reached_before"]
        record_returns(paths[rec["kind"]], at, fresh, rec["return_before"], rec["return_after"])
    for rec in storm.to_json():
        assert rec["return_before"] > 3 * fresh, (fresh, rec)  # learned: a restart would show
        assert rec["continuous"], rec
