"""Bring the cluster up: token and TLS certificates, old Ray out, head and workers started
together, wait for all to join, probe. How Ray runs on a node is the runtime's
(`provisioner.runtime`).

Idempotent: a node whose Ray runs what the cluster pins and is alive is left alone; a
dead worker is restarted alone; a restarted head brings its workers back too. A token
rotation (`provisioner.cluster.rotation`) restarts the head, and so every node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding
from provisioner.checks.neighbours import port_owner
from provisioner.cluster import (
    allocation,
    headprobe,
    logs,
    membership,
    preflight,
    rotation,
    status,
    storage,
    subnet,
)
from provisioner.cluster.headprobe import GcsNode
from provisioner.cluster.status import ClusterStatus
from provisioner.cluster.storage import StoreState
from provisioner.console import Reporter, quiet
from provisioner.doctor import DoctorReport
from provisioner.doctor.gather import gather_facts, stop_listener_command, stop_listeners
from provisioner.errors import InputError, OperationError, ProvisionerError
from provisioner.gpu.assignment import (
    GpuPlan,
    Withheld,
    plans_for,
    signature,
    withhold,
    without_gpus,
)
from provisioner.image.pin import Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import commands, layout, tls, token
from provisioner.remote import Pool, Session, fan_out
from provisioner.remote.fanout import beside
from provisioner.remote.results import GroupResult, Result
from provisioner.runtime.context import ClusterContext
from provisioner.runtime.protocol import DeliveryReport, RayState, Runtime


@dataclass
class UpResult:
    started: list[str] = field(default_factory=list)  # node names whose Ray was (re)started
    unchanged: list[str] = field(default_factory=list)
    status: ClusterStatus | None = None
    placement: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    doctor: preflight.Preflight | None = None
    push: DeliveryReport | None = None  # the runtime's delivery of the image (None: none)
    timings: dict[str, float] = field(default_factory=dict)
    runtime: str = ""  # the runtime's name ("": not known)
    gpus: dict[str, GpuPlan] = field(default_factory=dict)  # node name -> its GPUs for Ray
    # node name -> the GPUs it has that Ray does not get (the image's torch cannot use them)
    withheld: dict[str, Withheld] = field(default_factory=dict)
    departed: membership.Removal | None = None  # nodes that left the inventory
    token: rotation.TokenPlan = field(default_factory=rotation.TokenPlan)
    storage: StoreState | None = None  # the head's store every node shares (None: off)

    @property
    def warnings(self) -> list[str]:
        findings = self.doctor.report.findings if self.doctor else []
        return rotation.up_warnings(self.token) + gpu_warnings(findings, self.withheld)

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
            "gpus_withheld": {name: asdict(w) for name, w in self.withheld.items()},
            "departed": self.departed.to_json() if self.departed else None,
            "token": self.token.to_json(),
            "storage": self.storage.to_json() if self.storage else None,
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


def install_token_and_tls(inventory: Inventory, pool: Pool) -> None:
    """The token and the TLS files on every node, side by side (two commands on each node's
    connection at once, where one after the other cost two round trips); the token's
    error first when both fail. Ctrl-C waits for neither (`beside`)."""
    with beside(lambda: install_tls(inventory, pool)) as tls_done:
        install_token(inventory, pool)
    tls_done.result()


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
            inventory.head.ray_address, inventory.ports.gcs, timeout, runtime.running_test()
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
    pool: Pool,
    inventory: Inventory,
    runtime: Runtime,
    facts: Mapping[str, NodeFacts] | None,
    image_cuda: str | None = None,
) -> tuple[dict[str, GpuPlan], dict[str, Withheld]]:
    """Each node's GPUs for Ray and how they reach it, from the doctor's facts; without
    them (`up --no-doctor`) from one facts round of their own. Only GPUs the image's torch
    can use go to Ray (`image_cuda`: its CUDA, "" the CPU build, None no image); the
    others are the second dict."""
    if facts is None or set(facts) != {n.name for n in inventory.nodes}:
        facts = gather_facts(
            pool, inventory, "", reachability=False, parallelism=32, judges=runtime.judges
        ).results
    gpus = {n: f.gpu for n, f in facts.items()}
    return withhold(plans_for(inventory.nodes, gpus, runtime.gpu_methods), gpus, image_cuda)


def image_cuda(runtime: Runtime, pin: Pin | None) -> str | None:
    """The CUDA of the torch that Ray's processes run: the pin's ("": the CPU build, as a
    pin without `cuda` is); None where Ray does not run the pinned image (host mode) or
    no pin is known."""
    if pin is None or not runtime.caps.needs_image:
        return None
    return str(pin.extra.get("cuda") or "")


# The doctor's warnings that concern what `up` starts, shown by `up` too (its errors stop it).
UP_CONCERNS = ("gpu.",)


def gpu_warnings(findings: Sequence[Finding], withheld: Mapping[str, Withheld]) -> list[str]:
    """Pure: the doctor's warnings of what `up` starts (`UP_CONCERNS`), then a node whose
    GPUs Ray did not get and of which the doctor said nothing (`up --no-doctor`, or past
    its gpu.cuda error with --force): each with its fix."""
    lines = [
        f"{f.host}: {f.check}: {f.message}. Fix: {f.fix}"
        for f in findings
        if f.severity == "warning" and f.check.startswith(UP_CONCERNS)
    ]
    told = {f.host for f in findings if f.check == "gpu.cuda" and f.severity == "warning"}
    lines += [
        f"{name}: gpu.cuda: {w.why}: Ray gets none of its {w.count} GPU(s), learners train "
        f"on CPU. Fix: {w.fix}"
        for name, w in sorted(withheld.items())
        if name not in told
    ]
    return lines


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


@dataclass(frozen=True)
class UpOptions:
    """How `up` runs: the CLI's flags, one object instead of a parameter each."""

    force: bool = False  # past the doctor's errors (never the ones it never forces)
    doctor: bool = True  # run the doctor first
    join_timeout: float = 120  # seconds every node has to join
    push: str = "auto"  # runtime.protocol.PUSH_MODES
    rotate_token: bool = False  # a new token on every node, and every node restarted
    probe: bool = True  # the placement probe after the join
    queue_timeout: float | None = None  # a scheduler's queue: give up after (None: wait)


