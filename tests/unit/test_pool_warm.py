"""Pool.warm: connections started ahead, taken by `session` as if it had made them.

Session.connect is replaced by a fake (pure logic: which call connects, who waits, what
is raised); every `up` on the lab goes through a warm pool (tests/e2e)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import ConnectError
from provisioner.remote import pool as pool_mod
from provisioner.remote.pool import Pool
from tests.unit.inventories import make_inventory


class FakeSession:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fake_connect(
    monkeypatch: pytest.MonkeyPatch, gate: threading.Event, failing: set[str]
) -> list[str]:
    """Session.connect waits for `gate`, then fails for the nodes in `failing`."""
    calls: list[str] = []

    def connect(node: Any) -> FakeSession:
        calls.append(node.name)
        assert gate.wait(10)
        if node.name in failing:
            raise ConnectError(node.address, "connection refused", "start sshd")
        return FakeSession(node.name)

    monkeypatch.setattr(pool_mod.Session, "connect", staticmethod(connect))
    return calls


def test_session_takes_the_warm_connection_and_its_failure_once_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = make_inventory(tmp_path)
    head, one, two = inv.nodes
    gate = threading.Event()
    calls = fake_connect(monkeypatch, gate, {two.name})
    with Pool(inv).warm() as pool:
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(pool.session(head)))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # it waits for the connection under way
        gate.set()
        waiter.join(10)
        assert got[0].name == head.name and pool.session(head) is got[0]
        assert pool.session(one).name == one.name
        with pytest.raises(ConnectError):
            pool.session(two)  # the warm attempt's failure, not a second attempt
        assert sorted(calls) == sorted(n.name for n in inv.nodes)  # one connect each
    assert got[0].closed


def test_warm_connects_at_most_its_limit_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = make_inventory(tmp_path, workers=4)
    gate = threading.Event()
    gate.set()
    calls = fake_connect(monkeypatch, gate, set())
    with Pool(inv).warm(limit=2) as pool:
        for _ in range(100):
            if len(calls) == 2:
                break
            threading.Event().wait(0.02)
        assert sorted(calls) == sorted(n.name for n in inv.nodes[:2])
        pool.session(inv.nodes[4])  # the rest connect when first used
        assert len(calls) == 3


def test_positive_control_without_warm_the_first_session_connects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = make_inventory(tmp_path)
    gate = threading.Event()
    gate.set()
    calls = fake_connect(monkeypatch, gate, set())
    with Pool(inv) as pool:
        assert calls == []
        pool.session(inv.head)
        assert calls == [inv.head.name]


def test_a_connection_that_ends_after_the_pool_closed_is_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = make_inventory(tmp_path, workers=0)
    gate = threading.Event()
    made: list[FakeSession] = []
    fake_connect(monkeypatch, gate, set())
    connect = pool_mod.Session.connect

    def keep(node: Any) -> FakeSession:
        made.append(connect(node))
        return made[-1]

    monkeypatch.setattr(pool_mod.Session, "connect", staticmethod(keep))
    pool = Pool(inv).warm()
    pool.close()  # before the node answered
    gate.set()
    for _ in range(100):
        if made and made[0].closed:
            break
        threading.Event().wait(0.05)
    assert made and made[0].closed
