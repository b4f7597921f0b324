"""Bring the cluster up: token, old containers out, head and workers started together,
wait for all to join, probe.

Idempotent: a node whose container runs the pinned image and whose Ray is alive is left
alone; a dead worker is restarted alone; a restarted head brings its workers back too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from provisioner.cluster import commands, headprobe, layout, logs, preflight, status, token
from provisioner.cluster.status import ClusterStatus, ContainerFacts
from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError, ProvisionerError
from provisioner.image.lock import Pin
from provisioner.image.push import PushOptions, PushReport, push_image
from provisioner.inventory import Inventory, Node
from provisioner.remote import Pool, Session, fan_out


@dataclass
class UpResult:
    started: list[str] = field(default_factory=list)  # node names whose container was (re)started
    unchanged: list[str] = field(default_factory=list)
    status: ClusterStatus | None = None
    placement: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    doctor: preflight.Preflight | None = None
    push: PushReport | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.started)

    def to_json(self) -> dict[str, Any]:
        return {
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
        }


def install_token(pool: Pool, inventory: Inventory, *, deadline: float = 30) -> None:
    """Create the token locally if needed and write it to every node (0600, via stdin)."""
    path = token.ensure_token(inventory)
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


def _raise_first(errors: dict[str, ProvisionerError], what: str) -> None:
    if not errors:
        return
    names = ", ".join(sorted(errors))
    first = next(iter(errors.values()))
    raise OperationError(f"{what} on {names}: {first}", first.fix or "run `provisioner doctor`")


def needs_start(
    facts: ContainerFacts | None, image_id: str | None, alive: bool, *, head_restarted: bool
) -> bool:
    """Pure: should this node's container be (re)started?"""
    if facts is None or not facts.running or head_restarted or not alive:
        return True
    return status.image_matches(facts, image_id) is False


def wait_for_gcs(session: Session, inventory: Inventory, *, timeout: float) -> None:
    """Wait on the head until its GCS port accepts connections: one remote loop, polling
    every 0.1 s, that gives up early when the head's container stops."""
    result = session.run(
        commands.wait_for_port_command(
            inventory.cluster, inventory.head.address, inventory.ports.gcs, timeout
        ),
        timeout=timeout + 15,
    )
    if result.ok:
        return
    raise OperationError(
        f"the GCS did not open {commands.head_address(inventory)} within {timeout:.0f}s"
        + (" (the head's Ray container stopped)" if result.exit_code == 3 else ""),
        "see `provisioner logs` (gcs_server.out, raylet.out, container log)",
        where=inventory.head.name,
    )


def totals(nodes: list[dict[str, Any]]) -> dict[str, float]:
    """Sum of CPUs, memory (GiB), GPUs over alive nodes."""
    alive = [n for n in nodes if n.get("alive")]
    res = [n.get("resources", {}) for n in alive]
    return {
        "nodes": len(alive),
        "cpus": sum(r.get("CPU", 0) for r in res),
        "memory_gib": round(sum(r.get("memory", 0) for r in res) / 2**30, 1),
        "gpus": sum(r.get("GPU", 0) for r in res),
    }


def not_joined_report(pool: Pool, inventory: Inventory, missing: list[Node]) -> str:
    """Tail of the raylet and container logs of every node that did not join."""
    parts: list[str] = []
    group = fan_out(missing, lambda n: logs.tail_node(pool.session(n), inventory), deadline=30)
    for node in missing:
        text = group.results.get(node.name) or f"(no logs: {group.errors.get(node.name)})"
        causes = logs.triage_text(text)
        hint = "; ".join(sorted({f.cause for f in causes})) or "no known error pattern found"
        parts.append(f"--- {node.name} ({node.address}): likely cause: {hint}\n{text}")
    return "\n".join(parts)