@dataclass(frozen=True)
class UpContext:
    """One `up`: what every step works on, built once (`context`)."""

    inventory: Inventory
    pool: Pool
    runtime: Runtime
    pin: Pin | None
    report: Reporter
    options: UpOptions = UpOptions()

    @property
    def cluster(self) -> ClusterContext:
        """The command's context as the doctor takes it: this `up`'s nodes, runtime and pin."""
        return ClusterContext(self.inventory, self.pin, push=self.options.push, built=self.runtime)


def context(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    pin: Pin | None = None,
    options: UpOptions = UpOptions(),
) -> UpContext:
    """The context of one `up`: the cluster's id made (it marks what this cluster starts
    on the nodes) and the inventory's runtime built (an unknown one refused, exit 2)."""
    token.ensure_cluster_id(inventory)
    runtime = ClusterContext(inventory, pin, push=options.push).runtime  # after the id
    return UpContext(inventory, pool, runtime, pin, report, options)


@dataclass
class Plan:
    """What `plan` decided from the status round, for the steps that follow."""

    began: float  # time.monotonic() when bring_up began
    before: ClusterStatus  # this cluster's Ray on every node, and the GCS's nodes, before
    to_start: list[Node]  # the nodes whose Ray is (re)started, the head first
    head_restart: bool
    stale: frozenset[str]  # GCS node IDs of raylets being replaced (and of nodes that left)
    unreached: list[Node]  # nodes that left the inventory and could not be reached
    held: dict[str, str]  # address -> the token fingerprint the last up recorded there
    token: str  # the current token's fingerprint, before any rotation


