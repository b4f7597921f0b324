"""Checks across nodes: clocks together. (The container runtimes' versions check is
`runtime/container_checks.py`; host mode's is its own, `runtime/host/`.)"""

from __future__ import annotations

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, ok, warning
from provisioner.checks.intent import CLOCK_WARN_S


def clock_offset(f: NodeFacts) -> float | None:
    """Seconds the node's clock is ahead of ours (midpoint estimate), or None."""
    if f.clock is None or not f.sent_at:
        return None
    return f.clock - (f.sent_at + f.received_at) / 2


def check_clock(f: NodeFacts) -> list[Finding]:
    offset = clock_offset(f)
    if offset is None:
        return []
    evidence = f"offset {offset:+.3f}s ± {f.clock_uncertainty:.3f}s"
    if abs(offset) - f.clock_uncertainty > CLOCK_WARN_S:
        return [
            warning(
                "clock.offset",
                f.host,
                f"clock is {abs(offset):.1f}s {'ahead of' if offset > 0 else 'behind'} this "
                "machine's",
                evidence,
                "run time synchronisation on every node (chrony or systemd-timesyncd); logs and "
                "timeouts need it",
            )
        ]
    return [ok("clock.offset", f.host, "clock agrees with this machine's", evidence)]
