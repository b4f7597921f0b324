"""Issue 27 (7): the token goes only to a listener that is this cluster's dashboard.

The judging is pure (lines of the kernel's socket tables, as a head writes them, and the
inodes of the sockets this cluster's Ray holds); the local check reads this machine's
real tables, with a socket this test binds as the positive control. Each runtime's
`sockets_command` is run here for real (tests/unit/test_cluster_commands.py,
tests/unit/test_runtime_host.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from provisioner.cluster.tunnel import (
    OURS_MARK,
    HeadSockets,
    NotThisCluster,
    check_listener,
    check_local_listener,
    listeners_command,
    parse_listeners,
    parse_listeners_output,
    refusal,
    tensorboard_port,
)
from provisioner.errors import OperationError
from provisioner.inventory import RayPorts
from provisioner.remote.results import Result

# /proc/net/tcp and /proc/net/tcp6 of a head (golden/listeners/): root's dashboard on
# 127.0.0.1:8265 (0x2049), uid 1000's listener on 0.0.0.0:22, uid 4242 on [::]:29001 (0x7149)
# and on 127.0.0.1:29001, uid 4242 on [::1]:8080, and an established connection (state 01)
# of uid 4242 to 8265.
GOLDEN = Path(__file__).parent / "golden" / "listeners"
TCP = (GOLDEN / "tcp").read_text()
TCP6 = (GOLDEN / "tcp6").read_text()


def test_listening_sockets_are_read_with_their_owner_and_inode() -> None:
    found = parse_listeners(TCP + TCP6)
    assert [(x.port, x.uid, x.inode) for x in found] == [
        (8265, 0, 1605),
        (22, 1000, 1606),
        (29001, 4242, 1607),
        (29001, 4242, 1609),
        (8080, 4242, 1610),
    ]  # the established connection (01) and the header are not listeners


def test_without_this_clusters_sockets_root_or_the_ssh_user_may_listen() -> None:
    """TensorBoard's port: the SSH user's own service, never sent the token."""
    listeners = parse_listeners(TCP + TCP6)
    assert refusal(8265, 1000, listeners) is None  # root's
    assert refusal(22, 1000, listeners) is None  # the SSH user's own
    why = refusal(29001, 1000, listeners)
    assert why is not None and "uid 4242" in why
    assert refusal(29002, 1000, listeners) == "nothing listens on 127.0.0.1:29002"
    # ::1:8080 is not reached by a connection to 127.0.0.1:8080: nothing listens there
    assert refusal(8080, 1000, listeners) == "nothing listens on 127.0.0.1:8080"


def test_the_dashboard_must_be_a_socket_this_clusters_ray_holds() -> None:
    """Root's listener (as any process in docker mode would be, or the SSH user's own) is
    refused when none of this cluster's Ray processes holds that socket; accepted when
    one does (the positive control: the same listener)."""
    listeners = parse_listeners(TCP + TCP6)
    assert refusal(8265, 1000, listeners, frozenset({1605, 77})) is None
    why = refusal(8265, 1000, listeners, frozenset({77}))
    assert why is not None and "uid 0" in why and "not this cluster's Ray" in why
    assert refusal(8265, 1000, listeners, frozenset()) == why  # its Ray does not run
    why = refusal(22, 1000, listeners, frozenset({1605}))  # the SSH user's, not Ray's
    assert why is not None and "uid 1000" in why
    # two sockets reach 127.0.0.1:29001 (v4 and v6): every one must be this cluster's
    assert refusal(29001, 1000, listeners, frozenset({1607})) is not None
    assert refusal(29001, 1000, listeners, frozenset({1607, 1609})) is None
    assert refusal(29002, 1000, listeners, frozenset({1605})) == (
        "nothing listens on 127.0.0.1:29002"
    )


def test_a_stranger_sharing_the_port_on_any_reachable_address_is_refused() -> None:
    ours = parse_listeners(TCP)[0]  # root on 127.0.0.1:8265
    theirs = parse_listeners(TCP6.replace(":7149", ":2049"))[0]  # uid 4242 on [::]:8265
    why = refusal(8265, 1000, [ours, theirs])
    assert why is not None and "uid 4242" in why
    assert refusal(8265, 4242, [theirs]) is None  # positive control: the same, as its owner
    why = refusal(8265, 1000, [ours, theirs], frozenset({ours.inode}))
    assert why is not None and "uid 4242" in why


def test_the_command_and_its_output() -> None:
    assert listeners_command() == (
        "id -u; grep -h ' 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"
    )
    assert listeners_command("S") == (
        "id -u; grep -h ' 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; "
        "echo '== this cluster'\"'\"'s sockets'; ( S ); exit 0"
    )
    seen = parse_listeners_output("1000\n" + TCP + TCP6)
    assert seen.uid == 1000 and len(seen.listeners) == 5 and seen.ours is None
    seen = parse_listeners_output(f"1000\n{TCP}{OURS_MARK}\n1605\n33\n")
    assert len(seen.listeners) == 3 and seen.ours == frozenset({1605, 33})
    assert parse_listeners_output(f"0\n{TCP}{OURS_MARK}\n").ours == frozenset()
    assert parse_listeners_output("") == HeadSockets(None, [])


def test_the_command_runs_and_its_mark_splits_the_output() -> None:
    out = subprocess.run(
        ["sh", "-c", listeners_command("echo 1605; echo 42; exit 0")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    seen = parse_listeners_output(out)
    assert seen.uid == os.getuid() and seen.ours == frozenset({1605, 42})


def test_a_local_address_held_by_another_user_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(TCP)
    with pytest.raises(NotThisCluster) as exc:
        check_local_listener("http://127.0.0.1:29001", (str(table),))
    assert "uid 4242" in exc.value.message and "was not sent" in exc.value.message
    check_local_listener("http://127.0.0.1:8265", (str(table),))  # root's: accepted
    check_local_listener("http://10.0.0.5:29001", (str(table),))  # another host: the user's


def test_a_local_listener_of_this_user_is_accepted_in_the_real_tables() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        check_local_listener(f"http://127.0.0.1:{port}")  # this process's own socket
        text = Path("/proc/net/tcp").read_text()
    assert f"0100007F:{port:04X}" in text  # positive control: the table holds it


def test_tensorboard_is_inside_the_clusters_ports_whatever_their_layout() -> None:
    block = RayPorts.from_base(29000)
    assert tensorboard_port(block) == 29009
    assert 29009 not in block.all_ports() and 29000 <= 29009 < 29000 + 1000
    default = RayPorts()  # Ray's default ports: beside those provisioner fixes (8076-8090)
    assert tensorboard_port(default) == 8091 and 8091 not in default.all_ports()
    moved = RayPorts(metrics_export=8075)  # `ray.ports` moved one: the next free one up
    assert tensorboard_port(moved) == 8080 and 8080 not in moved.all_ports()


class HeadSaying:
    """A head whose `listeners_command` answers `stdout` (the judging is what is tested)."""

    host = "head"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float) -> Result:
        self.commands.append(command)
        return Result("head", command, self.stdout, "", 0)


def test_the_dashboard_must_listen_and_be_ours_tensorboard_need_not_listen() -> None:
    head = HeadSaying(f"1000\n{TCP}{TCP6}{OURS_MARK}\n1605\n")
    check_listener(head, 8265, sockets="S")  # type: ignore[arg-type]  # this cluster's
    assert head.commands == [listeners_command("S")]
    stranger = HeadSaying(f"1000\n{TCP}{TCP6}{OURS_MARK}\n")  # root's, not this Ray's
    with pytest.raises(NotThisCluster, match="uid 0 that is not this cluster's Ray") as exc:
        check_listener(stranger, 8265, sockets="S")  # type: ignore[arg-type]
    assert "not sent" in exc.value.message
    with pytest.raises(NotThisCluster, match="uid 4242"):
        check_listener(head, 29001, sockets="S")  # type: ignore[arg-type]
    head = HeadSaying("1000\n" + TCP + TCP6)  # TensorBoard's port: by owner
    check_listener(head, 8265)  # type: ignore[arg-type]  # root's: fine
    assert head.commands == [listeners_command()]
    with pytest.raises(NotThisCluster, match="uid 4242"):
        check_listener(head, 29001)  # type: ignore[arg-type]
    with pytest.raises(NotThisCluster, match="uid 4242"):
        check_listener(head, 29001, required=False)  # type: ignore[arg-type]
    with pytest.raises(OperationError, match="nothing listens") as exc:
        check_listener(head, 29009)  # type: ignore[arg-type]
    assert not isinstance(exc.value, NotThisCluster)  # a transient state, not an attack
    check_listener(head, 29009, required=False)  # type: ignore[arg-type]  # no TensorBoard yet
    with pytest.raises(OperationError, match="cannot tell"):
        check_listener(HeadSaying(""), 8265)  # type: ignore[arg-type]
