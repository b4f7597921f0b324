"""When to change the cluster's token (pure): a node that left the inventory and could
not be reached keeps its Ray and the token; when it comes back (Docker's restart policy
after a reboot) it would rejoin. A new token, and every node restarted with it, keeps it
out: its Ray is refused by the new head (Ray: "InvalidAuthToken").

`up` rotates when asked (`--rotate-token`), to finish a rotation that did not finish, or by
itself when such a node exists and the head is being (re)started anyway (nothing running
is lost then); otherwise it warns with the fix. `down` warns likewise: its next `up`
starts a fresh head, and so rotates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from provisioner.inventory import Node

ROTATE_FIX = "`provisioner up --rotate-token` (restarts every node; running jobs stop)"


@dataclass(frozen=True)
class Exposed:
    """A node that left the inventory, could not be reached, and may hold the token."""

    node: Node
    error: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.node.name, "address": self.node.address, "error": self.error}


@dataclass(frozen=True)
class TokenPlan:
    """Whether this `up` changes the token, why, and the nodes to warn about if it does not."""

    rotate: bool = False
    why: str = ""
    exposed: tuple[Exposed, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "rotated": self.rotate,
            "why": self.why or None,
            "exposed": [e.to_json() for e in self.exposed],
        }


def exposed(
    failed: Sequence[Node], errors: Mapping[str, str], held: Mapping[str, str], current: str
) -> list[Exposed]:
    """Pure: the departed nodes that could not be reached and may still hold the current
    token (`held`: address -> the fingerprint of the token each was last known to hold; a
    node not in it, e.g. one only the GCS knew, is taken to hold the current one)."""
    return [
        Exposed(n, errors.get(n.name, "not reached"))
        for n in failed
        if held.get(n.address, current) == current
    ]


def _named(nodes: Sequence[Exposed]) -> str:
    return ", ".join(f"{e.node.name} ({e.node.address})" for e in nodes)


def plan(
    *, asked: bool, unfinished: bool, exposed: Sequence[Exposed], head_restart: bool
) -> TokenPlan:
    """Pure: rotate when asked, to finish an earlier rotation, or when a departed node
    that could not be reached may hold the token and the head restarts anyway."""
    found = tuple(exposed)
    if asked:
        return TokenPlan(True, "asked (--rotate-token)", found)
    if unfinished:
        return TokenPlan(True, "an earlier rotation did not finish", found)
    if found and head_restart:
        return TokenPlan(
            True,
            f"{_named(found)} left the inventory and could not be reached, so may still "
            "hold the token; the head was being started anyway",
            found,
        )
    return TokenPlan(False, "", found)


def up_warnings(token_plan: TokenPlan) -> list[str]:
    """Pure: what `up` warns about when it did not rotate: each departed node that still
    holds the token, with the error and the fix."""
    if token_plan.rotate:
        return []
    return [
        f"{e.node.name} ({e.node.address}) left the inventory but could not be reached "
        f"({e.error}): its Ray keeps this cluster's token and can rejoin when it comes back "
        f"(a restart, a reboot). Fix: {ROTATE_FIX}"
        for e in token_plan.exposed
    ]


def down_warnings(found: Sequence[Exposed]) -> list[str]:
    """Pure: what `down` warns about: each departed node that still holds the token."""
    return [
        f"{e.node.name} ({e.node.address}) left the inventory but could not be reached "
        f"({e.error}): its Ray keeps this cluster's token. The next `provisioner up` starts "
        "a fresh head and changes the token, so that it cannot rejoin"
        for e in found
    ]
