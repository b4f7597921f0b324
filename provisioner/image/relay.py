"""Relay mode: send the image once to the head, which sends it on to the workers.

The control machine pushes to the head as usual, then the head runs
`docker save PIN | ssh WORKER docker load` for each worker that lacks the image, with
its own OpenSSH client. The head authenticates with a temporary key made for this push
only: its public half goes into each worker's authorized_keys restricted to the head's
address (`from=...,restrict`), its private half into a 0600 file on the head, and both
are removed at the end, whatever happens. The head checks the workers' host keys
against the keys this machine already trusts for them (no trust on first use). The
control machine still gathers each worker's facts and verifies and tags the image there.
"""

from __future__ import annotations

import secrets
import shlex
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from provisioner.console import Reporter
from provisioner.errors import ProvisionerError, RemoteError
from provisioner.image.direct import (
    NodePush,
    PushOptions,
    PushReport,
    gather_plan,
    push_node,
    retrying,
    verify_and_tag,
)
from provisioner.image.lock import Pin
from provisioner.inventory import Inventory, Node
from provisioner.remote import Pool, Session, fan_out


@dataclass(frozen=True)
class RelayKey:
    private_openssh: bytes
    public_line: str  # "ssh-ed25519 AAAA... comment"
    comment: str


def make_relay_key() -> RelayKey:
    key = Ed25519PrivateKey.generate()
    comment = f"provisioner-relay-{secrets.token_hex(6)}"
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return RelayKey(private, f"{public.decode()} {comment}", comment)


def authorized_line(key: RelayKey, head_address: str) -> str:
    """The worker's authorized_keys line: only from the head, no forwarding, no pty."""
    return f'from="{head_address}",restrict {key.public_line}'


def add_key_command(line: str) -> str:
    q = shlex.quote(line)
    return (
        "umask 077 && mkdir -p ~/.ssh && touch ~/.ssh/authorized_keys && "
        f"printf '%s\\n' {q} >> ~/.ssh/authorized_keys"
    )


def remove_key_command(comment: str) -> str:
    pattern = shlex.quote(f" {comment}$")
    return (
        'f=~/.ssh/authorized_keys; [ -f "$f" ] || exit 0; '
        f'grep -v -- {pattern} "$f" > "$f.tmp"; cat "$f.tmp" > "$f"; rm -f "$f.tmp"'
    )


def known_host_lines(node: Node) -> list[str]:
    """The node's host keys as this machine trusts them, as known_hosts lines for the head."""
    name = node.address if node.ssh.port == 22 else f"[{node.address}]:{node.ssh.port}"
    lines: list[str] = []
    files = [*node.ssh.known_hosts, Path.home() / ".ssh" / "known_hosts"]
    for path in files:
        if not path.is_file():
            continue
        keys = paramiko.HostKeys(str(path)).lookup(name)
        if keys is not None:
            lines += [f"{name} {kind} {keys[kind].get_base64()}" for kind in keys]
        if lines:
            break
    if not lines:
        raise RemoteError(
            node.name,
            "no trusted host key for this worker, so the head could not check it",
            "connect once with `provisioner doctor` (host_key_policy: accept-new) or add the "
            "key to the inventory's known_hosts",
            kind="relay",
        )
    return lines


def relay_command(pin: Pin, worker: Node, key_path: str, known_hosts: str) -> str:
    """Run on the head: stream the image into the worker's docker load."""
    target = f"{worker.ssh.user}@{worker.address}"
    ssh = " ".join(
        shlex.quote(a)
        for a in (
            "ssh",
            "-i",
            key_path,
            "-p",
            str(worker.ssh.port),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts}",
            "-o",
            f"ConnectTimeout={max(1, round(worker.ssh.connect_timeout))}",
            "-o",
            "Compression=no",
            target,
            "docker load",
        )
    )
    script = f"set -o pipefail; docker save {shlex.quote(pin.image_id)} | {ssh}"
    return f"bash -c {shlex.quote(script)}"


