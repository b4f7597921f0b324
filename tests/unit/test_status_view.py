"""`status` for people: each node's reason in the table, readable at 80 columns; nodes the
GCS knows that the inventory does not list are named (pure: assemble and render)."""

from __future__ import annotations

from pathlib import Path

from provisioner.cli.cluster import status_table
from provisioner.cluster import status
from provisioner.cluster.headprobe import GcsNode
from provisioner.console import SafeConsole
from provisioner.errors import ConnectError
from provisioner.inventory import Inventory, Node, SSHSettings
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.protocol import RayState
from tests.unit.test_image_lock import make_pin


def long_inventory(tmp: Path) -> Inventory:
    """Names and addresses as long as real ones get."""
    key = tmp / "id_ed25519"
    key.write_text("not a real key\n")
    ssh = SSHSettings(user="lab", key=key)
    names = ["gpu-head-rack-a-01.example.org", "gpu-worker-rack-a-02.example.org"]
    names.append("gpu-worker-rack-b-03.example.org")
    addresses = ["fd00:1234:5678:9abc::10", "fd00:1234:5678:9abc::11", "192.168.200.213"]
    head = Node(names[0], addresses[0], "head", ssh)
    workers = tuple(
        Node(n, a, "worker", ssh) for n, a in zip(names[1:], addresses[1:], strict=True)
    )
    return Inventory(path=tmp / "inventory.yaml", cluster="demo", head=head, workers=workers)


def render(st: status.ClusterStatus, width: int = 80) -> list[str]:
    # as the CLI's console prints it (provisioner.console.Output)
    console = SafeConsole(width=width, record=True, highlight=False, soft_wrap=True, markup=False)
    console.print(status_table(st))
    return console.export_text().splitlines()


def unhealthy(tmp_path: Path) -> status.ClusterStatus:
    inv = long_inventory(tmp_path)
    runtime = docker.DockerRuntime(inv, make_pin(image_id="sha256:x"))
    run = RayState(status="running", runs="sha256:x")
    states = {
        inv.head.name: run,
        inv.workers[0].name: RayState(
            status="exited", runs="sha256:x", exit_code=137, oom_killed=True, restarts=3
        ),
    }
    errors = {
        inv.workers[1].name: ConnectError(inv.workers[1].name, "connection refused", "check sshd")
    }
    gcs = [
        GcsNode("h", inv.head.address, True, {"CPU": 2.0}),
        GcsNode("w1", inv.workers[0].address, False),
        GcsNode("x", "10.9.9.99", True, {"CPU": 4.0}),  # not in the inventory
    ]
    return status.assemble(inv, runtime, states, errors, gcs)  # type: ignore[arg-type]


def test_each_unhealthy_node_says_why(tmp_path: Path) -> None:
    st = unhealthy(tmp_path)
    head, exited, unreachable = st.nodes
    assert head.reason is None and head.healthy
    assert exited.reason == (
        "its container is exited (exit code 137), killed for lack of memory, 3 restart(s): "
        "see `provisioner logs`"
    )
    assert unreachable.reason is not None and unreachable.reason.startswith("no SSH: ")
    assert "connection refused" in unreachable.reason
    doc = st.to_json()
    assert [n["reason"] for n in doc["nodes"]] == [None, exited.reason, unreachable.reason]


def test_nodes_outside_the_inventory_are_named_and_unhealthy(tmp_path: Path) -> None:
    st = unhealthy(tmp_path)
    assert [g.ip for g in st.outside] == ["10.9.9.99"] and not st.healthy
    doc = st.to_json()
    assert doc["outside_inventory"] == ["10.9.9.99"]
    assert {g["ip"]: g["in_inventory"] for g in doc["gcs_nodes"]} == {
        st.nodes[0].host: True,
        st.nodes[1].host: True,
        "10.9.9.99": False,
    }


def test_table_at_80_columns_cuts_nothing(tmp_path: Path) -> None:
    st = unhealthy(tmp_path)
    lines = render(st)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "…" not in text
    # every name and address is there whole (a folded cell may break it across lines:
    # join each column's pieces back)
    first = next(line for line in lines if "node / address" in line).index("role")
    flat = "".join(line[:first].strip() for line in lines)
    for node in st.nodes:
        assert node.name in flat and node.host in flat, text
    assert "10.9.9.99" in text
    problem = next(line for line in lines if "node / address" in line).index("problem")
    words = " ".join(line[problem:].strip() for line in lines)
    for phrase in (
        "exit code 137",
        "killed for lack of memory",
        "no SSH",
        "connection refused",
        "not in the inventory",
    ):
        assert phrase in words, text


def test_healthy_table_is_quiet(tmp_path: Path) -> None:
    inv = long_inventory(tmp_path)
    runtime = docker.DockerRuntime(inv, make_pin(image_id="sha256:x"))
    run = RayState(status="running", runs="sha256:x")
    gcs = [GcsNode(n.name, n.address, True, {"CPU": 2.0}) for n in inv.nodes]
    st = status.assemble(inv, runtime, {n.name: run for n in inv.nodes}, {}, gcs)
    assert st.healthy and all(n.reason is None for n in st.nodes)
    assert "unhealthy" not in "\n".join(render(st))
