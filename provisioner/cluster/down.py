"""Take the cluster down: collect logs, stop workers then the head (only this cluster's
Ray: the runtime's stop), check the ports."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.cluster import allocation, logs, membership, rotation, storage, subnet
from provisioner.console import Reporter, quiet
from provisioner.errors import ProvisionerError
from provisioner.inventory import Inventory, Node
from provisioner.inventory.loader import require_nodes
from provisioner.node import commands, token
from provisioner.remote import Pool, fan_out
from provisioner.remote.fanout import beside
from provisioner.runtime.context import ClusterContext
from provisioner.runtime.protocol import Runtime


@dataclass
class DownResult:
    removed: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    ports_busy: dict[str, list[int]] = field(default_factory=dict)
    logs: logs.Collected | None = None
    departed: membership.Removal | None = None  # nodes that left the inventory since `up`
    # departed nodes that could not be reached and still hold the token: warned about only
    # (the cluster is down; the next `up` starts a fresh head and so rotates the token)
    exposed: list[rotation.Exposed] = field(default_factory=list)
    slurm: allocation.Released | None = None  # the scheduler's job given back
    # before the scheduler's allocation ran: only its job given back, nothing on any node
    queued_only: bool = False

    @property
    def warnings(self) -> list[str]:
        return rotation.down_warnings(self.exposed)

    @property
    def ok(self) -> bool:
        """Ray stopped on every inventory node, its ports free, and every node's logs
        collected (when asked). A departed node not reached is a warning, not a failure."""
        logs_failed = self.logs is not None and bool(self.logs.errors)
        return not self.errors and not self.ports_busy and not logs_failed

    def to_json(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "errors": self.errors,
            "ports_busy": self.ports_busy,
            "ok": self.ok,
            "logs": self.logs.to_json() if self.logs else None,
            "departed": self.departed.to_json() if self.departed else None,
            "token": {"exposed": [e.to_json() for e in self.exposed]},
            "warnings": self.warnings,
        }


def ray_ports(inventory: Inventory, node: Node) -> list[int]:
    """The single ports Ray listens on for this node's role (worker range excluded)."""
    named = inventory.ports.named()
    if node.role == "worker":
        for head_only in ("gcs", "dashboard", "client"):
            named.pop(head_only, None)
    return sorted(named.values())


def parse_ports(stdout: str) -> list[int]:
    return sorted({int(x) for x in stdout.split() if x.isdigit()})


def bring_down(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    logs_dir: Path | None,
    runtime: Runtime,
    purge: bool = False,
) -> DownResult:
    """Idempotent: nodes without this cluster's Ray are fine; unreachable nodes are errors.
    Beside Ray, the head's store stops (its data kept unless `purge`)."""
    result = DownResult()
    if logs_dir is not None:
        try:
            result.logs = logs.collect(inventory, pool, report, directory=logs_dir, runtime=runtime)
        except (ProvisionerError, OSError) as exc:  # never keeps Ray from being stopped
            result.errors["logs"] = f"logs not collected: {exc}"

    def stop(node: Node) -> list[int]:
        report(f"{node.name}: {runtime.stopping}")
        session = pool.session(node)
        stopped = session.run(runtime.stop_command(node), timeout=60).check()
        for line in stopped.stderr.splitlines():  # what was left alone, and why
            if line.strip():
                report(f"{node.name}: {line.strip()}")
        check = session.run(commands.ports_in_use_command(ray_ports(inventory, node)), timeout=20)
        busy = parse_ports(check.stdout)
        report(f"{node.name}: Ray removed" + (f"; ports still in use: {busy}" if busy else ""))
        return busy

    gone = membership.departed(inventory, membership.recorded_nodes(inventory), [])
    if gone:
        held = membership.recorded_tokens(inventory)
        current = ""  # no readable token here: every unreached node may hold it
        with contextlib.suppress(ProvisionerError):
            current = token.fingerprint(token.local_token_path(inventory))
        result.departed = membership.remove_departed(gone, pool, runtime, report)
        failed = result.departed.failed
        result.exposed = rotation.exposed(failed, result.departed.errors, held, current)
        membership.record_nodes(
            inventory,
            also=failed,
            token=current or None,
            held={n.address: held.get(n.address, current) for n in failed},
        )

    def stop_store() -> None:
        try:
            storage.stop(inventory, pool, report, purge=purge)
        except ProvisionerError as exc:
            result.errors["storage"] = f"the head's store not stopped: {exc}"

    # the store stops beside Ray (the results came home before `down`; its data is kept)
    with beside(stop_store) as stopping:
        for stage in (list(inventory.workers), [inventory.head]):
            group = fan_out(stage, stop, deadline=90)
            for name, busy in group.results.items():
                result.removed.append(name)
                if busy:
                    result.ports_busy[name] = busy
            result.errors.update(group.reasons())
    stopping.result()
    return result


def down_cluster(
    cluster: ClusterContext,
    report: Reporter = quiet,
    *,
    logs_dir: Path | None,
    on_nodes: Callable[[Inventory], None] | None = None,
    purge: bool = False,
) -> DownResult:
    """`down`: Ray stopped on the inventory's nodes, then the scheduler's job given back
    (before the allocation ever ran: the job only, nothing on any node, `queued_only`). A
    job still queued after that is an error. `on_nodes`: told the nodes before anything is
    stopped there, when there are nodes (the CLI watches them and stops the running jobs;
    what it raises stops `down` before anything is stopped). `cluster`: the command's
    context (its runtime is built for the nodes). `purge`: the head's store's data goes too."""
    inventory = cluster.inventory
    if not allocation.on_nodes(inventory):
        with Pool(inventory) as pool:
            result = DownResult(queued_only=True)
            result.slurm = allocation.give_back(inventory, pool, report)
    else:
        inventory = require_nodes(inventory)
        if on_nodes is not None:
            on_nodes(inventory)
        with Pool(inventory) as pool:
            inventory = subnet.resolve_ray_subnet(inventory, pool, report)
            runtime = cluster.on(inventory).runtime
            result = bring_down(
                inventory, pool, report, logs_dir=logs_dir, runtime=runtime, purge=purge
            )
            result.slurm = allocation.give_back(inventory, pool, report)
    if result.slurm is not None and not result.slurm.left_queue:
        result.errors["slurm"] = f"SLURM job {result.slurm.job_id} is still in the queue"
    return result