@contextmanager
def _head_credentials(
    pool: Pool, head: Node, workers: list[Node], key: RelayKey
) -> Iterator[tuple[str, str]]:
    """The temporary key and known_hosts on the head; removed on exit (and from workers)."""
    hs = pool.session(head)
    made = hs.run("mktemp -d", timeout=30).check().stdout.strip()
    tmp = shlex.quote(made)
    known = "\n".join(line for w in workers for line in known_host_lines(w)) + "\n"
    try:
        hs.run(f"umask 077 && cat > {tmp}/key", timeout=30, stdin=key.private_openssh).check()
        hs.run(f"umask 077 && cat > {tmp}/known_hosts", timeout=30, stdin=known.encode()).check()
        group = fan_out(
            workers,
            lambda w: (
                pool.session(w)
                .run(add_key_command(authorized_line(key, head.address)), timeout=30)
                .check()
            ),
            deadline=60,
        )
        if group.errors:
            raise next(iter(group.errors.values()))
        yield f"{made}/key", f"{made}/known_hosts"
    finally:
        with suppress(ProvisionerError):
            hs.run(f"rm -rf {tmp}", timeout=30)
        fan_out(
            workers,
            lambda w: pool.session(w).run(remove_key_command(key.comment), timeout=30),
            deadline=60,
        )


def _relay_worker(
    pool: Pool,
    head: Session,
    worker: Node,
    pin: Pin,
    opts: PushOptions,
    creds: tuple[str, str],
    report: Reporter,
) -> NodePush:
    t0 = time.monotonic()

    def attempt(n: int) -> NodePush:
        ws = pool.session(worker)
        plan = gather_plan(ws, pin, opts)
        out = NodePush(worker.name, plan.action, len(pin.layers), attempts=n, via=head.host)
        if plan.action == "send":
            report(f"{worker.name}: the head sends the image ({head.host} -> {worker.name})")
            result = head.run(relay_command(pin, worker, *creds), timeout=opts.timeout)
            if not (result.ok and pin.image_id in result.stdout):
                raise RemoteError(
                    worker.name,
                    f"the head could not send the image: {result.tail(3)}",
                    "check that the head reaches the worker's sshd, or push without --relay",
                    kind="relay",
                )
            out.layers_sent = len(pin.layers)
        if plan.action != "none":
            verify_and_tag(ws, pin, opts.tag)
        out.seconds = time.monotonic() - t0
        report(f"{worker.name}: {plan.action} done via {head.host} in {out.seconds:.0f}s")
        return out

    def again(exc: RemoteError) -> None:
        report(f"{worker.name}: relay failed ({exc.message}); retrying")

    return retrying(attempt, opts.retries, lambda exc: exc.kind == "relay", again)


def push_relayed(
    pool: Pool,
    inventory: Inventory,
    pin: Pin,
    opts: PushOptions,
    report: Reporter,
    out: PushReport,
) -> None:
    """The head from here, then every worker from the head (in parallel, bounded)."""
    head = inventory.head
    try:
        out.nodes[head.name] = push_node(pool, head, pin, opts, report)
    except ProvisionerError as exc:
        out.errors[head.name] = exc
        for w in inventory.workers:
            out.errors[w.name] = RemoteError(
                w.name,
                "not pushed: the relay head failed",
                "fix the head, push again",
                kind="relay",
            )
        return
    workers = list(inventory.workers)
    lock = threading.Lock()

    def safe(line: str) -> None:
        with lock:
            report(line)

    try:
        with _head_credentials(pool, head, workers, make_relay_key()) as creds:
            hs = pool.session(head)
            group = fan_out(
                workers,
                lambda w: _relay_worker(pool, hs, w, pin, opts, creds, safe),
                parallelism=opts.parallelism,
                deadline=opts.timeout * (opts.retries + 1),
            )
    except ProvisionerError as exc:
        for w in workers:
            out.errors[w.name] = exc
        return
    out.nodes.update(group.results)
    out.errors.update(group.errors)
