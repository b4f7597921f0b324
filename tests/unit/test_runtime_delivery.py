"""The runtimes' image delivery seam (`runtime.protocol.Delivery`): whether a node has the image
(a command and a pure parser), delivering it, verifying it by ID; and the neutral report
(`node.delivery`) it returns, which `up` puts in its result as `push`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from provisioner.cluster import up
from provisioner.errors import InputError, RemoteError
from provisioner.node.delivery import DeliveryReport, NodeDelivery
from provisioner.remote.results import Result
from provisioner.runtime import runtime_for
from provisioner.runtime.docker import direct, push
from provisioner.runtime.docker.delivery import DockerDelivery, has_image_command, holds_image
from provisioner.runtime.podman.delivery import PodmanDelivery
from provisioner.runtime.podman.delivery import holds_image as podman_holds
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin

PIN_ID = "sha256:" + "a" * 64


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))


def test_the_push_reports_in_the_neutral_report_under_its_one_name() -> None:
    """No second name of the report types (the push once called them NodePush and
    PushReport): the Docker push's modules know them only as node.delivery names them."""
    assert push.NodeDelivery is NodeDelivery and push.DeliveryReport is DeliveryReport
    for module in (direct, push):
        assert not hasattr(module, "NodePush") and not hasattr(module, "PushReport")


def test_the_report_as_json_keeps_its_keys() -> None:
    out = DeliveryReport(PIN_ID, "")
    out.nodes["n1"] = NodeDelivery("n1", "send", 3, 3, 2000, seconds=2.0)
    out.errors["n2"] = RemoteError("n2", "podman load failed", "run up again", kind="load-failed")
    doc = out.to_json()
    assert list(doc) == [
        "image_id",
        "tag",
        "mode",
        "ok",
        "control_bytes",
        "busiest_node_bytes",
        "seconds",
        "nodes",
        "errors",
    ]
    assert doc["ok"] is False and doc["control_bytes"] == 2000 and doc["mode"] == "direct"
    assert doc["nodes"][0]["rate_bytes_per_s"] == 1000
    assert doc["errors"][0]["host"] == "n2" and doc["errors"][0]["kind"] == "load-failed"


def test_each_runtime_says_how_its_image_is_delivered(tmp_path: Path) -> None:
    pin = make_pin(image_id=PIN_ID)
    docker = runtime_for(make_inventory(tmp_path), pin, push="chain").delivery()
    podman = runtime_for(make_inventory(tmp_path, runtime="podman"), pin).delivery()
    host = runtime_for(make_inventory(tmp_path, runtime="host"), pin).delivery()
    assert isinstance(docker, DockerDelivery) and docker.push == "chain"
    assert isinstance(podman, PodmanDelivery)
    assert host is None  # the nodes bring their own Ray
    assert docker.image_id == podman.image_id == PIN_ID


def test_docker_has_the_image_by_its_exact_id() -> None:
    cmd = has_image_command(PIN_ID)
    assert cmd == f"docker image inspect --format '{{{{.Id}}}}' {PIN_ID} 2>/dev/null || true"
    assert holds_image(f"{PIN_ID}\n", PIN_ID)
    assert not holds_image("", PIN_ID)
    assert not holds_image("sha256:" + "b" * 64, PIN_ID)
    assert not holds_image("", "")  # no pin: nothing is held