def up_cluster(
    cluster: ClusterContext,
    report: Reporter = quiet,
    *,
    options: UpOptions = UpOptions(),
    on_nodes: Callable[[Inventory], None] | None = None,
    pool: Pool | None = None,
) -> tuple[UpResult, int | None]:
    """`up` on the inventory's nodes, held first when a scheduler gives them: the one path
    of the CLI's `up` and of `jobs submit --retries`' repair. Returns the result and the
    scheduler's job that holds the nodes (None: no scheduler). `on_nodes`: told the nodes
    once they are known (the CLI watches them). `pool`: connections to the inventory's
    nodes to use (the CLI's, warming while the command loaded), left open; with a
    scheduler, to its login node only (the nodes it gives get their own). A token rotation
    of a scheduler's inventory is refused (InputError) before anything runs. `cluster`: the
    command's context (its inventory, and the pin it read once)."""
    inventory = cluster.inventory
    if options.rotate_token and inventory.slurm is not None:
        raise InputError(
            "--rotate-token does not apply to a scheduler inventory: the allocation is the "
            "membership, and a node leaves it only when the job ends (SLURM ends Ray there)",
            f"run `provisioner up` without it; for a new token anyway: `provisioner down`, "
            f"remove {token.local_token_path(inventory)}, then `provisioner up`",
            where=str(inventory.path),
        )
    held, job_id = allocation.hold(
        inventory, report, queue_timeout=options.queue_timeout, pool=pool
    )
    if on_nodes is not None:
        on_nodes(held)
    with ExitStack() as stack:
        if pool is None or job_id is not None:
            pool = stack.enter_context(Pool(held))
        held = subnet.resolve_ray_subnet(held, pool, report)
        result = up(held, pool, report, pin=cluster.pin, options=options)
    return result, job_id


def up(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    pin: Pin | None = None,
    options: UpOptions = UpOptions(),
) -> UpResult:
    """The whole `up`: doctor (stop on errors unless forced), the runtime's delivery of the
    image (docker: push the pin; `options.push`, runtime.protocol.PUSH_MODES), then bring_up."""
    t0 = time.monotonic()
    ctx = context(inventory, pool, report, pin=pin, options=options)
    result = UpResult(runtime=ctx.runtime.name)
    # The token and the TLS files go beside the doctor's round (on the same connections,
    # each its own channel): they do not depend on its verdict, and the files are this
    # cluster's own (0600, in the SSH user's ~/.provisioner), the same any `up` writes. The
    # doctor's findings come first; the install's error only after a doctor that passed.
    # Ctrl-C (in the doctor's round, still connecting to a hung node) waits for neither.
    with beside(lambda: install_token_and_tls(inventory, pool)) as installing:
        found = check(ctx, result)
    # the doctor's listeners on Ray's ports: each ends with its node's start command (one
    # round trip fewer before Ray starts); what no start took, ends below
    listeners = dict(found.listeners) if found else {}
    try:
        installing.result()
        prepare(ctx, result)
        # Ray needs nothing of the store to start (each job gets it in its own
        # environment): the store starts beside Ray, and `up` ends when both are up
        with beside(lambda: serve_storage(ctx, result)) as serving:
            states = found.ray_states(ctx.runtime) if found else None
            if found is not None:
                _refuse_foreign_gcs(inventory, found, states)
            facts = found.facts if found else None
            bring_up(ctx, result, states=states, facts=facts, installed=True, listeners=listeners)
        serving.result()
    finally:
        if listeners:
            stop_listeners(pool, inventory, listeners)
    result.seconds = time.monotonic() - t0
    return result


def check(ctx: UpContext, result: UpResult) -> DoctorReport | None:
    """The doctor (unless `options.doctor` is off): DoctorStopped on errors unless forced."""
    if not ctx.options.doctor:
        return None
    t0 = time.monotonic()
    ctx.report(f"doctor: checking {len(ctx.inventory.nodes)} node(s)")
    result.doctor = preflight.check(
        ctx.cluster, ctx.pool, ctx.report, force=ctx.options.force, keep_listeners=True
    )
    result.timings["doctor"] = time.monotonic() - t0
    return result.doctor.report


