"""run_doctor: gather every node's facts, judge them here, return findings."""

from __future__ import annotations

import contextlib
import time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from provisioner.checks.cluster_checks import check_clock
from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, error, ordered, warning
from provisioner.checks.gpu_checks import check_gpus, check_inside, check_models, parse_inside
from provisioner.checks.intent import PinFacts, Plan, plan_for
from provisioner.checks.neighbours import free_base
from provisioner.checks.node_checks import (
    check_address,
    check_resources,
    check_sudo,
    check_tools,
)
from provisioner.checks.port_checks import check_neighbours, check_ports, check_stale_ray
from provisioner.checks.ports import judge_probes, probe_plan
from provisioner.console import Reporter, quiet
from provisioner.doctor.gather import (
    gather_facts,
    listeners_ended_on_error,
    listeners_of,
    new_nonce,
    run_gpu_probes,
    run_probes,
    stop_listeners,
)
from provisioner.errors import ProvisionerError
from provisioner.gpu.assignment import plans_for
from provisioner.inventory import Inventory, Node
from provisioner.remote import Pool, fan_out
from provisioner.runtime import catalogue
from provisioner.runtime.context import ClusterContext
from provisioner.runtime.protocol import Judges, RayState, Runtime

CATALOGUE: dict[str, str] = catalogue()
"""Every check the doctor may report (id -> what it looks at): the shared ones and each
runtime's own."""

_CONNECT_CHECK = {
    "auth": "ssh.auth",
    "hostkey-unknown": "ssh.hostkey",
    "hostkey-changed": "ssh.hostkey",
}


@dataclass
class DoctorReport:
    findings: list[Finding]
    nodes: list[str]
    elapsed_s: float = 0.0
    round_trips: int = 0  # commands run per node
    timings: dict[str, float] = field(default_factory=dict)
    facts: dict[str, NodeFacts] = field(default_factory=dict)  # node name -> what it told
    waived: list[Finding] = field(default_factory=list)  # errors this cluster's own Ray explains
    pin_id: str = ""  # the image ID the round asked every node about ("": no pin)
    pin_alt: str = ""  # the pin's ID in Docker's containerd image store, when known here
    # node name -> PID of the temporary listener left running for the caller to end
    # (`keep_listeners`: gather.stop_listener_command); empty otherwise
    listeners: dict[str, int] = field(default_factory=dict)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def healthy(self) -> bool:
        return not self.errors

    def ray_states(self, runtime: Runtime) -> dict[str, RayState] | None:
        """This cluster's Ray on every node, from this round (None unless every node told)."""
        told = {n: f.ray_state for n, f in self.facts.items() if f.ray_state is not None}
        if set(told) != set(self.nodes):
            return None
        return {n: runtime.parse_state(text) for n, text in told.items()}

    def holding(self, image_id: str) -> dict[str, str]:
        """Nodes this round saw holding `image_id` -> the ID their image store names it by
        (`image_id`, or its ID in Docker's containerd store); empty unless `image_id` is the
        pin this round asked about."""
        if not image_id or image_id != self.pin_id:
            return {}
        ids = {image_id, self.pin_alt} - {""}
        seen = {n: f.runtime.image.partition(" ")[0] for n, f in self.facts.items()}
        return {n: i for n, i in seen.items() if i in ids}

    def to_json(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "nodes": self.nodes,
            "errors": len(self.errors),
            "warnings": sum(f.severity == "warning" for f in self.findings),
            "healthy": self.healthy,
            "elapsed_s": round(self.elapsed_s, 3),
            "round_trips_per_node": self.round_trips,
            "timings_s": {k: round(v, 3) for k, v in self.timings.items()},
        }


def connection_finding(node: Node, exc: ProvisionerError) -> Finding:
    kind = getattr(exc, "kind", "remote")
    check = _CONNECT_CHECK.get(kind, "ssh.connect" if kind != "command-timeout" else "doctor.facts")
    return error(
        check,
        node.name,
        exc.message,
        f"{kind}: {node.ssh.user}@{node.address}:{node.ssh.port}",
        exc.fix or "",
    )


