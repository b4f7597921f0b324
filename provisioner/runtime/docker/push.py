"""`provisioner image push`: make every node hold exactly the pinned image.

Three shapes: direct, every node in parallel (bounded), each from this machine
(`direct.py`); the star (`--star`), the head from this machine and the workers from the
head (`star.py`); the chain (`--chain`), in which every node streams on what it receives
(`chain.py`). A node's failure stops no other.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import replace

from provisioner.console import Reporter, quiet
from provisioner.errors import ProvisionerError
from provisioner.image.pin import Pin
from provisioner.inventory import Inventory, Node
from provisioner.node.delivery import DeliveryReport, NodeDelivery
from provisioner.remote import Pool, Session, fan_out
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.chain import push_chain
from provisioner.runtime.docker.direct import (
    SavedCache,
    end_loads_command,
    push_node,
)
from provisioner.runtime.docker.star import push_star

__all__ = ["PushOptions", "push_image"]

DEFAULT_OPTIONS = PushOptions()


def push_image(
    inventory: Inventory,
    pool: Pool | None,
    report: Reporter = quiet,
    *,
    pin: Pin,
    opts: PushOptions = DEFAULT_OPTIONS,
    held: Collection[str] = (),
) -> DeliveryReport:
    """Push the pin to every node of the inventory; one node's failure stops no other.

    `pool`: SSH sessions to reuse (and leave open), as `up` does; None: its own.
    `held`: names of nodes already known to hold the pin under its ID (the doctor's
    round saw it there): when every node does, nothing is asked; a direct push skips
    them, a star or a chain plans its own senders. `up` runs containers by the pinned ID: no tag
    is needed."""
    t0 = time.monotonic()
    out = DeliveryReport(pin.image_id, opts.tag)
    everyone = {n.name for n in inventory.nodes}
    if not everyone <= set(held) and (opts.star or opts.chain):
        held = ()
    for name in held:
        out.nodes[name] = NodeDelivery(name, "none", len(pin.layers), via="doctor")
    todo = [n for n in inventory.nodes if n.name not in held]
    if not todo:
        report("image: every node holds the pinned image (the doctor saw it); nothing sent")
        return out
    own = pool is None
    pool = pool or Pool(inventory)
    opts = replace(opts, push_id=secrets.token_hex(8))
    try:
        if opts.chain and inventory.workers:
            push_chain(pool, inventory, pin, opts, report, out)
        elif opts.star and inventory.workers:
            out.mode = "star"
            push_star(pool, inventory, pin, opts, report, out)
        else:
            group = fan_out(
                todo,
                _bind(pool, pin, opts, report),
                parallelism=opts.parallelism,
                deadline=opts.timeout * (opts.retries + 1),
            )
            out.nodes.update(group.results)
            out.errors.update(group.errors)
    except BaseException:  # Ctrl-C (or a bug): this push's loads end with it
        end_loads(pool, todo, opts.push_id)
        raise
    finally:
        if own:
            pool.close()
    out.seconds = time.monotonic() - t0
    return out


def _bind(
    pool: Pool, pin: Pin, opts: PushOptions, report: Reporter
) -> Callable[[Node], NodeDelivery]:
    lock = threading.Lock()
    saved = SavedCache(pin, opts.cache_dir)

    def locked_report(line: str) -> None:
        with lock:
            report(line)

    return lambda node: push_node(pool, node, pin, opts, locked_report, saved)


END_LOADS_S = 6.0  # how long an interrupted push waits for its nodes to end its loads


def end_loads(pool: Pool, nodes: Collection[Node], push_id: str) -> None:
    """End the loads of push `push_id` still reading on the nodes it reached (each by the
    pid its file holds, `end_loads_command`), at most END_LOADS_S. Each node gets a
    connection of its own: on the push's, the command would queue behind the bytes still
    in flight to a node whose load reads slowly (the one TCP stream carries both), and
    the load would go on until they drained, minutes on a loaded node (the full suite saw
    two still reading 120 s on). A node that does not answer in time keeps its load until
    its sshd sees the push's connection end."""
    command = end_loads_command(push_id)
    reached = set(pool.open_sessions())

    def end(node: Node) -> None:
        with contextlib.suppress(ProvisionerError):
            session = Session.connect(node)
            try:
                session.run(command, timeout=END_LOADS_S)
            finally:
                session.close()

    threads = [
        threading.Thread(target=end, args=(n,), daemon=True) for n in nodes if n.name in reached
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + END_LOADS_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
