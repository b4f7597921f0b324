"""Forwarding relay: the control machine sends the image once, and every node streams what
it receives on to the next node while it loads it (`image push --forward`, `up --push`).

The plan is forward_plan.py's. Here: one round trip per node gathers what it holds
(nodes that hold the pin are only verified and tagged); every node of the chain gets a
private directory with a temporary key, the known_hosts of the nodes it may send to
(host keys this machine already trusts; no trust on first use) and its hop script; its
authorized_keys gets the key's public half, restricted to the chain's addresses, to the
hop script as the one command and to a lifetime (relay.py's add/remove: the file ends
byte for byte as it began). The control machine streams into the first node's hop; each
hop forwards with OpenSSH to the next. Every node counts the bytes it receives, so the
bytes each sender put on the wire are read, not estimated. The control machine then
verifies and tags every node; nodes that fail are re-fed (forward_plan.refeed_chain), at
most `retries` more rounds. Keys and directories are removed at the end, whatever
happens; a removal that fails is an error of the push.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable

from provisioner.console import Reporter
from provisioner.errors import ConnectError, ProvisionerError, RemoteError
from provisioner.image.direct import (
    NodePush,
    PushOptions,
    PushReport,
    SavedCache,
    _Guarded,
    gather_plan,
    push_node,
    save_stream,
    verify_and_tag,
)
from provisioner.image.forward_plan import (
    ALIVE_S,
    HOP_SCRIPT,
    RECEIVED,
    Chain,
    chain_order,
    feed_command,
    first_chain,
    hop_command,
    hop_script,
    parse_received,
    refeed_chain,
    sent_bytes,
)
from provisioner.image.lock import Pin
from provisioner.image.plan import NodePlan
from provisioner.image.relay import (
    KEY_GRACE_S,
    Added,
    RelayKey,
    _remove_keys,
    add_key_command,
    known_host_lines,
    make_relay_key,
    node_ssh,
    parse_added,
)
from provisioner.image.savestream import SavedImage, partial, passthrough
from provisioner.inventory import Inventory, Node
from provisioner.remote import Pool, fan_out


class _Run:
    """One forwarding push: the pool, the pin, the nodes by name, what each one sent."""

    def __init__(
        self, pool: Pool, inventory: Inventory, pin: Pin, opts: PushOptions, report: Reporter
    ) -> None:
        self.pool, self.pin, self.opts = pool, pin, opts
        self.nodes = {n.name: n for n in inventory.nodes}
        lock = threading.Lock()

        def safe(line: str) -> None:
            with lock:
                report(line)

        self.report = safe
        self.sent: dict[str, int] = {}  # sender ("control" or a node) -> bytes on the wire
        self.dirs: dict[str, str] = {}  # node -> its private relay directory
        self.key = make_relay_key()

    def each(self, names: list[str], fn: Callable[[Node], object]) -> dict[str, ProvisionerError]:
        group = fan_out(
            [self.nodes[n] for n in names], fn, parallelism=32, deadline=self.opts.timeout
        )
        return dict(group.errors)

    def ssh_to(self, sender: str, target: str) -> tuple[str, ...]:
        d = self.dirs[sender]
        return node_ssh(
            self.nodes[target], f"{d}/key", f"{d}/known_hosts", HOP_SCRIPT, alive_s=ALIVE_S
        )


def push_forwarded(
    pool: Pool,
    inventory: Inventory,
    pin: Pin,
    opts: PushOptions,
    report: Reporter,
    out: PushReport,
) -> None:
    """Every node of the inventory holds the pin, the image sent along a chain of nodes."""
    run = _Run(pool, inventory, pin, opts, report)
    t0 = time.monotonic()
    plans: dict[str, NodePlan] = {}
    lock = threading.Lock()

    def gather(node: Node) -> None:
        plan = gather_plan(pool.session(node), pin, opts)
        with lock:
            plans[node.name] = plan
        if plan.action != "send":
            verify_and_tag(pool.session(node), pin, opts.tag)
            done = NodePush(node.name, plan.action, len(pin.layers))
            done.seconds = time.monotonic() - t0
            out.nodes[node.name] = done

    out.errors.update(run.each([n.name for n in inventory.nodes], gather))
    order = chain_order(plans, [n.name for n in inventory.nodes])
    if len(order) < max(1, opts.chain_from):  # no chain worth making: send from here
        for name in order:
            try:
                out.nodes[name] = push_node(pool, run.nodes[name], pin, opts, run.report)
            except ProvisionerError as exc:
                out.errors[name] = exc
        return
    out.mode = "forward"
    run.report(f"forwarding relay: control -> {' -> '.join(order)}")
    added: dict[str, Added | None] = {}
    try:
        ready = _set_up(run, order, added, out)
        order = [n for n in order if n in ready]
        if order:
            _rounds(run, order, plans, out, t0)
    finally:
        _tear_down(run, added, out)
    for name, bytes_ in run.sent.items():
        if name in out.nodes:
            out.nodes[name].bytes_forwarded = bytes_


def _set_up(
    run: _Run, order: list[str], added: dict[str, Added | None], out: PushReport
) -> set[str]:
    """A private directory, the key, known_hosts and the authorized key on every node of
    the chain; the nodes where that worked."""
    senders = ",".join(run.nodes[n].address for n in order)
    lifetime = int(run.opts.timeout * (run.opts.retries + 1)) + KEY_GRACE_S
    known = "\n".join(line for n in order for line in known_host_lines(run.nodes[n])) + "\n"
    lock = threading.Lock()

    def one(node: Node) -> None:
        s = run.pool.session(node)
        made = s.run("umask 077 && mktemp -d", timeout=30).check().stdout.strip()
        with lock:
            run.dirs[node.name] = made
        d = shlex.quote(made)
        s.run(f"umask 077 && cat > {d}/key", timeout=30, stdin=run.key.private_openssh).check()
        s.run(f"umask 077 && cat > {d}/known_hosts", timeout=30, stdin=known.encode()).check()
        command = hop_command(made)
        with lock:
            added[node.name] = None  # from here on, a removal is due
        result = s.run(add_key_command(run.key, senders, lifetime, command), timeout=30)
        with lock:
            added[node.name] = parse_added(result.stdout, run.key, senders, command)
        result.check()

    errors = run.each(order, one)
    out.errors.update(errors)
    return set(order) - set(errors)


def _rounds(
    run: _Run, order: list[str], plans: dict[str, NodePlan], out: PushReport, t0: float
) -> None:
    """Round one from the control machine; then the failed nodes that still answer are
    re-fed, at most `retries` more rounds."""
    saved: SavedImage | None = None
    if len({plans[n].first_missing for n in order}) > 1 or plans[order[0]].first_missing:
        saved = SavedCache(run.pin, run.opts.cache_dir).get(run.report)
    chain = first_chain(order, plans, saved)
    holders: list[str] = []
    for attempt in range(1, run.opts.retries + 2):
        failed = _one_round(run, chain, saved, out, t0, attempt)
        holders += [h.node for h in chain.hops if h.node not in failed]
        if not failed:
            return
        if attempt > run.opts.retries:
            return
        alive = _answering(run, [n for n in order if n in failed])
        if not alive:
            return
        chain = refeed_chain(alive, holders, run.sent)
        feeder = chain.feeder or "control"
        run.report(f"re-feeding {', '.join(alive)} from {feeder}")
        for name in alive:
            out.errors.pop(name, None)


def _answering(run: _Run, names: list[str]) -> list[str]:
    """The nodes that answer on a fresh connection (a stopped node is not re-fed)."""

    def probe(node: Node) -> None:
        run.pool.forget(node)
        run.pool.session(node).run("true", timeout=30).check()

    down = run.each(names, probe)
    return [n for n in names if n not in down]


def _one_round(
    run: _Run,
    chain: Chain,
    saved: SavedImage | None,
    out: PushReport,
    t0: float,
    attempt: int,
) -> dict[str, ProvisionerError]:
    """Write the hop scripts, stream into the chain, verify every node; the failed ones
    (node -> what failed there)."""
    names = [h.node for h in chain.hops]

    def write(node: Node) -> None:
        hop = next(h for h in chain.hops if h.node == node.name)
        nxt = run.ssh_to(node.name, hop.next) if hop.next else None
        script = hop_script(run.dirs[node.name], nxt, hop.drop)
        d = shlex.quote(run.dirs[node.name])
        run.pool.session(node).run(
            f"cat > {d}/{HOP_SCRIPT}", timeout=30, stdin=script.encode()
        ).check()

    errors = run.each(names, write)
    if errors:  # a node we cannot even prepare: every node of the round is fed again later
        out.errors.update(errors)
        return {n: errors.get(n, out.errors[next(iter(errors))]) for n in names}
    first = run.nodes[names[0]]
    try:
        if chain.feeder is None:
            _feed_from_control(run, chain, first, saved)
        else:
            feeder = run.pool.session(run.nodes[chain.feeder])
            result = feeder.run(
                feed_command(run.pin.image_id, run.ssh_to(chain.feeder, first.name)),
                timeout=run.opts.timeout,
            )
            if not result.ok:
                run.report(f"{chain.feeder}: feeding the chain ended early: {result.tail(2)}")
    except ProvisionerError as exc:  # the stream broke: the nodes' own state decides below
        run.report(f"the stream into {first.name} broke: {exc}")
    received: dict[str, int] = {}
    lock = threading.Lock()

    def check(node: Node) -> None:
        s = run.pool.session(node)
        got = s.run(f"cat {shlex.quote(run.dirs[node.name])}/{RECEIVED}", timeout=30)
        with lock:
            received[node.name] = parse_received(got.stdout)
        verify_and_tag(s, run.pin, run.opts.tag)

    failures = run.each(names, check)
    for sender, n in sent_bytes(chain, received).items():
        run.sent[sender] = run.sent.get(sender, 0) + n
    for name in names:
        if name in failures:
            run.pool.forget(run.nodes[name])
            out.errors[name] = _failed(name, chain.sender_of(name), failures[name])
            continue
        hop = next(h for h in chain.hops if h.node == name)
        push = NodePush(name, "send", len(run.pin.layers), attempts=attempt)
        push.layers_sent = len(run.pin.layers) - hop.first_missing
        push.bytes_sent = received.get(name, 0)
        push.via = chain.sender_of(name)
        push.seconds = time.monotonic() - t0
        out.nodes[name] = push
        run.report(f"{name}: loaded and verified; {push.bytes_sent / 1e6:,.0f} MB from {push.via}")
    return failures


def _feed_from_control(run: _Run, chain: Chain, first: Node, saved: SavedImage | None) -> None:
    session = run.pool.session(first)
    command = f"sh {shlex.quote(run.dirs[first.name])}/{HOP_SCRIPT}"
    total = [0]

    def count(n: int) -> None:
        total[0] = n

    if saved is None:
        with save_stream(run.pin.image_id) as source:
            guarded = _Guarded(passthrough(source))
            session.run_streaming_stdin(
                command, iter(guarded), on_bytes=count, timeout=run.opts.timeout
            )
    else:
        guarded = _Guarded(partial(saved, chain.first_missing))
        session.run_streaming_stdin(
            command, iter(guarded), on_bytes=count, timeout=run.opts.timeout
        )
    run.report(f"control: {total[0] / 1e6:,.0f} MB into the chain at {first.name}")


def _failed(name: str, sender: str, exc: ProvisionerError) -> RemoteError:
    if isinstance(exc, ConnectError):
        return exc
    kind = getattr(exc, "kind", "")
    return RemoteError(
        name,
        f"the image from {sender} did not load: {exc}",
        "check the node (its sshd and dockerd) and push again; a node that holds the "
        "image already is skipped",
        kind="connection-lost" if kind == "connection-lost" else "relay",
    )


def _tear_down(run: _Run, added: dict[str, Added | None], out: PushReport) -> None:
    """The relay key out of every authorized_keys it went into, every directory removed."""
    due = [run.nodes[n] for n in added]
    for name, exc in _remove_keys(run.pool, due, run.key, added).items():
        first = out.errors.get(name)
        out.errors[name] = (
            exc
            if first is None
            else RemoteError(
                name, f"{first.message}; and {exc.message}", exc.fix, kind="relay-cleanup"
            )
        )

    def rm(node: Node) -> None:
        d = run.dirs.get(node.name)
        if d:
            run.pool.session(node).run(f"rm -rf {shlex.quote(d)}", timeout=30).check()

    for name, exc in run.each(list(run.dirs), rm).items():
        out.errors.setdefault(name, exc)


__all__ = ["RelayKey", "push_forwarded"]
