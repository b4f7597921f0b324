"""The container runtimes' (docker, podman) check across nodes: Python and Ray the same on
every node's login shell, as on the head. A warning only: Ray itself runs inside the
pinned image, so only the user's own commands on the host are affected (host mode's
check, where they are Ray's, gives errors: `runtime/host/`)."""

from __future__ import annotations

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, ok, warning
from provisioner.checks.intent import Plan


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
    # The container runtimes' check (host mode's, with errors: runtime/host/).
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
