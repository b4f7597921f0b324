"""Bytes on the wire between lab nodes, counted by the kernel (iptables rule counters).

Two counting rules (no target: they only count) in each node's own network namespace:
what the node receives from the control machine (the lab network's gateway, the
address this machine's SSH connections come from), and what it sends to the other lab
nodes. Each counts whole IP packets: SSH's framing and encryption, TCP and IP headers
included, so a push's figures are what crossed the wire, not what was estimated.
`start` (re)installs the rules with zero counts, `read` reads them, `stop` removes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import LabError
from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo, load_config

TAG = "provisioner-wire"


@dataclass(frozen=True)
class Wire:
    """One node's counts since `start`."""

    from_control: int  # bytes received from the control machine
    to_nodes: int  # bytes sent to other lab nodes


def _rules(lab: LabInfo, node: LabNode) -> list[str]:
    gateway = load_config(lab.name).gateway
    return [
        f"INPUT -s {gateway} -m comment --comment {TAG}-in",
        *(
            f"OUTPUT -d {peer.address} -m comment --comment {TAG}-out"
            for peer in lab.nodes
            if peer != node
        ),
    ]


def _run(node: LabNode, script: str) -> str:
    rc, out = exec_rc(node.container, script)
    if rc != 0:
        raise LabError(
            f"{node.name}: wire counter command failed (exit {rc}): {out[-300:]}",
            "check that the lab node runs (`provisioner lab status`), then run it again",
        )
    return out


def stop(lab: LabInfo, nodes: tuple[LabNode, ...] | None = None) -> None:
    for node in nodes or lab.nodes:
        for rule in _rules(lab, node):
            _run(node, f"while iptables -C {rule} 2>/dev/null; do iptables -D {rule}; done")


def start(lab: LabInfo, nodes: tuple[LabNode, ...] | None = None) -> None:
    """The counting rules on every node (or `nodes`), from zero."""
    stop(lab, nodes)
    for node in nodes or lab.nodes:
        for rule in _rules(lab, node):
            _run(node, f"iptables -I {rule}")


def parse_counts(listing: str) -> Wire:
    """`iptables -L -v -x -n` output (INPUT and OUTPUT) -> the two counts."""
    got = {"in": 0, "out": 0}
    for line in listing.splitlines():
        words = line.split()
        for side in got:
            if f"{TAG}-{side}" in words and len(words) >= 2 and words[1].isdigit():
                got[side] += int(words[1])
    return Wire(from_control=got["in"], to_nodes=got["out"])


def read(lab: LabInfo, nodes: tuple[LabNode, ...] | None = None) -> dict[str, Wire]:
    """Each node's counts since `start` (node name -> Wire)."""
    return {
        node.name: parse_counts(
            _run(node, "iptables -L INPUT -v -x -n; iptables -L OUTPUT -v -x -n")
        )
        for node in nodes or lab.nodes
    }