def test_the_has_command_quotes_the_id_it_is_given() -> None:
    hostile = "x; touch /tmp/pwned"
    words = subprocess.run(
        ["sh", "-c", f"set -- {has_image_command(hostile).split(' 2>')[0]}; printf '%s\\n' \"$@\""],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert words[-1] == hostile


def test_podman_holds_the_image_under_dockers_id_in_bare_hex() -> None:
    assert podman_holds("a" * 64 + "\n", PIN_ID)
    assert not podman_holds(PIN_ID, PIN_ID)  # Podman prints it bare
    assert not podman_holds("", PIN_ID)


class _Session:
    host = "n1"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.ran: list[str] = []

    def run(self, command: str, **kwargs: Any) -> Result:
        self.ran.append(command)
        return Result("n1", command, self.stdout, "", 0)


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_verify_names_what_the_node_holds_instead(tmp_path: Path, kind: str) -> None:
    pin = make_pin(image_id=PIN_ID)
    delivery = runtime_for(make_inventory(tmp_path, runtime=kind), pin).delivery()
    assert delivery is not None
    held, other = ("a" * 64, "b" * 64) if kind == "podman" else (PIN_ID, "sha256:" + "b" * 64)
    good = _Session(held + "\n")
    delivery.verify(good)  # type: ignore[arg-type]
    assert good.ran == [delivery.has_command()]
    with pytest.raises(RemoteError, match=f"holds: {other}") as caught:
        delivery.verify(_Session(other))  # type: ignore[arg-type]
    assert caught.value.fix and "provisioner up" in caught.value.fix


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_nodes_the_doctor_saw_holding_the_image_are_not_asked(tmp_path: Path, kind: str) -> None:
    inventory = make_inventory(tmp_path, runtime=kind)
    pin = make_pin(image_id=PIN_ID)
    delivery = runtime_for(inventory, pin).delivery()
    assert delivery is not None
    names = frozenset(n.name for n in inventory.nodes)
    said: list[str] = []
    # a pool that any question to a node would need: there is none
    seen = dict.fromkeys(names, PIN_ID)  # node -> the ID its image store names the pin by
    out = delivery.deliver(None, said.append, ready=seen)  # type: ignore[arg-type]
    assert out.ok and set(out.nodes) == names
    assert {(n.action, n.via, n.bytes_sent) for n in out.nodes.values()} == {("none", "doctor", 0)}
    assert said and said[0].startswith("image: making every node")


@pytest.mark.parametrize("kind", ["docker", "podman"])
def test_a_delivery_without_a_pin_is_refused_with_its_fix(tmp_path: Path, kind: str) -> None:
    delivery = runtime_for(make_inventory(tmp_path, runtime=kind), None).delivery()
    assert delivery is not None and delivery.image_id == ""
    with pytest.raises(InputError, match="image pin") as caught:
        delivery.deliver(None, print, ready={})  # type: ignore[arg-type]
    assert "image build" in (caught.value.fix or "")


def test_up_delivers_nothing_for_a_runtime_without_a_delivery(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path, runtime="host")
    ctx = up.context(inventory, None, pin=None)  # type: ignore[arg-type]
    result = up.UpResult(runtime=ctx.runtime.name)
    up.prepare(ctx, result)
    assert result.push is None and "push" in result.timings
    assert result.to_json()["push"] is None


class _Refusing:
    """A node's session that records what it is asked and fails it (the push stops there)."""

    def __init__(self, host: str, asked: list[str]) -> None:
        self.host = host
        self.asked = asked

    def run(self, command: str, **kwargs: Any) -> Result:
        self.asked.append(command)
        raise RemoteError(self.host, "refused (test)", "none", kind="remote")

    def __getattr__(self, name: str) -> Any:
        def other(*args: Any, **kwargs: Any) -> Any:
            self.asked.append(f"<{name}>")
            raise RemoteError(self.host, "refused (test)", "none", kind="remote")

        return other


def test_image_push_on_a_podman_inventory_goes_through_podmans_delivery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`image push` delivers as `up` does: on a Podman inventory the first thing a node is
    asked is what its Podman holds (then `podman load`), never Docker's push."""
    from provisioner import remote
    from provisioner.cli import image as cli_image
    from provisioner.cli import run
    from provisioner.image.pin import write_pin
    from provisioner.runtime.podman.delivery import state_command

    pin = make_pin(image_id=PIN_ID)
    lock = tmp_path / "image.lock.json"
    write_pin(pin, lock)
    inventory = make_inventory(tmp_path, runtime="podman", image_lock=lock)
    asked: list[str] = []

    class _Pool:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> _Pool:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def close(self) -> None:
            pass

        def session(self, node: Any) -> _Refusing:
            return _Refusing(node.name, asked)

    monkeypatch.setattr(cli_image, "load_cluster", lambda path: inventory)
    monkeypatch.setattr(remote, "Pool", _Pool)
    monkeypatch.setattr(push, "Pool", _Pool)
    assert run(["image", "push", "-i", str(tmp_path / "inventory.yaml"), "--json"]) == 1
    assert asked and set(asked) == {state_command(PIN_ID)}, asked
    assert not any("docker load" in a for a in asked)