def prepare(ctx: UpContext, result: UpResult) -> None:
    """The runtime's delivery of the image before any start (docker: push the pin; podman:
    `podman load`), skipping the nodes the doctor saw holding it; a node it failed on stops
    `up`. Nothing for a runtime without one (host)."""
    t0 = time.monotonic()
    delivery = ctx.runtime.delivery()
    if delivery is not None:
        image_id = delivery.image_id
        doctor = result.doctor
        ready = doctor.report.holding(image_id) if doctor and image_id else {}
        result.push = delivery.deliver(ctx.pool, ctx.report, ready=ready)
    result.timings["push"] = time.monotonic() - t0
    if result.push is not None and result.push.errors:
        _raise_first(dict(result.push.errors), "could not push the pinned image")


def serve_storage(ctx: UpContext, result: UpResult) -> None:
    """The head serves the storage every node shares (cluster.storage), beside Ray's start:
    jobs get it as Tune's default storage. Nothing with `storage: {kind: none}`."""
    t0 = time.monotonic()
    result.storage = storage.ensure(ctx.inventory, ctx.pool, ctx.report)
    if result.storage is not None:
        result.timings["storage"] = time.monotonic() - t0


def bring_up(
    ctx: UpContext,
    result: UpResult | None = None,
    *,
    states: dict[str, RayState] | None = None,
    facts: Mapping[str, NodeFacts] | None = None,
    installed: bool = False,
    listeners: dict[str, int] | None = None,
) -> UpResult:
    """Start what is missing, wait until every node joined, run the placement probe, in
    steps: plan, stop, start, wait, probe, record.

    `states`: this cluster's Ray on every node as the doctor's round found it (then no
    node is asked again); without them, one round trip asks. `facts`: the doctor's facts
    (the nodes' GPUs); without them, one round trip asks. `installed`: the token and the
    TLS files are on every node already (`up` installs them beside the doctor's round).
    `listeners`: the doctor's listeners still running (node name -> PID), ended by the start
    round (taken out of the dict as they are)."""
    result = result if result is not None else UpResult(runtime=ctx.runtime.name)
    decided = plan(ctx, result, states=states, facts=facts, installed=installed)
    stopped = stop(ctx, decided)
    start(ctx, result, decided, stopped, listeners if listeners is not None else {})
    joined = wait(ctx, result, decided)
    probe(ctx, result, decided, joined)
    record(ctx, result, decided, joined)
    return result


def plan(
    ctx: UpContext,
    result: UpResult,
    *,
    states: dict[str, RayState] | None,
    facts: Mapping[str, NodeFacts] | None,
    installed: bool = False,
) -> Plan:
    """Token and TLS on every node, each node's GPUs, one status round; nodes that left the
    inventory lose this cluster's Ray (so that none meets the new head); then which nodes
    (re)start, and whether the token rotates (`options.rotate_token`, or rotation.plan's
    own reasons), its new token installed before anything restarts."""
    began = time.monotonic()
    inventory, pool = ctx.inventory, ctx.pool
    if not installed:
        install_token_and_tls(inventory, pool)
    current = token.fingerprint(token.local_token_path(inventory))
    result.gpus, result.withheld = gpu_plans(
        pool, inventory, ctx.runtime, facts, image_cuda(ctx.runtime, ctx.pin)
    )
    before = status.gather(inventory, pool, ctx.report, runtime=ctx.runtime, states=states)
    gone = membership.departed(inventory, membership.recorded_nodes(inventory), before.gcs)
    held = membership.recorded_tokens(inventory)
    if gone:
        result.departed = membership.remove_departed(gone, pool, ctx.runtime, ctx.report)
    unreached = result.departed.failed if result.departed else []
    errors = result.departed.errors if result.departed else {}
    head = inventory.head
    head_restart = start_needed(ctx, result.gpus, before, head, head_restarted=False)
    result.token = rotation.plan(
        asked=ctx.options.rotate_token,
        unfinished=token.rotation_unfinished(inventory),
        exposed=rotation.exposed(unreached, errors, held, current),
        head_restart=head_restart,
    )
    if result.token.rotate:
        _begin_rotation(ctx, result)
        head_restart = True
    workers = inventory.workers
    to_start = [
        w for w in workers if start_needed(ctx, result.gpus, before, w, head_restarted=head_restart)
    ]
    if head_restart:
        to_start.insert(0, head)
    else:
        result.unchanged.append(head.name)
    result.unchanged += [w.name for w in workers if w not in to_start]
    # Node IDs of the raylets being replaced (and of nodes that left): the GCS may list
    # them as alive for a while.
    replaced = {n.ray_address for n in to_start} | {n.ray_address for n in gone}
    stale = frozenset(n.node_id for n in before.gcs if n.alive and n.ip in replaced)
    return Plan(began, before, to_start, head_restart, stale, unreached, held, current)


