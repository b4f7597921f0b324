"""Bring the cluster up: token and TLS certificates, old Ray out, head and workers started
together, wait for all to join, probe. How Ray runs on a node is the runtime's
(`provisioner.runtime`).

Idempotent: a node whose Ray runs what the cluster pins and is alive is left alone; a
dead worker is restarted alone; a restarted head brings its workers back too. A token
rotation (`provisioner.cluster.rotation`) restarts the head, and so every node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner.checks.facts import NodeFacts
from provisioner.checks.neighbours import port_owner
from provisioner.cluster import (
    allocation,
    headprobe,
    logs,
    membership,
    preflight,
    rotation,
    status,
)
from provisioner.cluster.headprobe import GcsNode
from provisioner.cluster.status import ClusterStatus
from provisioner.console import Reporter, quiet
from provisioner.doctor import DoctorReport
from provisioner.doctor.gather import gather_facts
from provisioner.errors import OperationError, ProvisionerError
from provisioner.gpu.plan import GpuPlan, plans_for, signature
from provisioner.image.lock import Pin
from provisioner.image.push import PushReport
from provisioner.inventory import Inventory, Node
from provisioner.node import commands, layout, tls, token
from provisioner.remote import Pool, Session, fan_out
from provisioner.runtime import runtime_for
from provisioner.runtime.base import RayState, Runtime


@dataclass
class UpResult:
    started: list[str] = field(default_factory=list)  # node names whose Ray was (re)started
    unchanged: list[str] = field(default_factory=list)
    status: ClusterStatus | None = None
    placement: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    doctor: preflight.Preflight | None = None
    push: PushReport | None = None
    timings: dict[str, float] = field(default_factory=dict)
    runtime: str = ""  # the runtime's name ("": not known)
    gpus: dict[str, GpuPlan] = field(default_factory=dict)  # node name -> its GPUs for Ray
    departed: membership.Removal | None = None  # nodes that left the inventory
    token: rotation.TokenPlan = field(default_factory=rotation.TokenPlan)

    @property
    def warnings(self) -> list[str]:
        return rotation.up_warnings(self.token)

    @property
    def changed(self) -> bool:
        return bool(self.started)

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "started": self.started,
            "unchanged": self.unchanged,
            "changed": self.changed,
            "placement": self.placement,
            "totals": self.totals,
            "seconds": round(self.seconds, 1),
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "status": self.status.to_json() if self.status else None,
            "doctor": self.doctor.to_json() if self.doctor else None,
            "push": self.push.to_json() if self.push else None,
            "gpus": {name: asdict(plan) for name, plan in self.gpus.items()},
            "departed": self.departed.to_json() if self.departed else None,
            "token": self.token.to_json(),
            "warnings": self.warnings,
        }


def install_token(
    inventory: Inventory, pool: Pool, *, deadline: float = 30, path: Path | None = None
) -> None:
    """Create the token locally if needed and write it to every node (0600, via stdin);
    `path`: another token file to install (a rotation's new token)."""
    path = path or token.ensure_token(inventory)
    data = path.read_bytes()
    command = token.install_command(inventory.cluster)

    def one(node: Node) -> None:
        pool.session(node).run(command, timeout=deadline, stdin=data).check()

    group = fan_out(inventory.nodes, one, deadline=deadline)
    if group.errors:
        names = ", ".join(sorted(group.errors))
        first = next(iter(group.errors.values()))
        raise OperationError(
            f"could not install the cluster token on {names}: {first}",
            f"the SSH user must own ~/{layout.node_dir(inventory.cluster)} on those nodes "
            "(Docker creates a missing mount directory as root): "
            f"sudo chown -R {inventory.head.ssh.user} ~/.provisioner there",
        )


def install_tls(
    inventory: Inventory, pool: Pool, *, deadline: float = 30, ca: tls.Authority | None = None
) -> None:
    """Give every node a fresh key and a certificate of the cluster's CA for its address,
    with the CA's certificate (0600 files, via stdin); `ca`: another CA (a rotation's new
    one). Nothing with TLS off (`ray: {tls: false}`)."""
    if not inventory.tls:
        return
    ca = ca or tls.ensure_authority(inventory)
    command = tls.install_command(inventory.cluster)
    bundles = {n.name: tls.bundle(ca, n) for n in inventory.nodes}

    def one(node: Node) -> None:
        pool.session(node).run(command, timeout=deadline, stdin=bundles[node.name]).check()

    group = fan_out(inventory.nodes, one, deadline=deadline)
    if group.errors:
        names = ", ".join(sorted(group.errors))
        first = next(iter(group.errors.values()))
        raise OperationError(
            f"could not install the cluster's TLS certificates on {names}: {first}",
            f"the SSH user must own ~/{layout.node_dir(inventory.cluster)} on those nodes: "
            f"sudo chown -R {inventory.head.ssh.user} ~/.provisioner there",
        )


def _raise_first(errors: dict[str, ProvisionerError], what: str) -> None:
    if not errors:
        return
    names = ", ".join(sorted(errors))
    first = next(iter(errors.values()))
    raise OperationError(f"{what} on {names}: {first}", first.fix or "run `provisioner doctor`")


def needs_start(
    state: RayState | None, current: bool | None, alive: bool, *, head_restarted: bool
) -> bool:
    """Pure: should this node's Ray be (re)started? `current`: it runs what the cluster
    pins (the runtime says; None: unknown)."""
    if state is None or not state.running or head_restarted or not alive:
        return True
    return current is False


def wait_for_gcs(session: Session, runtime: Runtime, *, timeout: float) -> None:
    """Wait on the head until its GCS port accepts connections: one remote loop, polling
    every 0.1 s, that gives up early when the head's Ray stops."""
    inventory = runtime.inventory
    result = session.run(
        commands.wait_for_port_command(
            inventory.head.address, inventory.ports.gcs, timeout, runtime.running_test()
        ),
        timeout=timeout + 15,
    )
    if result.ok:
        return
    raise OperationError(
        f"the GCS did not open {commands.head_address(inventory)} within {timeout:.0f}s"
        + (" (the head's Ray stopped)" if result.exit_code == 3 else ""),
        "see `provisioner logs` (gcs_server.out, raylet.out, the runtime's log)",
        where=inventory.head.name,
    )


def wait_for_jobs_api(session: Session, runtime: Runtime, *, timeout: float) -> None:
    """Wait on the head until Ray's dashboard (which serves the Jobs API that `submit`
    uses) accepts connections. The dashboard is a process of its own that the head starts
    beside the GCS; on a busy node it opens its port seconds after the cluster joined."""
    inventory = runtime.inventory
    port = inventory.ports.dashboard
    result = session.run(
        commands.wait_for_port_command("127.0.0.1", port, timeout, runtime.running_test()),
        timeout=timeout + 15,
    )
    if result.ok:
        return
    raise OperationError(
        f"Ray's dashboard (the Jobs API) did not open port {port} on the head within "
        f"{timeout:.0f}s" + (" (the head's Ray stopped)" if result.exit_code == 3 else ""),
        "see `provisioner logs` (dashboard.log, dashboard.err), then run `provisioner up` again",
        where=inventory.head.name,
    )


def totals(nodes: list[GcsNode]) -> dict[str, float]:
    """Sum of CPUs, memory (GiB), GPUs over alive nodes."""
    alive = [n for n in nodes if n.alive]
    res = [n.resources for n in alive]
    return {
        "nodes": len(alive),
        "cpus": sum(r.get("CPU", 0) for r in res),
        "memory_gib": round(sum(r.get("memory", 0) for r in res) / 2**30, 1),
        "gpus": sum(r.get("GPU", 0) for r in res),
    }


def not_joined_report(pool: Pool, runtime: Runtime, missing: list[Node]) -> str:
    """Tail of the raylet and runtime logs of every node that did not join."""
    parts: list[str] = []
    group = fan_out(missing, lambda n: logs.tail_node(pool.session(n), runtime), deadline=30)
    for node in missing:
        text = group.results.get(node.name) or f"(no logs: {group.errors.get(node.name)})"
        causes = logs.triage_text(text)
        hint = "; ".join(sorted({f.cause for f in causes})) or "no known error pattern found"
        parts.append(f"--- {node.name} ({node.address}): likely cause: {hint}\n{text}")
    return "\n".join(parts)


def gpu_plans(
    pool: Pool, inventory: Inventory, runtime: Runtime, facts: Mapping[str, NodeFacts] | None
) -> dict[str, GpuPlan]:
    """Each node's GPUs for Ray and how they reach it, from the doctor's facts; without
    them (`up --no-doctor`) from one facts round of their own."""
    if facts is None or set(facts) != {n.name for n in inventory.nodes}:
        facts = gather_facts(pool, inventory, "", reachability=False, parallelism=32).results
    return plans_for(inventory.nodes, {n: f.gpu for n, f in facts.items()}, runtime.gpu_methods)


def _refuse_foreign_gcs(
    inventory: Inventory, doctor: DoctorReport, states: dict[str, RayState] | None
) -> None:
    """With --force past the doctor: a GCS port held on the head by anything but this
    cluster's running Ray would answer the GCS wait for it. Stop before starting anything."""
    facts = doctor.facts.get(inventory.head.name)
    head = (states or {}).get(inventory.head.name)
    port = inventory.ports.gcs
    if facts is None or (head is not None and head.running):
        return
    if not any(listener.port == port for listener in facts.listening):
        return
    owner = port_owner(facts, port)
    holder = owner.describe() if owner is not None else "another process"
    raise OperationError(
        f"{inventory.head.name}: the GCS port {port} is held by {holder}, not by this "
        f"cluster's Ray: this cluster's GCS cannot start there; nothing was started",
        "give this cluster its own port block in the inventory (ray: {port_base: N}; "
        "`provisioner doctor` suggests a free one), or free the port",
        where=inventory.head.name,
    )


def up_cluster(
    inventory: Inventory,
    report: Reporter = quiet,
    *,
    pin: Pin | None = None,
    queue_timeout: float | None = None,
    on_nodes: Callable[[Inventory], None] | None = None,
    force: bool = False,
    doctor: bool = True,
    join_timeout: float = 120,
    push: str = "auto",
    rotate_token: bool = False,
) -> tuple[UpResult, int | None]:
    """`up` on the inventory's nodes, held first when a scheduler gives them: the one path
    of the CLI's `up` and of `jobs submit --retries`' repair. Returns the result and the
    scheduler's job that holds the nodes (None: no scheduler). `on_nodes`: told the nodes
    once they are known (the CLI watches them)."""
    held, job_id = allocation.hold(inventory, report, queue_timeout=queue_timeout)
    if on_nodes is not None:
        on_nodes(held)
    with Pool(held) as pool:
        result = up(
            held,
            pool,
            report,
            pin=pin,
            force=force,
            doctor=doctor,
            join_timeout=join_timeout,
            push=push,
            rotate_token=rotate_token,
        )
    return result, job_id


def up(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    pin: Pin | None = None,
    force: bool = False,
    doctor: bool = True,
    join_timeout: float = 120,
    push: str = "auto",
    rotate_token: bool = False,
) -> UpResult:
    """The whole `up`: doctor (stop on errors unless forced), the runtime's preparation
    (docker: push the pin; `push`, runtime.base.PUSH_MODES), then bring_up."""
    t0 = time.monotonic()
    token.ensure_cluster_id(inventory)  # marks what this cluster starts on the nodes
    runtime = runtime_for(inventory, pin, push=push)
    result = UpResult(runtime=runtime.name)
    if doctor:
        report(f"doctor: checking {len(inventory.nodes)} node(s)")
        result.doctor = preflight.check(inventory, pool, report, force=force)
        result.timings["doctor"] = time.monotonic() - t0
    t1 = time.monotonic()
    ready = (
        result.doctor.report.holding(runtime.image_id)
        if result.doctor and runtime.image_id
        else frozenset()
    )
    result.push = runtime.prepare(pool, report, ready=ready)
    result.timings["push"] = time.monotonic() - t1
    if result.push is not None and result.push.errors:
        _raise_first(dict(result.push.errors), "could not push the pinned image")
    states = result.doctor.report.ray_states(runtime) if result.doctor else None
    if result.doctor is not None:
        _refuse_foreign_gcs(inventory, result.doctor.report, states)
    bring_up(
        inventory,
        pool,
        report,
        runtime=runtime,
        join_timeout=join_timeout,
        result=result,
        states=states,
        facts=result.doctor.report.facts if result.doctor else None,
        rotate_token=rotate_token,
    )
    result.seconds = time.monotonic() - t0
    return result


def bring_up(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    runtime: Runtime,
    join_timeout: float = 120,
    probe: bool = True,
    result: UpResult | None = None,
    states: dict[str, RayState] | None = None,
    facts: Mapping[str, NodeFacts] | None = None,
    rotate_token: bool = False,
) -> UpResult:
    """Start what is missing, wait until every node joined, run the placement probe.

    `states`: this cluster's Ray on every node as the doctor's round found it (then no
    node is asked again); without them, one round trip asks. `facts`: the doctor's facts
    (the nodes' GPUs); without them, one round trip asks. `rotate_token`: a new token on
    every node, and every node restarted with it (rotation.plan also decides by itself)."""
    t0 = time.monotonic()
    result = result if result is not None else UpResult(runtime=runtime.name)
    install_token(inventory, pool)
    install_tls(inventory, pool)
    current = token.fingerprint(token.local_token_path(inventory))
    result.gpus = gpu_plans(pool, inventory, runtime, facts)
    before = status.gather(inventory, pool, report, runtime=runtime, states=states)
    # Nodes that left the inventory (the last up's record, the GCS's list) lose this
    # cluster's Ray before anything starts, so that none of them meets the new head.
    gone = membership.departed(inventory, membership.recorded_nodes(inventory), before.gcs)
    held = membership.recorded_tokens(inventory)
    if gone:
        result.departed = membership.remove_departed(gone, pool, runtime, report)
    failed = result.departed.failed if result.departed else []
    errors = result.departed.errors if result.departed else {}
    head = inventory.head
    head_session = pool.session(head)
    states = before.states

    def start_needed(node: Node, *, head_restarted: bool) -> bool:
        state = states.get(node.name)
        current = runtime.is_current(state) if state else None
        if state and state.gpus is not None and state.gpus != signature(result.gpus.get(node.name)):
            current = False  # its GPUs changed: a driver installed since, another subset
        alive = before.node(node.name).ray_alive
        if node is head:
            alive = alive and before.gcs_error is None
        return needs_start(state, current, alive, head_restarted=head_restarted)

    head_restart = start_needed(head, head_restarted=False)
    result.token = rotation.plan(
        asked=rotate_token,
        unfinished=token.rotation_unfinished(inventory),
        exposed=rotation.exposed(failed, errors, held, current),
        head_restart=head_restart,
    )
    if result.token.rotate:
        report(f"token: a new one for every node ({result.token.why}); every node restarts")
        try:
            # a new CA with the new token: kept from a rotation that did not finish
            new_ca = not token.rotation_unfinished(inventory)
            install_token(inventory, pool, path=token.begin_rotation(inventory))
            if inventory.tls:
                install_tls(inventory, pool, ca=tls.begin_rotation(inventory, fresh=new_ca))
        except OperationError as exc:
            raise OperationError(
                f"token not rotated: {exc.message}; nothing was restarted",
                f"{exc.fix}; then run `provisioner up` again (it finishes the rotation)",
            ) from exc
        head_restart = True
    to_start = [w for w in inventory.workers if start_needed(w, head_restarted=head_restart)]
    if head_restart:
        to_start.insert(0, head)
    else:
        result.unchanged.append(head.name)
    result.unchanged += [w.name for w in inventory.workers if w not in to_start]

    # Node IDs of the raylets being replaced (and of nodes that left): the GCS may list
    # them as alive for a while.
    replaced = {n.address for n in to_start} | {n.address for n in gone}
    stale = frozenset(n.node_id for n in before.gcs if n.alive and n.ip in replaced)
    # Every old Ray goes first, so that no new worker meets the old head; then the head
    # and the workers start together (a worker's Ray waits for the head's by itself).
    # A node that fails either step is named after the others have started.
    removed = fan_out(
        to_start,
        lambda n: pool.session(n).run(runtime.stop_command(n), timeout=60).check(),
        deadline=90,
    )

    def start(node: Node) -> None:
        report(f"{node.name}: " + runtime.starting.format(role=node.role))
        command = runtime.start_command(node, result.gpus.get(node.name))
        pool.session(node).run(command, timeout=90).check()

    group = fan_out([n for n in to_start if n.name in removed.results], start, deadline=120)
    result.started += [n.name for n in to_start if n.name in group.results]
    _raise_first({**removed.errors, **group.errors}, "could not start Ray")
    if result.token.rotate:  # every node now runs with the new token: it is the cluster's
        tls.finish_rotation(inventory)  # first: an unfinished token makes the next up redo it
        token.finish_rotation(inventory)
        report("token: rotated; a Ray holding the old one can no longer join")
    if head_restart:
        wait_for_gcs(head_session, runtime, timeout=60)
        report(f"{head.name}: GCS is up at {commands.head_address(inventory)}")
    report(f"{head.name}: waiting until every node joined" + (", then probing" if probe else ""))
    t_join = time.monotonic()
    joined = headprobe.join(head_session, runtime, timeout=join_timeout, stale=stale, place=probe)
    result.timings.update({f"join.{k}": v for k, v in joined.timings.items()})
    result.timings["join.began"] = t_join - t0
    nodes, placement = joined.nodes, joined.placement
    fresh = headprobe.fresh_nodes(nodes, stale)
    for node in inventory.nodes:
        if node.address in fresh:
            report(f"{node.name}: joined ({node.address})")
    missing = [n for n in inventory.nodes if n.address not in fresh]
    if missing:
        names = ", ".join(n.name for n in missing)
        raise OperationError(
            f"{len(missing)} node(s) did not join within {join_timeout:.0f}s: {names}\n"
            + not_joined_report(pool, runtime, missing),
            "fix the cause above, then run `provisioner up` again (it restarts only those nodes)",
        )
    if probe:
        result.placement = placement
        report(f"placement probe: {sum(bool(p.get('ok')) for p in placement)} node(s) ran a task")
        bad = [p for p in result.placement if not p.get("ok")]
        if bad or len(result.placement) != len(inventory.nodes):
            raise OperationError(
                f"the placement probe did not reach every node: {bad or result.placement}",
                "see `provisioner logs` for worker crashes on those nodes",
            )
    if head_restart:
        t_api = time.monotonic()
        wait_for_jobs_api(head_session, runtime, timeout=90)
        result.timings["jobs_api"] = time.monotonic() - t_api
        report(f"{head.name}: the Jobs API answers on port {inventory.ports.dashboard}")
    result.totals = totals(list(fresh.values()))
    # After the start: what was started runs what the runtime started; the rest as before.
    began = runtime.started_state()
    after = {n: began if n in result.started else s for n, s in before.states.items()}
    result.status = status.assemble(inventory, runtime, after, {}, list(fresh.values()))
    membership.record_nodes(
        inventory,
        also=failed,
        token=token.fingerprint(token.local_token_path(inventory)),
        held={n.address: held.get(n.address, current) for n in failed},
    )
    result.timings["start"] = time.monotonic() - t0
    result.seconds = time.monotonic() - t0
    return result
