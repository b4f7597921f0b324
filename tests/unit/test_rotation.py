"""Token rotation (pure parts): when `up` changes the token, what it and `down` warn about,
the local token files of a rotation, and which token each recorded node holds."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.cluster import membership, rotation
from provisioner.cluster.rotation import Exposed
from provisioner.node import token
from tests.unit.inventories import make_inventory

SLURM_INV = """\
cluster: hpc
ssh: {user: alice, key: id_ed25519}
scheduler:
  type: slurm
  login: {name: login1, address: 10.1.0.5}
  nodes: 2
  time: 1:00:00
runtime: host
"""


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))


def _exposed(tmp_path: Path) -> list[Exposed]:
    inv = make_inventory(tmp_path, workers=2)
    return [Exposed(inv.workers[1], "connection timed out")]


@pytest.mark.parametrize(
    ("asked", "unfinished", "has_exposed", "head_restart", "rotate", "why"),
    [
        (False, False, False, False, False, ""),
        (False, False, False, True, False, ""),  # a fresh head alone changes nothing
        (False, False, True, False, False, ""),  # would stop running jobs: warn instead
        (False, False, True, True, True, "the head was being started anyway"),
        (True, False, False, False, True, "asked (--rotate-token)"),
        (True, False, True, False, True, "asked (--rotate-token)"),
        (False, True, False, False, True, "an earlier rotation did not finish"),
    ],
)
def test_plan_rotates_when_asked_unfinished_or_free(
    tmp_path: Path,
    asked: bool,
    unfinished: bool,
    has_exposed: bool,
    head_restart: bool,
    rotate: bool,
    why: str,
) -> None:
    found = _exposed(tmp_path) if has_exposed else []
    plan = rotation.plan(
        asked=asked, unfinished=unfinished, exposed=found, head_restart=head_restart
    )
    assert plan.rotate is rotate
    assert why in plan.why and bool(plan.why) is rotate
    assert plan.exposed == tuple(found)
    assert plan.to_json()["rotated"] is rotate


def test_up_warns_only_when_it_did_not_rotate(tmp_path: Path) -> None:
    found = _exposed(tmp_path)
    kept = rotation.plan(asked=False, unfinished=False, exposed=found, head_restart=False)
    assert rotation.up_warnings(kept) == [
        "worker-2 (10.250.9.12) left the inventory but could not be reached (connection "
        "timed out): its Ray keeps this cluster's token and can rejoin when it comes back "
        "(a restart, a reboot). Fix: `provisioner up --rotate-token` (restarts every node; "
        "running jobs stop)"
    ]
    rotated = rotation.plan(asked=False, unfinished=False, exposed=found, head_restart=True)
    assert rotation.up_warnings(rotated) == []
    assert "worker-2 (10.250.9.12) left the inventory" in rotated.why
    assert rotated.to_json() == {
        "rotated": True,
        "why": rotated.why,
        "exposed": [
            {"name": "worker-2", "address": "10.250.9.12", "error": "connection timed out"}
        ],
    }


def test_down_warns_that_the_next_up_rotates(tmp_path: Path) -> None:
    (line,) = rotation.down_warnings(_exposed(tmp_path))
    assert line.startswith("worker-2 (10.250.9.12) left the inventory but could not be")
    assert "(connection timed out)" in line and "next `provisioner up`" in line


def test_exposed_are_the_unreached_nodes_that_may_hold_the_current_token(
    tmp_path: Path,
) -> None:
    inv = make_inventory(tmp_path, workers=3)
    w1, w2, w3 = inv.workers
    errors = {w1.name: "timed out", w2.name: "refused", w3.name: "no route"}
    held = {w1.address: "sha256:new", w2.address: "sha256:old"}  # w3: unknown
    found = rotation.exposed([w1, w2, w3], errors, held, "sha256:new")
    assert [(e.node.name, e.error) for e in found] == [
        (w1.name, "timed out"),
        (w3.name, "no route"),
    ]
    assert rotation.exposed([], {}, held, "sha256:new") == []


def test_a_rotation_keeps_its_token_until_it_finishes(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    old = token.ensure_token(inv)
    before = old.read_text()
    assert not token.rotation_unfinished(inv)
    new = token.begin_rotation(inv)
    assert stat.S_IMODE(os.stat(new).st_mode) == 0o600 and new != old
    assert token.rotation_unfinished(inv) and old.read_text() == before
    again = token.begin_rotation(inv)  # a retry keeps the token the nodes may have got
    assert again == new and new.read_text() != before and len(new.read_text()) == 64
    fresh = new.read_text()
    token.finish_rotation(inv)
    assert not token.rotation_unfinished(inv)
    assert old.read_text() == fresh and stat.S_IMODE(os.stat(old).st_mode) == 0o600
    assert not list(old.parent.glob(".*.tmp"))


def test_fingerprint_tells_tokens_apart_without_the_token(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    path = token.ensure_token(inv)
    first = token.fingerprint(path)
    assert first.startswith("sha256:") and len(first) == 7 + 16
    assert path.read_text() not in first and first == token.fingerprint(path)
    token.begin_rotation(inv)
    token.finish_rotation(inv)
    assert token.fingerprint(path) != first


def test_record_keeps_which_token_each_node_holds(tmp_path: Path) -> None:
    big = make_inventory(tmp_path, workers=2)
    small = replace(big, workers=big.workers[:1])
    gone = big.workers[1]
    membership.record_nodes(
        small, also=[gone], token="sha256:new", held={gone.address: "sha256:old"}
    )
    assert membership.recorded_tokens(small) == {
        small.head.address: "sha256:new",
        small.workers[0].address: "sha256:new",
        gone.address: "sha256:old",
    }
    assert [n.name for n in membership.recorded_nodes(small)] == [
        small.head.name,
        small.workers[0].name,
        gone.name,
    ]
    membership.record_nodes(small)  # no fingerprint known: none recorded
    assert membership.recorded_tokens(small) == {}


def test_rotate_token_refuses_a_scheduler_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from provisioner.cli import run

    key = tmp_path / "id_ed25519"
    key.write_text("not checked here\n")
    os.chmod(key, 0o600)
    path = tmp_path / "inv.yaml"
    path.write_text(SLURM_INV)
    assert run(["up", "-i", str(path), "--rotate-token"]) == 2
    err = capsys.readouterr().err
    assert "--rotate-token does not apply to a scheduler inventory" in err
    assert "auth_token" in err


def test_down_with_an_unreached_departed_node_is_ok_with_a_warning(tmp_path: Path) -> None:
    from provisioner.cluster.down import DownResult

    found = _exposed(tmp_path)
    result = DownResult(removed=["head-0", "worker-1"], exposed=found)
    doc = result.to_json()
    assert result.ok and doc["ok"] is True
    assert doc["warnings"] == rotation.down_warnings(found)
    assert doc["token"] == {"exposed": [e.to_json() for e in found]}


def test_up_json_says_whether_and_why_the_token_changed(tmp_path: Path) -> None:
    from provisioner.cluster.up import UpResult

    found = _exposed(tmp_path)
    kept = UpResult(
        token=rotation.plan(asked=False, unfinished=False, exposed=found, head_restart=False)
    )
    assert kept.to_json()["token"]["rotated"] is False and len(kept.to_json()["warnings"]) == 1
    asked = UpResult(
        token=rotation.plan(asked=True, unfinished=False, exposed=[], head_restart=False)
    )
    assert asked.to_json()["token"] == {
        "rotated": True,
        "why": "asked (--rotate-token)",
        "exposed": [],
    }
    assert asked.to_json()["warnings"] == [] and UpResult().to_json()["token"]["rotated"] is False
