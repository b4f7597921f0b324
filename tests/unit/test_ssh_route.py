"""Pure pieces of the SSH route: ProxyJump specs, ProxyCommand tokens and command line,
the ssh options an inventory may pass, and the order of hops."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from provisioner.errors import InventoryError
from provisioner.inventory import Hop, Node, SSHSettings
from provisioner.inventory.proxies import expand_proxy_command, split_jump
from provisioner.inventory.sshconfig import Resolved, check_ssh_args, ssh_g_command
from provisioner.remote.route import hop_targets, proxy_command_line


@pytest.mark.parametrize(
    ("text", "rest", "spec"),
    [
        ("bastion", "", (None, "bastion", None)),
        ("ops@b:2222", "", ("ops", "b", "2222")),
        ("a,b", "a", (None, "b", None)),
        ("a,ops@[2001:db8::1]:2200", "a", ("ops", "2001:db8::1", "2200")),
        ("ssh://u@h:2201", "", ("u", "h", "2201")),
        ("x@a:1,y@b:2,z@c:3", "x@a:1,y@b:2", ("z", "c", "3")),
    ],
)
def test_split_jump_reaches_the_last_hop_through_the_others(
    text: str, rest: str, spec: tuple[str | None, str, str | None]
) -> None:
    assert split_jump(text) == (rest, spec)


def test_proxy_command_tokens() -> None:
    found = Resolved(hostname="10.0.0.5", user="ops", port=2201)
    assert (
        expand_proxy_command("ssh -W %h:%p -l %r gw # %n 100%%", found, "gpu")
        == "ssh -W 10.0.0.5:2201 -l ops gw # gpu 100%"
    )
    with pytest.raises(InventoryError, match="%C"):
        expand_proxy_command("nc %C", found, "gpu")


def test_proxy_command_runs_through_the_shell_with_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHELL", "/bin/bash")
    line = proxy_command_line("nc -X 5 -x proxy:1080 10.0.0.5 22 | cat")
    assert shlex.split(line) == ["/bin/bash", "-c", "exec nc -X 5 -x proxy:1080 10.0.0.5 22 | cat"]


@pytest.mark.parametrize(
    ("args", "bad"),
    [
        (["-C", "-o", "ControlMaster=auto", "-o", "ControlPersist=60s"], None),
        (["-oProxyJump=a", "-J", "b", "-p", "22", "-l", "u", "-4q"], None),
        (["-L", "8080:localhost:80"], "-L"),
        (["-E", "/tmp/log"], "-E"),
        (["-o"], "-o"),
        (["stray"], "stray"),
        (["-W", "h:22"], "-W"),
    ],
)
def test_only_endpoint_choosing_ssh_options_pass(args: list[str], bad: str | None) -> None:
    assert check_ssh_args(args) == bad


def test_ssh_g_command_ends_options_before_the_host(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("")
    assert ssh_g_command("gpu", ["-o", "Port=22"], config) == [
        "ssh",
        "-G",
        "-F",
        str(config),
        "-o",
        "Port=22",
        "--",
        "gpu",
    ]
    assert ssh_g_command("gpu", [], tmp_path / "missing")[2:4] == ["-F", "/dev/null"]


def test_each_hop_opens_a_channel_to_the_next_and_the_last_to_the_node() -> None:
    hops = (Hop("a", "10.0.0.1", "u", 22), Hop("b", "10.0.1.1", "v", 2200))
    node = Node("w", "10.0.2.1", "worker", SSHSettings(user="lab", port=2222, hops=hops))
    assert hop_targets(node) == [(hops[0], ("10.0.1.1", 2200)), (hops[1], ("10.0.2.1", 2222))]
    plain = Node("w", "10.0.2.1", "worker", SSHSettings(user="lab"))
    assert hop_targets(plain) == []
