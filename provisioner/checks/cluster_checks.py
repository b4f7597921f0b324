"""Checks across nodes: versions equal everywhere, clocks together."""

from __future__ import annotations

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, ok, warning
from provisioner.checks.plan import CLOCK_WARN_S, Plan


def _versions(
    facts: dict[str, NodeFacts], plan: Plan, check: str, what: str, pick: str
) -> list[Finding]:
    head = facts.get(plan.head)
    values = {host: getattr(f.login, pick) for host, f in facts.items()}
    if not any(values.values()):
        return []
    reference = values.get(plan.head) if head is not None else None
    if reference is None:
        reference = max(set(values.values()), key=lambda v: list(values.values()).count(v))
    # The docker runtime's check (host mode's, with errors: runtime/host/runtime.py).
    make, note = warning, " (Ray itself runs inside the pinned image)"
    findings = []
    for host, value in values.items():
        if value == reference:
            findings.append(ok(check, host, f"{what} {value or 'absent'}, as on the head"))
            continue
        findings.append(
            make(
                check,
                host,
                f"{what} {value or 'absent'} here, {reference or 'absent'} on the head: Ray "
                f"refuses nodes whose versions differ{note}",
                "; ".join(f"{h}: {v or 'absent'}" for h, v in values.items()),
                f"install {what} {reference} on {host} (the login shell's PATH is what Ray's "
                "launcher uses)"
                if reference
                else f"remove {what} from {host}'s login PATH or install it on every node",
            )
        )
    return findings


def check_versions(facts: dict[str, NodeFacts], plan: Plan) -> list[Finding]:
    return _versions(facts, plan, "python.version", "Python", "python3_version") + _versions(
        facts, plan, "ray.version", "Ray", "ray_version"
    )


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
