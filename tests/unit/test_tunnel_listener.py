"""Issue 27 (7): the token goes only to a listener this cluster's parties own.

The judging is pure (lines of the kernel's socket tables, as a head writes them); the
local check reads this machine's real tables, with a socket this test binds as the
positive control.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from provisioner.cluster.tunnel import (
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


def test_listening_sockets_are_read_with_their_owner() -> None:
    found = parse_listeners(TCP + TCP6)
    assert [(x.port, x.uid) for x in found] == [
        (8265, 0),
        (22, 1000),
        (29001, 4242),
        (29001, 4242),
        (8080, 4242),
    ]  # the established connection (01) and the header are not listeners


def test_root_or_the_ssh_user_may_have_the_token_another_user_may_not() -> None:
    listeners = parse_listeners(TCP + TCP6)
    assert refusal(8265, 1000, listeners) is None  # root's (the Ray container)
    assert refusal(22, 1000, listeners) is None  # the SSH user's own (host mode)
    why = refusal(29001, 1000, listeners)
    assert why is not None and "uid 4242" in why
    assert refusal(29002, 1000, listeners) == "nothing listens on 127.0.0.1:29002"
    # ::1:8080 is not reached by a connection to 127.0.0.1:8080: nothing listens there
    assert refusal(8080, 1000, listeners) == "nothing listens on 127.0.0.1:8080"


def test_a_stranger_sharing_the_port_on_any_reachable_address_is_refused() -> None:
    ours = parse_listeners(TCP)[0]  # root on 127.0.0.1:8265
    theirs = parse_listeners(TCP6.replace(":7149", ":2049"))[0]  # uid 4242 on [::]:8265
    why = refusal(8265, 1000, [ours, theirs])
    assert why is not None and "uid 4242" in why
    assert refusal(8265, 4242, [theirs]) is None  # positive control: the same, as its owner


def test_the_command_and_its_output() -> None:
    assert listeners_command() == (
        "id -u; grep -h ' 0A ' /proc/net/tcp /proc/net/tcp6 2>/dev/null; exit 0"
    )
    uid, found = parse_listeners_output("1000\n" + TCP + TCP6)
    assert uid == 1000 and len(found) == 5
    assert parse_listeners_output("") == (None, [])


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


def test_tensorboard_is_inside_the_cluster_block() -> None:
    block = RayPorts.from_base(29000)
    assert tensorboard_port(block) == 29009
    assert 29009 not in block.all_ports() and 29000 <= 29009 < 29000 + 1000
    assert tensorboard_port(RayPorts()) == 6006  # Ray's default layout: TensorBoard's own


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
    head = HeadSaying("1000\n" + TCP + TCP6)
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