def start_needed(
    ctx: UpContext,
    gpus: Mapping[str, GpuPlan],
    before: ClusterStatus,
    node: Node,
    *,
    head_restarted: bool,
) -> bool:
    """Should this node's Ray be (re)started, by the status round and its GPU plan?"""
    state = before.states.get(node.name)
    current = ctx.runtime.is_current(state) if state else None
    if state and state.gpus is not None and state.gpus != signature(gpus.get(node.name)):
        current = False  # its GPUs changed: a driver installed since, another subset
    shared = ctx.inventory.storage_path if ctx.inventory.storage == "path" else ""
    if state and state.storage is not None and state.storage != shared:
        current = False  # the inventory's shared folder changed: mounted only at its start
    alive = before.node(node.name).ray_alive
    if node is ctx.inventory.head:
        alive = alive and before.gcs_error is None
    return needs_start(state, current, alive, head_restarted=head_restarted)


def _begin_rotation(ctx: UpContext, result: UpResult) -> None:
    """A new token (and with TLS a new CA) on every node; nothing restarted yet."""
    inventory, pool = ctx.inventory, ctx.pool
    ctx.report(f"token: a new one for every node ({result.token.why}); every node restarts")
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


def stop(ctx: UpContext, decided: Plan) -> GroupResult[Result | None]:
    """Every old Ray of the nodes to start goes first, so that no new worker meets the old
    head. A node where the status round saw none of this cluster's Ray (absent) has
    nothing to remove: no round trip there (None). A node that fails is named after the
    others have started."""
    runtime, pool = ctx.runtime, ctx.pool
    states = decided.before.states
    empty = {n.name for n in decided.to_start if (s := states.get(n.name)) and s.absent}
    group: GroupResult[Result | None] = fan_out(
        [n for n in decided.to_start if n.name not in empty],
        lambda n: pool.session(n).run(runtime.stop_command(n), timeout=60).check(),
        deadline=90,
    )
    group.results.update(dict.fromkeys(empty))
    return group


def start(
    ctx: UpContext,
    result: UpResult,
    decided: Plan,
    stopped: GroupResult[Any],
    listeners: dict[str, int] | None = None,
) -> None:
    """The head and the workers stopped start together (a worker's Ray waits for the
    head's by itself); a node that failed to stop or start stops `up`, named. A rotation
    finishes here: every node runs with the new token. `listeners`: the doctor's listeners
    (node name -> PID): each node's ends first in its start command, and those of nodes
    not started end in the same round; each is taken out of the dict once sent."""
    runtime, pool = ctx.runtime, ctx.pool
    pending = listeners if listeners is not None else {}

    def ending(node: Node) -> str:
        pid = pending.pop(node.name, None)
        return "" if pid is None else stop_listener_command(pid) + "; "

    def one(node: Node) -> None:
        ctx.report(f"{node.name}: " + runtime.starting.format(role=node.role))
        given = without_gpus(node) if node.name in result.withheld else node
        command = ending(node) + runtime.start_command(given, result.gpus.get(node.name))
        pool.session(node).run(command, timeout=90).check()

    ready = [n for n in decided.to_start if n.name in stopped.results]
    # the listeners of the nodes not started end in the same round, beside the starts
    rest = [n for n in ctx.inventory.nodes if n.name in pending and n not in ready]
    with ThreadPoolExecutor(1) as side:
        if rest:
            side.submit(
                stop_listeners, pool, ctx.inventory, {n.name: pending.pop(n.name) for n in rest}
            )
        group = fan_out(ready, one, deadline=120)
    result.started += [n.name for n in decided.to_start if n.name in group.results]
    _raise_first({**stopped.errors, **group.errors}, "could not start Ray")
    if result.token.rotate:  # every node now runs with the new token: it is the cluster's
        tls.finish_rotation(ctx.inventory)  # first: an unfinished token makes the next up redo it
        token.finish_rotation(ctx.inventory)
        ctx.report("token: rotated; a Ray holding the old one can no longer join")


