"""The scheduler's job inside the cluster verbs (`cluster/allocation.py`): what `status`
says of it (pure: state, time left, near its limit) and `down` before the allocation ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.cluster import down
from provisioner.cluster.allocation import Job, on_nodes
from provisioner.inventory import load_inventory
from provisioner.runtime.context import cluster_context
from provisioner.slurm.commands import QueueState
from tests.unit.inventories import make_inventory
from tests.unit.test_slurm import SLURM_INV


def test_a_running_job_with_time_to_spare() -> None:
    job = Job(42, QueueState("RUNNING", "None", "n[1-3]", "1:30:00", "2:00:00"))
    assert job.running and job.state == "RUNNING" and not job.near_limit
    assert job.to_json() == {
        "job_id": 42,
        "state": "RUNNING",
        "reason": "None",
        "nodes": "n[1-3]",
        "time_left": "1:30:00",
        "time_left_s": 5400,
        "time_limit": "2:00:00",
        "near_limit": False,
    }


@pytest.mark.parametrize(
    ("left", "limit", "near"),
    [
        ("9:59", "2:00:00", True),  # under 10 minutes
        ("10:00", "1:00:00", False),  # 10 minutes of an hour
        ("1:00:00", "20:00:00", True),  # under a tenth of its limit
        ("1:00:00", "UNLIMITED", False),
        ("INVALID", "2:00:00", False),  # unknown: not said to be near
    ],
)
def test_near_the_time_limit(left: str, limit: str, near: bool) -> None:
    assert Job(1, QueueState("RUNNING", time_left=left, time_limit=limit)).near_limit is near


def test_a_pending_job_is_not_running_and_a_gone_one_says_so() -> None:
    pending = Job(7, QueueState("PENDING", "Priority", position=2))
    assert not pending.running and pending.to_json()["state"] == "PENDING"
    assert Job(7, QueueState()).state == "GONE"


def test_down_before_the_allocation_ran_touches_no_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "id_ed25519").write_text("not a real key\n")
    (tmp_path / "id_ed25519").chmod(0o600)
    path = tmp_path / "inv.yaml"
    path.write_text(SLURM_INV)
    inv = load_inventory(path)
    assert not on_nodes(inv)
    told: list[object] = []
    result = down.down_cluster(
        cluster_context(inv), logs_dir=tmp_path / "logs", on_nodes=told.append
    )
    assert result.queued_only and result.ok and not result.removed
    assert result.slurm is not None and result.slurm.to_json() == {
        "job_id": None,
        "left_queue": True,
    }
    assert told == []  # no node: nothing watched, no job asked about
    assert not (tmp_path / "logs").exists()


def test_an_inventory_of_its_own_nodes_is_on_them(tmp_path: Path) -> None:
    assert on_nodes(make_inventory(tmp_path))
