"""The port matrix: which ports each node needs free, which it should accept from whom."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from provisioner.checks.findings import Finding, error
from provisioner.inventory import Node, RayPorts

HEAD_ONLY = ("gcs", "dashboard", "client")


def needed_ports(node: Node, ports: RayPorts) -> dict[str, int]:
    """Name -> port for every single port Ray binds on this node."""
    named = ports.named()
    if node.is_head:
        return named
    return {name: port for name, port in named.items() if name not in HEAD_ONLY}


def listen_ports(node: Node, ports: RayPorts) -> dict[int, str]:
    """Port -> purpose for the temporary listener: what other nodes must reach here."""
    wanted = {
        ports.node_manager: "node_manager",
        ports.object_manager: "object_manager",
        ports.dashboard_agent_grpc: "dashboard_agent_grpc",
        ports.min_worker: "min_worker",
        ports.max_worker: "max_worker",
    }
    if node.is_head:
        wanted[ports.gcs] = "gcs"
    return wanted


@dataclass(frozen=True)
class Probe:
    source: str
    target: str
    address: str
    port: int
    purpose: str


def probe_plan(
    nodes: list[Node], ports: RayPorts, bound: dict[str, tuple[int, ...]]
) -> dict[str, list[Probe]]:
    """Source node name -> probes to make, only to ports whose listener started."""
    plan: dict[str, list[Probe]] = {node.name: [] for node in nodes}
    for source in nodes:
        for target in nodes:
            if target is source or target.name not in bound or source.name not in bound:
                continue
            purposes = listen_ports(target, ports)
            for port in bound[target.name]:
                purpose = purposes.get(port, str(port))
                if purpose == "gcs" and source.is_head:
                    continue
                if purpose == "dashboard_agent_grpc" and not source.is_head:
                    continue  # only the head's dashboard talks to agents
                plan[source.name].append(
                    Probe(source.name, target.name, target.ray_address, port, purpose)
                )
    return plan


def parse_probe_output(source: str, probes: list[Probe], text: str) -> dict[Probe, str]:
    """probe.sh lines 'ADDRESS PORT outcome' -> probe -> outcome ('missing' if absent)."""
    outcome: dict[tuple[str, int], str] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[1].isdigit():
            outcome[(words[0], int(words[1]))] = words[2]
    return {p: outcome.get((p.address, p.port), "missing") for p in probes}


_WHY = {
    "timeout": "dropped (a firewall, or no route)",
    "refused": "refused (a firewall rejects it, or nothing listens)",
    "error": "failed",
    "missing": "not tested",
}


def judge_probes(
    outcomes: dict[Probe, str], addresses: dict[str, str], chosen: frozenset[str] = frozenset()
) -> list[Finding]:
    """Blocked pairs, named. A target no other node reaches is blamed itself (its firewall,
    or, for the nodes in `chosen` whose Ray address the inventory sets, that address).
    `addresses`: node name -> the address Ray uses there, which the probes tried."""
    blocked: dict[tuple[str, str], list[tuple[Probe, str]]] = defaultdict(list)
    sources_of: dict[str, set[str]] = defaultdict(set)
    for probe, result in outcomes.items():
        sources_of[probe.target].add(probe.source)
        if result != "ok":
            blocked[(probe.source, probe.target)].append((probe, result))
    findings = []
    for target, sources in sources_of.items():
        failing = {s for (s, t) in blocked if t == target}
        if len(sources) >= 2 and failing == sources:
            pairs = [item for (s, t), items in blocked.items() if t == target for item in items]
            ports = sorted({f"{p.port} ({p.purpose})" for p, _ in pairs})
            why = _WHY.get(pairs[0][1], pairs[0][1])
            address = addresses.get(target, target)
            fix = (
                f"open TCP {', '.join(ports)} on {target}'s firewall to the other nodes "
                "(e.g. ufw allow from SUBNET to any port PORT proto tcp)"
            )
            if target in chosen:
                fix = (
                    f"set {target}'s `ray: {{address}}` to its address on the network the "
                    f"nodes share (`ip -o addr` on {target} lists them), or {fix}"
                )
            else:
                fix += (
                    f"; or, if Ray's traffic runs on another network, give {target} its "
                    "address there as `ray: {address}`"
                )
            findings.append(
                error(
                    "net.reachability",
                    target,
                    f"no other node reaches {target} on Ray's ports at {address}"
                    f"{' (its ray.address)' if target in chosen else ''}: {why}",
                    f"from {', '.join(sorted(sources))} to {address} ports {', '.join(ports)}",
                    fix,
                )
            )
            for key in [k for k in blocked if k[1] == target]:
                del blocked[key]
    for (source, target), items in sorted(blocked.items()):
        ports = sorted({f"{p.port} ({p.purpose})" for p, _ in items})
        why = _WHY.get(items[0][1], items[0][1])
        findings.append(
            error(
                "net.reachability",
                source,
                f"{source} cannot reach {target} ({addresses.get(target, target)}): {why}",
                f"TCP ports {', '.join(ports)}: {', '.join(sorted({r for _, r in items}))}",
                f"allow TCP between {source} and {target} on Ray's ports "
                "(firewall rules on both, and any network ACL between them)",
            )
        )
    return findings