# Findings that this cluster's own running Ray explains on its node.
OWN_RAY_CHECKS = frozenset({"ray.stale", "ports.free", "ports.worker_range"})


def explained_by_own_ray(
    findings: list[Finding], facts: NodeFacts, cluster: str, judges: Judges
) -> list[Finding]:
    """Pure: on a node running this cluster's Ray, busy Ray ports are that Ray, not a fault.

    They become warnings that say so (`provisioner up` keeps a healthy cluster or replaces
    it; `provisioner down` stops it); on any other node they stay errors. The one own-Ray
    waiver: `up` reads these warnings, it does not waive anything itself.
    """
    if not judges.own_ray(facts, cluster):
        return findings
    return [
        replace(
            f,
            severity="warning",
            message=f"this cluster's own Ray is running here: {f.message}",
            fix=f"nothing to do for `provisioner up`; `provisioner down` stops it ({f.fix})",
        )
        if is_waived(f)
        else f
        for f in findings
    ]


def is_waived(f: Finding) -> bool:
    """An error on the list of what this cluster's own Ray explains."""
    return f.severity == "error" and f.check in OWN_RAY_CHECKS


def node_findings(node: Node, facts: NodeFacts, plan: Plan, judges: Judges) -> list[Finding]:
    """Every single-node check (pure); `judges`: the runtime's (`Runtime.judges`)."""
    findings = [
        *check_sudo(node, facts, plan),
        *judges.node(node, facts, plan),
        *check_ports(node, facts, plan),
        *check_neighbours(node, facts, plan),
        *check_stale_ray(node, facts, plan.cluster, plan.shared_nodes),
        *check_address(node, facts),
        *check_resources(node, facts, plan),
        *check_clock(facts),
        *check_tools(node, facts, plan),
        *check_gpus(node, facts, plan),
    ]
    if not facts.complete:
        findings.append(
            warning(
                "doctor.facts",
                node.name,
                "the fact-gathering script stopped early; some checks lack data",
                "",
                "run the doctor again; if it persists, check the node's shell",
            )
        )
    return findings


def pin_facts(context: ClusterContext) -> tuple[PinFacts | None, list[Finding]]:
    """What the checks need of the pin the command read (a pin that could not be read: a
    warning, and no pin)."""
    pin, exc = context.pin, context.pin_error
    if exc is not None:
        return None, [
            warning(
                "image.present",
                "local",
                f"the image pin {context.inventory.image_lock} cannot be read: {exc.message}",
                "",
                exc.fix or "",
            )
        ]
    if pin is None:
        return None, []
    arch = str(pin.extra.get("architecture", "")) if pin.extra else ""
    cuda = str(pin.extra.get("cuda") or "") if pin.extra else ""
    project = (pin.extra or {}).get("project") or {}
    packages = project.get("packages") if isinstance(project, dict) else None
    listed = tuple(
        (str(k), str(v)) for k, v in (packages or {}).items() if isinstance(v, str) and v
    )
    return PinFacts(pin.image_id, pin.versions.python, pin.versions.ray, arch, cuda, listed), []


def control_ray_version() -> str:
    """The Ray installed on this machine (it submits the jobs), or "" without one."""
    try:
        return version("ray")
    except PackageNotFoundError:
        return ""


