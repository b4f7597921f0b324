"""push_node's retry rule: a broken stream starts that node again; other errors do not."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.errors import RemoteError
from provisioner.inventory import Node, SSHSettings
from provisioner.runtime.docker import direct
from provisioner.runtime.docker.direct import PushOptions, push_node
from provisioner.runtime.docker.push_plan import NodePlan
from tests.unit.test_image_lock import make_pin

NODE = Node(name="n1", address="10.250.9.11", role="worker", ssh=SSHSettings(user="lab"))


class FakePool:
    def __init__(self) -> None:
        self.forgotten = 0

    def session(self, node: Node) -> Any:
        return type("S", (), {"host": node.name})()

    def forget(self, node: Node) -> None:
        self.forgotten += 1


def run(monkeypatch: pytest.MonkeyPatch, failures: list[str], retries: int = 2) -> Any:
    calls: list[int] = []

    def stream(*_: Any) -> direct.Sent:
        calls.append(1)
        if len(calls) <= len(failures):
            raise RemoteError("n1", "broke", kind=failures[len(calls) - 1])
        return direct.Sent(1000, 10)

    monkeypatch.setattr(direct, "gather_plan", lambda *_: NodePlan("send", 1, ("x",), 0))
    monkeypatch.setattr(direct, "stream_layers", stream)
    monkeypatch.setattr(direct, "verify_and_tag", lambda *_: None)
    pool = FakePool()
    outcome = push_node(pool, NODE, make_pin(), PushOptions(retries=retries), lambda _: None)  # type: ignore[arg-type]
    return outcome, pool, calls


def test_a_lost_connection_restarts_the_node_from_the_beginning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    outcome, pool, calls = run(monkeypatch, ["connection-lost", "load-failed"])
    assert outcome.attempts == 3 and len(calls) == 3
    assert pool.forgotten == 2  # a fresh connection each time
    assert (outcome.bytes_sent, outcome.bytes_omitted) == (1000, 10)


def test_retries_run_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RemoteError, match="broke"):
        run(monkeypatch, ["connection-lost", "connection-lost"], retries=1)


@pytest.mark.parametrize("kind", ["no-space", "no-docker", "auth"])
def test_other_errors_are_not_retried(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    with pytest.raises(RemoteError):
        run(monkeypatch, [kind])
