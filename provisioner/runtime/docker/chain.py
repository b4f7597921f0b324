"""The chain: the control machine sends the image once, and every node streams what
it receives on to the next node while it loads it (`image push --forward`, `up --push`).

The plan is chain_plan.py's. Here: one round trip per node gathers what it holds
(nodes that hold the pin are only verified and tagged); every node of the chain gets a
private directory. Each round, every node of it gets its hop script, and every edge of
the round (sender -> receiver) a key of its own, made for that edge and round: the
private half only on the sender (with the receiver's host keys as this machine trusts
them; no trust on first use), the public half only in the receiver's authorized_keys,
accepted only from the sender's address, only to run the receiver's hop script (which
runs once per round) and only for a few minutes (star.py's add/remove: the file ends
byte for byte as it began). So a node holds no key that any node but its own receiver
accepts. The control machine streams into the first node's hop; each hop forwards with
OpenSSH to the next. Every node counts the bytes it receives, so the bytes each sender
put on the wire are read, not estimated. The round's keys are removed as soon as its
stream ends, whatever happened (a failure, Ctrl-C); the control machine then verifies
and tags every node; nodes that fail are re-fed (chain_plan.refeed_chain), at most
`retries` more rounds. Directories, and any key whose removal failed, are removed
again at the end; a removal that fails is an error of the push.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from provisioner.console import Reporter
from provisioner.errors import ConnectError, ProvisionerError, RemoteError
from provisioner.image.compress import compressed_stream
from provisioner.image.pin import Pin
from provisioner.image.savestream import SavedImage, partial, passthrough
from provisioner.inventory import Inventory, Node
from provisioner.node.delivery import DeliveryReport, NodeDelivery
from provisioner.remote import Pool, fan_out
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.chain_plan import (
    ALIVE_S,
    HOP_SCRIPT,
    SEND_KEY,
    SEND_KNOWN_HOSTS,
    Chain,
    chain_order,
    drop_sender_files_command,
    edge_key_lifetime_s,
    feed_command,
    first_chain,
    hop_command,
    hop_script,
    parse_round_result,
    private_file_command,
    refeed_chain,
    remove_relay_dir_command,
    round_result_command,
    sent_bytes,
    write_hop_command,
)
from provisioner.runtime.docker.direct import (
    Guarded,
    SavedCache,
    Sent,
    check_codec_all,
    gather_plan,
    plan_codec,
    push_node,
    save_stream,
    verify_and_tag,
)
from provisioner.runtime.docker.push_plan import NodePlan
from provisioner.runtime.docker.star import (
    Added,
    RelayKey,
    add_key_command,
    known_host_lines,
    make_relay_key,
    node_ssh,
    parse_added,
    remove_failed,
    remove_key_command,
)


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
        self.known: dict[str, str] = {}  # node -> its host keys, as known_hosts lines
        self.keys: list[_EdgeKey] = []  # edge keys that may still be in authorized_keys
        self.plans: dict[str, NodePlan] = {}
        self.control = Sent()  # what the control machine's stream into the chain was
        self.cache = SavedCache(pin, opts.cache_dir)  # what that stream is made of
        self.lock = threading.Lock()

    def each(self, names: list[str], fn: Callable[[Node], object]) -> dict[str, ProvisionerError]:
        group = fan_out(
            [self.nodes[n] for n in names], fn, parallelism=32, deadline=self.opts.timeout
        )
        return dict(group.errors)

    def ssh_to(self, sender: str, target: str) -> tuple[str, ...]:
        d = self.dirs[sender]
        return node_ssh(
            self.nodes[target],
            f"{d}/{SEND_KEY}",
            f"{d}/{SEND_KNOWN_HOSTS}",
            HOP_SCRIPT,
            alive_s=ALIVE_S,
        )


@dataclass
class _EdgeKey:
    """One edge's key for one round: the sender holds its private half, the receiver's
    authorized_keys its public half (`added`: what the add reported it appended)."""

    sender: str
    receiver: str
    key: RelayKey
    added: Added | None = None


def push_chain(
    pool: Pool,
    inventory: Inventory,
    pin: Pin,
    opts: PushOptions,
    report: Reporter,
    out: DeliveryReport,
) -> None:
    """Every node of the inventory holds the pin, the image sent along a chain of nodes."""
    run = _Run(pool, inventory, pin, opts, report)
    t0 = time.monotonic()
    plans: dict[str, NodePlan] = {}
    lock = threading.Lock()

    def gather(node: Node) -> None:
        plan = gather_plan(pool.session(node), pin, opts, report=report)
        if plan.store == "containerd" and plan.action == "send":
            # that store refuses a `docker save` stream with a layer file left out: in a
            # chain it takes the whole image (sent alone, it gets only what it lacks)
            plan = replace(plan, first_missing=0, layers_to_send=pin.layers)
        with lock:
            plans[node.name] = plan
        if plan.action != "send":
            verify_and_tag(pool.session(node), pin, opts.tag, plan.image_id)
            done = NodeDelivery(
                node.name,
                plan.action,
                len(pin.layers),
                store=plan.store,
                image_id=plan.image_id or pin.image_id,
            )
            done.seconds = time.monotonic() - t0
            out.nodes[node.name] = done

    out.errors.update(run.each([n.name for n in inventory.nodes], gather))
    run.plans = plans
    order = chain_order(plans, [n.name for n in inventory.nodes])
    if len(order) < max(1, opts.chain_from):  # no chain worth making: send from here
        for name in order:
            try:
                out.nodes[name] = push_node(pool, run.nodes[name], pin, opts, run.report)
            except ProvisionerError as exc:
                out.errors[name] = exc
        return
    out.mode = "chain"
    run.report(f"chain: control -> {' -> '.join(order)}")
    try:
        ready = _set_up(run, order, out)
        order = [n for n in order if n in ready]
        if order:
            _rounds(run, order, plans, out, t0)
    finally:
        _tear_down(run, out)
    for name, bytes_ in run.sent.items():
        if name in out.nodes:
            out.nodes[name].bytes_forwarded = bytes_


def _set_up(run: _Run, order: list[str], out: DeliveryReport) -> set[str]:
    """A private directory on every node of the chain, and the host keys this machine
    trusts for each (a sender gets its receiver's, round by round); the nodes where
    that worked."""
    for name in order:
        run.known[name] = "\n".join(known_host_lines(run.nodes[name])) + "\n"

    def one(node: Node) -> None:
        made = run.pool.session(node).run("umask 077 && mktemp -d", timeout=30)
        d = made.check().stdout.strip()
        with run.lock:
            run.dirs[node.name] = d

    errors = run.each(order, one)
    out.errors.update(errors)
    return set(order) - set(errors)


def _rounds(
    run: _Run, order: list[str], plans: dict[str, NodePlan], out: DeliveryReport, t0: float
) -> None:
    """Round one from the control machine; then the failed nodes that still answer are
    re-fed, at most `retries` more rounds."""
    saved: SavedImage | None = None
    if len({plans[n].first_missing for n in order}) > 1 or plans[order[0]].first_missing:
        saved = run.cache.get(run.report)
    chain = first_chain(order, plans, saved)
    holders: list[str] = []
    for attempt in range(1, run.opts.retries + 2):
        failed = _one_round(run, chain, saved, out, t0, attempt)
        holders += [h.node for h in chain.hops if h.node not in failed]
        if not failed:
            return
        if chain.feeder is None and chain.hops[0].node in failed:
            _drop_rejected(run, chain.hops[0].node)
        if attempt > run.opts.retries:
            return
        alive = _answering(run, [n for n in order if n in failed])
        if not alive:
            return
        chain = refeed_chain(alive, holders, run.sent)
        if chain.feeder is None and saved is not None:
            saved = run.cache.get(run.report)  # saved anew if a rejected load dropped it
        feeder = chain.feeder or "control"
        run.report(f"re-feeding {', '.join(alive)} from {feeder}")
        for name in alive:
            out.errors.pop(name, None)


def _drop_rejected(run: _Run, first: str) -> None:
    """The chain's first node did not load the control machine's stream: the cache
    entries it was made of that are not what their names say are dropped (as a direct
    push does, `SavedCache.reject`), so the next round makes them anew."""
    dropped = run.cache.reject(run.control.record, run.control.codec)
    if dropped:
        run.report(f"{first}: dropped from the cache: {', '.join(dropped)}")


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
    out: DeliveryReport,
    t0: float,
    attempt: int,
) -> dict[str, ProvisionerError]:
    """Write the hop scripts, stream into the chain, verify every node; the failed ones
    (node -> what failed there)."""
    names = [h.node for h in chain.hops]
    edges = [_EdgeKey(a, b, make_relay_key()) for a, b in chain.edges()]
    errors: dict[str, ProvisionerError] = {}
    try:
        errors = _prepare_round(run, chain, edges)
        if not errors:
            _feed(run, chain, saved)
    finally:  # the round's keys go as soon as its stream ended, whatever happened;
        _remove_edge_keys(run, edges)  # one that stays is tried again (and told) at the end
    if errors:  # a node we cannot even prepare: every node of the round is fed again later
        out.errors.update(errors)
        return {n: errors.get(n, next(iter(errors.values()))) for n in names}
    received: dict[str, int] = {}
    lock = threading.Lock()

    def check(node: Node) -> None:
        s = run.pool.session(node)
        got = s.run(round_result_command(run.dirs[node.name]), timeout=30)
        count, foreign = parse_round_result(got.stdout)
        with lock:
            received[node.name] = count
        if foreign:  # the sender's own tags: the hop removed them; this round failed here
            shown = ", ".join(repr(t[:80]) for t in foreign[:5])
            raise RemoteError(
                node.name,
                f"the stream from {chain.sender_of(node.name)} carried image tags of its "
                f"own ({shown}{', ...' if len(foreign) > 5 else ''}): the node removed them "
                "(and tagged its own image of that name again, if it had one)",
                f"check {chain.sender_of(node.name)}: a pin's stream names no tag",
                kind="relay",
            )
        verify_and_tag(s, run.pin, run.opts.tag, run.plans[node.name].image_id)

    failures = run.each(names, check)
    for sender, n in sent_bytes(chain, received).items():
        run.sent[sender] = run.sent.get(sender, 0) + n
    for name in names:
        if name in failures:
            run.pool.forget(run.nodes[name])
            out.errors[name] = _failed(name, chain.sender_of(name), failures[name])
            continue
        hop = next(h for h in chain.hops if h.node == name)
        plan = run.plans[name]
        push = NodeDelivery(
            name,
            "send",
            len(run.pin.layers),
            attempts=attempt,
            store=plan.store,
            image_id=plan.image_id or run.pin.image_id,
        )
        push.layers_sent = len(run.pin.layers) - hop.first_missing
        push.bytes_sent = received.get(name, 0)
        push.via = chain.sender_of(name)
        if chain.feeder is None:  # the stream from this machine: as it went from here
            push.codec = run.control.codec.family if run.control.codec else ""
            push.compress_reason = run.control.reason
            if hop is chain.hops[0]:
                push.cache_hits = len(run.control.record.hits)
                push.cache_misses = len(run.control.record.misses)
        push.seconds = time.monotonic() - t0
        out.nodes[name] = push
        run.report(f"{name}: loaded and verified; {push.bytes_sent / 1e6:,.0f} MB from {push.via}")
    return failures


def _prepare_round(run: _Run, chain: Chain, edges: list[_EdgeKey]) -> dict[str, ProvisionerError]:
    """Every node of the round: its hop script; as a sender, its edge's private key and
    its receiver's host keys; as a receiver, its sender's public key in authorized_keys
    (from the sender's address, the hop script as the one command, a short lifetime)."""
    sends = {e.sender: e for e in edges}
    receives = {e.receiver: e for e in edges}
    hops = {h.node: h for h in chain.hops}
    lifetime = edge_key_lifetime_s(
        len(chain.hops), max(run.nodes[h.node].ssh.connect_timeout for h in chain.hops)
    )

    def one(node: Node) -> None:
        s, d = run.pool.session(node), run.dirs[node.name]
        hop = hops.get(node.name)
        if hop is not None:
            nxt = run.ssh_to(node.name, hop.next) if hop.next else None
            script = hop_script(d, nxt, hop.drop)
            s.run(write_hop_command(d), timeout=30, stdin=script.encode()).check()
        edge = sends.get(node.name)
        if edge is not None:
            known = run.known[edge.receiver].encode()
            key = edge.key.private_openssh
            s.run(private_file_command(d, SEND_KEY), timeout=30, stdin=key).check()
            s.run(private_file_command(d, SEND_KNOWN_HOSTS), timeout=30, stdin=known).check()
        edge = receives.get(node.name)
        if edge is not None:
            sender = run.nodes[edge.sender].address
            command = hop_command(d)
            with run.lock:
                run.keys.append(edge)  # from here on, a removal is due
            result = s.run(add_key_command(edge.key, sender, lifetime, command), timeout=30)
            edge.added = parse_added(result.stdout, edge.key, sender, command)
            result.check()

    touched = [*([chain.feeder] if chain.feeder else []), *hops]
    return run.each(touched, one)


def _feed(run: _Run, chain: Chain, saved: SavedImage | None) -> None:
    """Stream into the chain's first node, from here or from the feeder node."""
    first = run.nodes[chain.hops[0].node]
    try:
        if chain.feeder is None:
            _feed_from_control(run, chain, first, saved)
        else:
            feeder = run.pool.session(run.nodes[chain.feeder])
            result = feeder.run(
                feed_command(
                    run.plans[chain.feeder].image_id or run.pin.image_id,
                    run.ssh_to(chain.feeder, first.name),
                ),
                timeout=run.opts.timeout,
            )
            if not result.ok:
                run.report(f"{chain.feeder}: feeding the chain ended early: {result.tail(2)}")
    except ProvisionerError as exc:  # the stream broke: the nodes' own state decides below
        run.report(f"the stream into {first.name} broke: {exc}")


def _remove_edge_keys(run: _Run, edges: list[_EdgeKey]) -> dict[str, ProvisionerError]:
    """The edges' private halves off their senders and public halves out of their
    receivers' authorized_keys; a key whose removal failed stays due (the tear-down
    tries again). Node -> what failed there."""
    senders = {e.sender for e in edges}

    def one(node: Node) -> None:
        s = run.pool.session(node)
        first: ProvisionerError | None = None
        if node.name in senders:
            try:
                s.run(drop_sender_files_command(run.dirs[node.name]), timeout=30).check()
            except ProvisionerError as exc:
                first = exc
        with run.lock:
            due = [e for e in run.keys if e.receiver == node.name and e in edges]
        for edge in due:
            try:
                s.run(remove_key_command(edge.key, edge.added), timeout=30).check()
            except ProvisionerError as exc:
                first = first or remove_failed(node.name, edge.key, exc)
                continue
            with run.lock:
                run.keys.remove(edge)
        if first is not None:
            raise first

    return run.each(sorted(senders | {e.receiver for e in edges}), one)


def _feed_from_control(run: _Run, chain: Chain, first: Node, saved: SavedImage | None) -> None:
    """The control machine's stream into the chain's first hop: compressed when
    plan_codec says so for the first hop and every hop's docker load reads the codec
    (the hops' `tar --delete` works on the stream either way: the layer files inside
    it are compressed, the tar around them is not)."""
    session = run.pool.session(first)
    command = f"sh {shlex.quote(run.dirs[first.name])}/{HOP_SCRIPT}"
    cache = run.cache
    plan = run.plans[first.name]
    sent = run.control = Sent()
    sent.codec, sent.reason = plan_codec(
        session, run.pin, plan, run.opts, run.report, cache, whole=False
    )
    if sent.codec is not None and not check_codec_all(
        sent.codec, [run.plans[h.node] for h in chain.hops]
    ):
        sent.codec, sent.reason = None, "a node of the chain does not read the codec: plain"
    how = f"compressed: {sent.codec.name}" if sent.codec else "plain"
    run.report(f"control -> {first.name}: {how} ({sent.reason})")
    total = [0]

    def count(n: int) -> None:
        total[0] = n

    if sent.codec is not None:
        guarded = Guarded(
            compressed_stream(
                cache.get(run.report),
                run.pin.layers,
                chain.first_missing,
                sent.codec,
                cache.layers,
                sent.record,
            )
        )
        session.run_streaming_stdin(
            command, iter(guarded), on_bytes=count, timeout=run.opts.timeout
        )
    elif saved is None:
        with save_stream(run.pin.image_id) as source:
            guarded = Guarded(passthrough(source))
            session.run_streaming_stdin(
                command, iter(guarded), on_bytes=count, timeout=run.opts.timeout
            )
    else:
        guarded = Guarded(partial(saved, chain.first_missing))
        session.run_streaming_stdin(
            command, iter(guarded), on_bytes=count, timeout=run.opts.timeout
        )
    sent.bytes_sent = total[0]
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


def _tear_down(run: _Run, out: DeliveryReport) -> None:
    """Any edge key still due out of authorized_keys, every relay directory removed."""
    left = list(run.keys)
    for name, exc in _remove_edge_keys(run, left).items():
        first = out.errors.get(name)
        out.errors[name] = (
            exc
            if first is None
            else RemoteError(
                name,
                f"{first.message}; and {exc.message}",
                getattr(exc, "fix", ""),
                kind="relay-cleanup",
            )
        )

    def rm(node: Node) -> None:
        d = run.dirs.get(node.name)
        if d:
            run.pool.session(node).run(remove_relay_dir_command(d), timeout=30).check()

    for name, exc in run.each(list(run.dirs), rm).items():
        out.errors.setdefault(name, exc)


__all__ = ["RelayKey", "push_chain"]