def up(
    pool: Pool,
    inventory: Inventory,
    pin: Pin,
    *,
    force: bool = False,
    doctor: bool = True,
    join_timeout: float = 120,
    report: Reporter = quiet,
) -> UpResult:
    """The whole `up`: doctor (stop on errors unless forced), push the pin, then bring_up."""
    t0 = time.monotonic()
    result = UpResult()
    if doctor:
        report(f"doctor: checking {len(inventory.nodes)} node(s)")
        result.doctor = preflight.check(inventory, force=force, report=report, pool=pool)
        result.timings["doctor"] = time.monotonic() - t0
    t1 = time.monotonic()
    report(f"image: making every node hold {pin.short_id()}")
    result.push = push_image(inventory, pin, PushOptions(), report, pool=pool)
    result.timings["push"] = time.monotonic() - t1
    if result.push.errors:
        _raise_first(dict(result.push.errors), "could not push the pinned image")
    bring_up(
        pool,
        inventory,
        pin.image_id,
        image_id=pin.image_id,
        join_timeout=join_timeout,
        report=report,
        result=result,
    )
    result.seconds = time.monotonic() - t0
    return result


def bring_up(
    pool: Pool,
    inventory: Inventory,
    image: str,
    *,
    image_id: str | None = None,
    join_timeout: float = 120,
    probe: bool = True,
    report: Reporter = quiet,
    result: UpResult | None = None,
) -> UpResult:
    """Start what is missing, wait until every node joined, run the placement probe."""
    t0 = time.monotonic()
    result = result if result is not None else UpResult()
    install_token(pool, inventory)
    before = status.gather(pool, inventory, image_id=image_id, report=report)
    head = inventory.head
    head_session = pool.session(head)
    facts = before.facts
    head_state = before.node(head.name)
    head_alive = head_state.ray_alive and before.gcs_error is None
    head_restart = needs_start(facts.get(head.name), image_id, head_alive, head_restarted=False)
    to_start = [
        w
        for w in inventory.workers
        if needs_start(
            facts.get(w.name),
            image_id,
            before.node(w.name).ray_alive,
            head_restarted=head_restart,
        )
    ]
    if head_restart:
        to_start.insert(0, head)
    else:
        result.unchanged.append(head.name)
    result.unchanged += [w.name for w in inventory.workers if w not in to_start]

    # Node IDs of the raylets being replaced: the GCS may list them as alive for a while.
    replaced = {n.address for n in to_start}
    stale = frozenset(
        n["node_id"] for n in before.gcs if n.get("alive") and n.get("ip") in replaced
    )
    # Every old container goes first, so that no new worker meets the old head; then the
    # head and the workers start together (a worker's Ray waits for the head's by itself).
    # A node that fails either step is named after the others have started.
    remove = commands.remove_container_command(inventory.cluster)
    removed = fan_out(
        to_start, lambda n: pool.session(n).run(remove, timeout=60).check(), deadline=90
    )

    def start(node: Node) -> None:
        report(f"{node.name}: starting the {node.role} container")
        command = commands.docker_run_command(inventory, node, image)
        pool.session(node).run(command, timeout=60).check()

    group = fan_out([n for n in to_start if n.name in removed.results], start, deadline=120)
    result.started += [n.name for n in to_start if n.name in group.results]
    _raise_first({**removed.errors, **group.errors}, "could not start the Ray container")
    if head_restart:
        wait_for_gcs(head_session, inventory, timeout=60)
        report(f"{head.name}: GCS is up at {commands.head_address(inventory)}")
    report(f"{head.name}: waiting until every node joined" + (", then probing" if probe else ""))
    t_join = time.monotonic()
    joined = headprobe.join(head_session, inventory, timeout=join_timeout, stale=stale, place=probe)
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
            + not_joined_report(pool, inventory, missing),
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
    result.totals = totals(list(fresh.values()))
    after, errors = status.container_facts(pool, inventory)
    result.status = status.assemble(
        inventory, after, errors, list(fresh.values()), image_id=image_id
    )
    result.timings["start"] = time.monotonic() - t0
    result.seconds = time.monotonic() - t0
    return result