def deep_gpu_check(
    pool: Pool,
    inventory: Inventory,
    facts: dict[str, NodeFacts],
    pin: PinFacts | None,
    report: Reporter,
    parallelism: int,
    runtime: Runtime,
) -> list[Finding]:
    """gpu.container on every node whose GPUs go to Ray (a runtime that runs Ray in a
    container of the pinned image)."""
    if not (runtime.caps.containers and runtime.caps.needs_image) or pin is None:
        return [
            warning(
                "gpu.container",
                "local",
                "--gpu-deep needs a runtime that runs Ray in the pinned image's container "
                f"(this inventory's: {runtime.name}) and an image pin (image.lock)",
                "",
                "set image.lock in the inventory (provisioner image build writes the pin)",
            )
        ]
    plans = plans_for(inventory.nodes, {n: f.gpu for n, f in facts.items()}, runtime.gpu_methods)
    if not plans:
        return []
    report(f"--gpu-deep: a container of the pinned image on {len(plans)} GPU node(s)")
    commands = {
        name: command
        for name, plan in plans.items()
        if (command := runtime.gpu_probe_command(pin.image_id, plan)) is not None
    }
    group = run_gpu_probes(pool, inventory, commands, parallelism=parallelism)
    findings: list[Finding] = []
    for node in inventory.nodes:
        if node.name in group.results:
            view = parse_inside(group.results[node.name])
            findings += check_inside(node, plans[node.name].count, view)
        elif node.name in group.errors:
            exc = group.errors[node.name]
            findings.append(error("gpu.container", node.name, exc.message, "", exc.fix or ""))
    return findings


def prove_shared(pool: Pool, inventory: Inventory, parallelism: int = 32) -> list[Finding]:
    """`storage.shared`: a random file written in the inventory's storage folder on the
    head, read on every other node (one round trip each, side by side), removed on the
    head; judged by `checks.storage_checks.judge_shared`."""
    import secrets

    from provisioner.checks import storage_checks as storage
    from provisioner.checks.storage_checks import Answer, judge_shared

    path, head = inventory.storage_path, inventory.head
    token = secrets.token_hex(16)
    name = f".provisioner-shared-{inventory.cluster}-{secrets.token_hex(6)}"

    def answer(node: Node, command: str) -> Answer:
        got = pool.session(node).run(command, timeout=30)
        return Answer(got.exit_code, got.stdout, got.stderr)

    try:
        wrote = answer(head, storage.shared_write_command(path, name, token))
    except ProvisionerError as exc:
        wrote = Answer(255, stderr=str(exc))
    reads: dict[str, Answer] = {}
    if wrote.exit_code == 0:
        group = fan_out(
            inventory.workers,
            lambda n: answer(n, storage.shared_read_command(path, name)),
            deadline=60,
            parallelism=parallelism,
        )
        reads = dict(group.results)
        reads.update({n: Answer(255, stderr=str(e)) for n, e in group.errors.items()})
        with contextlib.suppress(ProvisionerError):
            pool.session(head).run(storage.shared_remove_command(path, name), timeout=30)
    return judge_shared(path, head.name, token, wrote, reads)


