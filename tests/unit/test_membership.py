"""Membership follows the inventory (pure parts): the record of the last `up`, the nodes
that left, and the token removal that keeps a restarted container out."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.cluster import membership
from provisioner.cluster.headprobe import GcsNode
from provisioner.inventory import Hop, Node
from tests.unit.inventories import make_inventory


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))


def test_record_round_trips_how_to_reach_each_node(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    routed = replace(
        inv.workers[0].ssh,
        port=2222,
        known_hosts=(tmp_path / "kh",),
        jump="ops@bastion:22",
        hops=(Hop("bastion", "192.0.2.1", "ops", 22, tmp_path / "k"),),
        proxy_command=None,
        host_key_policy="accept-new",
    )
    worker = replace(inv.workers[0], ssh=routed)
    inv = replace(inv, workers=(worker, *inv.workers[1:]))
    membership.record_nodes(inv)
    path = membership.record_path(inv)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    back = membership.recorded_nodes(inv)
    assert [(n.name, n.address, n.role) for n in back] == [
        (n.name, n.address, n.role) for n in inv.nodes
    ]
    assert back[1].ssh == routed and back[0].ssh == inv.head.ssh


def test_no_record_or_a_broken_one_is_no_node(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    assert membership.recorded_nodes(inv) == []
    membership.record_path(inv).parent.mkdir(parents=True)
    membership.record_path(inv).write_text("{not json")
    assert membership.recorded_nodes(inv) == []


def test_departed_from_the_record_and_from_the_gcs(tmp_path: Path) -> None:
    big = make_inventory(tmp_path, workers=3)
    small = replace(big, workers=big.workers[:1])
    membership.record_nodes(big)
    gcs = [
        GcsNode("h", big.head.address, True),
        GcsNode("w3", big.workers[2].address, True),  # recorded too: listed once
        GcsNode("x", "10.250.9.99", True),  # the GCS only: the head's SSH settings
        GcsNode("y", "10.250.9.98", False),  # dead: nothing to remove
    ]
    gone = membership.departed(small, membership.recorded_nodes(small), gcs)
    assert [(n.name, n.address) for n in gone] == [
        (big.workers[1].name, big.workers[1].address),
        (big.workers[2].name, big.workers[2].address),
        ("10.250.9.99", "10.250.9.99"),
    ]
    assert gone[2].ssh == small.head.ssh and gone[2].role == "worker"
    assert membership.departed(big, membership.recorded_nodes(big), gcs[:2]) == []
    assert [g.ip for g in membership.outside_inventory(small, gcs)] == [
        big.workers[2].address,
        "10.250.9.99",
    ]


def test_record_keeps_nodes_whose_removal_failed(tmp_path: Path) -> None:
    big = make_inventory(tmp_path, workers=2)
    small = replace(big, workers=big.workers[:1])
    failed: Node = big.workers[1]
    membership.record_nodes(small, also=[failed])
    again = membership.departed(small, membership.recorded_nodes(small), [])
    assert [n.name for n in again] == [failed.name]


def test_forget_command_removes_only_this_clusters_token() -> None:
    assert membership.forget_command("demo") == (
        'rm -rf "$HOME"/.provisioner/clusters/demo/auth_token '
        '"$HOME"/.provisioner/clusters/demo/tls'
    )