def wait(ctx: UpContext, result: UpResult, decided: Plan) -> headprobe.Joined:
    """A restarted head's GCS first, then every node joined (one round on the head, the
    placement probe in the same `ray.init` when `options.probe`); a node that did not join
    stops `up` with its logs' tail."""
    inventory, head = ctx.inventory, ctx.inventory.head
    head_session = ctx.pool.session(head)
    if decided.head_restart:
        wait_for_gcs(head_session, ctx.runtime, timeout=60)
        ctx.report(f"{head.name}: GCS is up at {commands.head_address(inventory)}")
    place = ctx.options.probe
    ctx.report(
        f"{head.name}: waiting until every node joined" + (", then probing" if place else "")
    )
    t_join = time.monotonic()
    timeout = ctx.options.join_timeout
    joined = headprobe.join(
        head_session, ctx.runtime, timeout=timeout, stale=decided.stale, place=place
    )
    result.timings.update({f"join.{k}": v for k, v in joined.timings.items()})
    result.timings["join.began"] = t_join - decided.began
    fresh = headprobe.fresh_nodes(joined.nodes, decided.stale)
    for node in inventory.nodes:
        if node.ray_address in fresh:
            ctx.report(f"{node.name}: joined ({node.ray_address})")
    missing = [n for n in inventory.nodes if n.ray_address not in fresh]
    if missing:
        names = ", ".join(n.name for n in missing)
        raise OperationError(
            f"{len(missing)} node(s) did not join within {timeout:.0f}s: {names}\n"
            + not_joined_report(ctx.pool, ctx.runtime, missing),
            "fix the cause above, then run `provisioner up` again (it restarts only those nodes)",
        )
    return joined


def probe(ctx: UpContext, result: UpResult, decided: Plan, joined: headprobe.Joined) -> None:
    """The placement probe's verdict (a task ran on every node), then, after a head
    restart, the Jobs API that `submit` uses answering."""
    inventory, head = ctx.inventory, ctx.inventory.head
    if ctx.options.probe:
        result.placement = joined.placement
        ok = sum(bool(p.get("ok")) for p in joined.placement)
        ctx.report(f"placement probe: {ok} node(s) ran a task")
        bad = [p for p in result.placement if not p.get("ok")]
        if bad or len(result.placement) != len(inventory.nodes):
            raise OperationError(
                f"the placement probe did not reach every node: {bad or result.placement}",
                "see `provisioner logs` for worker crashes on those nodes",
            )
    if decided.head_restart:
        t_api = time.monotonic()
        wait_for_jobs_api(ctx.pool.session(head), ctx.runtime, timeout=90)
        result.timings["jobs_api"] = time.monotonic() - t_api
        ctx.report(f"{head.name}: the Jobs API answers on port {inventory.ports.dashboard}")


def record(ctx: UpContext, result: UpResult, decided: Plan, joined: headprobe.Joined) -> None:
    """The result's totals and status, and the nodes recorded as this cluster's (with the
    nodes that left but could not be reached: the next up tries them again)."""
    inventory = ctx.inventory
    fresh = list(headprobe.fresh_nodes(joined.nodes, decided.stale).values())
    result.totals = totals(fresh)
    # After the start: what was started runs what the runtime started; the rest as before.
    began = ctx.runtime.started_state()
    states = decided.before.states
    after = {n: began if n in result.started else s for n, s in states.items()}
    result.status = status.assemble(inventory, ctx.runtime, after, {}, fresh)
    membership.record_nodes(
        inventory,
        also=decided.unreached,
        token=token.fingerprint(token.local_token_path(inventory)),
        held={n.address: decided.held.get(n.address, decided.token) for n in decided.unreached},
    )
    result.timings["start"] = time.monotonic() - decided.began
    result.seconds = time.monotonic() - decided.began