def run_doctor(
    context: ClusterContext,
    pool: Pool | None = None,
    report: Reporter = quiet,
    *,
    ray_up: bool = False,
    reachability: bool = True,
    parallelism: int = 32,
    ray_state: bool = False,
    gpu_deep: bool = False,
    keep_listeners: bool = False,
) -> DoctorReport:
    """Diagnose every node of the context's inventory, with its runtime and pin (given, as
    the command read and built them); never raises for a node's failure (a finding).

    `pool`: SSH sessions to reuse (and leave open), as `up` does; otherwise its own.
    `ray_state`: also ask each node for this cluster's Ray in the same round (for `up`).
    `gpu_deep`: one more round on the nodes whose GPUs go to Ray: a container of the pinned
    image, with the GPU options `up` would use, must see them (gpu.container).
    `keep_listeners`: no round 3; the listeners are left running, named in the report's
    `listeners`, for the caller to end in its own next command on each node (`up`: the
    start), one round trip fewer before Ray starts."""
    started = time.monotonic()
    inventory, runtime = context.inventory, context.runtime
    pin, findings = pin_facts(context)
    plan = plan_for(
        inventory,
        pin,
        runtime.caps,
        ray_up=ray_up,
        control_ray=control_ray_version(),
        label=runtime.judges.label,
    )
    timings: dict[str, float] = {}
    alt = runtime.image_alt_id() if pin else ""
    with ExitStack() as stack:
        pool = pool if pool is not None else stack.enter_context(Pool(inventory))
        nonce = new_nonce()  # on the listeners' command lines: an interrupted run ends its own
        stack.enter_context(listeners_ended_on_error(pool, nonce))
        report(f"gathering facts from {len(inventory.nodes)} node(s)")
        group = gather_facts(
            pool,
            inventory,
            pin.image_id if pin else "",
            image_alt=alt,
            reachability=reachability,
            parallelism=parallelism,
            ray_state=runtime.state_command() if ray_state else "",
            judges=runtime.judges,
            nonce=nonce,
        )
        timings["facts"] = time.monotonic() - started
        rounds = 1
        left: dict[str, int] = {}  # the listeners the caller ends (keep_listeners)
        waived: list[Finding] = []
        plan = replace(plan, free_base=free_base(list(group.results.values()), inventory.ports))
        for node in inventory.nodes:
            if node.name in group.errors:
                findings.append(connection_finding(node, group.errors[node.name]))
            else:
                facts = group.results[node.name]
                judged = node_findings(node, facts, plan, runtime.judges)
                kept = explained_by_own_ray(judged, facts, inventory.cluster, runtime.judges)
                waived += [f for f, k in zip(judged, kept, strict=True) if f != k]
                findings += kept
        findings += runtime.judges.cluster(group.results, plan)
        findings += check_models(group.results)
        if reachability:
            bound = {name: f.bound_ports for name, f in group.results.items() if f.listener_pid}
            probes = probe_plan(list(inventory.nodes), inventory.ports, bound)
            report(f"probing Ray's ports between {len(bound)} node(s)")
            t0 = time.monotonic()
            outcomes, probe_group = run_probes(pool, inventory, probes, parallelism=parallelism)
            addresses = {n.name: n.ray_address for n in inventory.nodes}
            chosen = frozenset(n.name for n in inventory.nodes if n.data_address)
            findings += judge_probes(outcomes, addresses, chosen)
            for name, exc in probe_group.errors.items():
                findings.append(
                    warning(
                        "net.reachability",
                        name,
                        f"probes from this node did not run: {exc.message}",
                        "",
                        exc.fix or "",
                    )
                )
            if outcomes and not any(
                f.check == "net.reachability" and f.severity == "error" for f in findings
            ):
                findings.append(
                    Finding(
                        "net.reachability",
                        "ok",
                        "cluster",
                        f"{len(outcomes)} probes between {len(bound)} nodes all connected",
                    )
                )
            if keep_listeners:
                left = listeners_of(group.results)
            else:
                stop_listeners(
                    pool, inventory, listeners_of(group.results), parallelism=parallelism
                )
            timings["probes"] = time.monotonic() - t0
            rounds = 3 if not keep_listeners else 2
        if inventory.storage == "head":
            from provisioner.checks.storage_checks import candidates

            findings += candidates({n: f.net_mounts for n, f in group.results.items()})
        if inventory.storage == "path":
            t0 = time.monotonic()
            findings += prove_shared(pool, inventory, parallelism)
            timings["storage"] = time.monotonic() - t0
            rounds += 1
        if gpu_deep:
            t0 = time.monotonic()
            findings += deep_gpu_check(
                pool, inventory, group.results, pin, report, parallelism, runtime
            )
            timings["gpu_deep"] = time.monotonic() - t0
            rounds += 1
    hosts = ["local", *(n.name for n in inventory.nodes), "cluster"]
    return DoctorReport(
        findings=ordered(findings, hosts),
        nodes=[n.name for n in inventory.nodes],
        elapsed_s=time.monotonic() - started,
        round_trips=rounds,
        timings=timings,
        facts=dict(group.results),
        waived=waived,
        pin_id=pin.image_id if pin else "",
        pin_alt=alt,
        listeners=left,
    )


__all__ = ["CATALOGUE", "DoctorReport", "run_doctor"]
