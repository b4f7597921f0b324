"""The star: send the image once to the head, which sends it on to the workers.

The control machine pushes to the head as usual, then the head runs
`docker save PIN | ssh WORKER docker load` for each worker that lacks the image, with
its own OpenSSH client. The head authenticates with a temporary key made for this push
only: its public half goes into each worker's authorized_keys restricted to the head's
address, to `docker load`, and to a lifetime (`from=...,restrict,command=...,expiry-time=`),
its private half into a 0600 file on the head, and both are removed at the end,
whatever happens; a removal that fails is an error of the push. Adding and removing
the key rewrite authorized_keys atomically (a temporary file, then `mv`), so the file
ends byte for byte as it began, a missing final newline included. The head checks the
workers' host keys against the keys this machine already trusts for them (no trust on
first use). The control machine still gathers each worker's facts and verifies and tags
the image there.
"""

from __future__ import annotations

import secrets
import shlex
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from provisioner.console import Reporter
from provisioner.errors import InputError, ProvisionerError, RemoteError
from provisioner.image.pin import Pin
from provisioner.inventory import Inventory, Node
from provisioner.inventory.address import address_problem
from provisioner.node.delivery import DeliveryReport, NodeDelivery
from provisioner.remote import Pool, Session, fan_out
from provisioner.remote.hostkeys import read_known_hosts
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.chain_plan import guarded_load_lines
from provisioner.runtime.docker.direct import (
    gather_plan,
    push_node,
    retrying,
    verify_and_tag,
)

KEY_GRACE_S = 600  # the relay key's lifetime beyond the push's own timeouts


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


def _relay_load_command() -> str:
    """The one command the relay key may run on a worker: `docker load` of the head's
    stream, in a private folder, keeping no tag the stream names (the chain's guard,
    `guarded_load_lines`); it prints `docker load`'s output and exits with its status
    (FOREIGN_RC when the stream named a tag)."""
    script = "; ".join(
        [
            "d=$(mktemp -d) || exit 1",
            "trap 'rm -rf \"$d\"' EXIT",
            'cd "$d" || exit 1',
            *guarded_load_lines(),
            "cat load.out",
            'exit "$(cat load.rc)"',
        ]
    )
    return f"sh -c {shlex.quote(script)}"


RELAY_COMMAND = _relay_load_command()
ADDED = "relay-key-added"
REMOVED = "relay-key-removed"
ABSENT = "relay-key-absent"


def authorized_line(
    key: RelayKey, head_address: str, expiry: str, command: str = RELAY_COMMAND
) -> str:
    """The worker's authorized_keys line: only from the head, only `docker load`, no
    forwarding and no pty (`restrict`), and refused by sshd after `expiry`
    (YYYYMMDDHHMMSSZ, UTC), should the removal never run (SIGKILL, a lost connection).
    The chain passes its senders' addresses (comma-separated) and its hop
    script as the one command."""
    return f"{_line_prefix(head_address, command)}{expiry}{_line_suffix(key)}"


def _line_prefix(head_address: str, command: str = RELAY_COMMAND) -> str:
    # sshd reads `from="..."` as a pattern list: only checked addresses go in (address.py:
    # no quote, comma, pattern character or scope id of any character but an interface's)
    for each in head_address.split(","):
        why = address_problem(each)
        if why:
            raise InputError(
                f"refused to authorize a relay key from {head_address!r}: {why}",
                "give the node an IP address or a DNS name in the inventory",
            )
    # inside command="...", sshd reads \" as a quote (and any other backslash as itself)
    if "\\" in command:
        raise ValueError(f"a forced command with a backslash: {command!r}")
    quoted = command.replace('"', '\\"')
    return f'from="{head_address}",restrict,command="{quoted}",expiry-time="'


def _line_suffix(key: RelayKey) -> str:
    return f'" {key.public_line}'


def add_key_command(
    key: RelayKey, head_address: str, lifetime_s: int, command: str = RELAY_COMMAND
) -> str:
    """Add the relay key to the worker's authorized_keys, atomically (a temporary file,
    then `mv`): a newline goes first when the file lacks a final one. The expiry is
    computed with the worker's own clock. Prints `relay-key-added newline=0|1 expiry=T`."""
    script = f"""set -e
umask 077
mkdir -p ~/.ssh
f=$(readlink -f ~/.ssh/authorized_keys)
touch "$f"
exp=$(date -u -d "@$(( $(date -u +%s) + {int(lifetime_s)} ))" +%Y%m%d%H%M%SZ)
nl=0
if [ -s "$f" ] && [ -n "$(tail -c 1 "$f")" ]; then nl=1; fi
t="$f.provisioner-tmp.$$"
trap 'rm -f "$t"' EXIT
p={shlex.quote(_line_prefix(head_address, command))}
s={shlex.quote(_line_suffix(key))}
{{ cat "$f"; [ "$nl" = 0 ] || printf '\n'; printf '%s%s%s\n' "$p" "$exp" "$s"; }} > "$t"
chmod "$(stat -c %a "$f")" "$t"
mv -f "$t" "$f"
echo "{ADDED} newline=$nl expiry=$exp"
"""
    return f"sh -c {shlex.quote(script)}"


@dataclass(frozen=True)
class Added:
    """What add_key_command did on one worker: the exact bytes it appended."""

    line: str
    newline: bool

    @property
    def appended(self) -> bytes:
        return (b"\n" if self.newline else b"") + self.line.encode() + b"\n"


def parse_added(
    stdout: str, key: RelayKey, head_address: str, command: str = RELAY_COMMAND
) -> Added | None:
    """The bytes add_key_command reports it appended (None if it did not say)."""
    for line in stdout.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == ADDED:
            newline = words[1] == "newline=1"
            expiry = words[2].removeprefix("expiry=")
            return Added(authorized_line(key, head_address, expiry, command), newline)
    return None


def remove_key_command(key: RelayKey, added: Added | None) -> str:
    """Take the relay key out again, atomically (a temporary file, checked, then `mv`).

    When the file still ends with exactly the bytes that were appended, they are cut
    off, so the file ends byte for byte as it began (a final newline that was added is
    removed too). Otherwise (the file changed meanwhile, or the add did not report) only
    the lines holding the key are dropped. Exits non-zero, the file untouched, on any
    failure (a full disk); prints `relay-key-removed exact|line` or `relay-key-absent`."""
    blob = shlex.quote(f" {key.public_line.split()[1]} ")
    exact = ""
    if added is not None:
        n = len(added.appended)
        exact = (
            f'if [ "$size" -ge {n} ] && '
            f'[ "$(tail -c {n} "$f" | od -An -v -tx1 | tr -d \' \\n\')" = '
            f"{added.appended.hex()} ]; "
            f'then head -c $((size - {n})) "$f" > "$t"; how=exact; fi\n'
        )
    script = f"""set -e
f=$(readlink -f ~/.ssh/authorized_keys)
[ -f "$f" ] || {{ echo {ABSENT}; exit 0; }}
grep -qF -e {blob} "$f" || {{ echo {ABSENT}; exit 0; }}
t="$f.provisioner-tmp.$$"
trap 'rm -f "$t"' EXIT
size=$(stat -c %s "$f")
how=
{exact}if [ -z "$how" ]; then
  rc=0; grep -vF -e {blob} "$f" > "$t" || rc=$?; [ "$rc" -le 1 ]; how=line
fi
chmod "$(stat -c %a "$f")" "$t"
mv -f "$t" "$f"
echo "{REMOVED} $how"
"""
    return f"sh -c {shlex.quote(script)}"


def known_host_lines(node: Node) -> list[str]:
    """The node's host keys as this machine trusts them, as known_hosts lines for the head."""
    name = node.address if node.ssh.port == 22 else f"[{node.address}]:{node.ssh.port}"
    lines: list[str] = []
    files = [*node.ssh.known_hosts, Path.home() / ".ssh" / "known_hosts"]
    for path in files:
        if not path.is_file():
            continue
        lines += [
            f"{name} {k.get_name()} {k.get_base64()}" for k in read_known_hosts(path).lookup(name)
        ]
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


def relay_command(
    pin: Pin, worker: Node, key_path: str, known_hosts: str, head_id: str = ""
) -> str:
    """Run on the head: stream the image into the worker's docker load. `head_id`: the
    pin's ID in the head's image store, when that is not the pin's own (containerd)."""
    ssh = " ".join(shlex.quote(a) for a in node_ssh(worker, key_path, known_hosts, "docker load"))
    script = f"set -o pipefail; docker save {shlex.quote(head_id or pin.image_id)} | {ssh}"
    return f"bash -c {shlex.quote(script)}"


def node_ssh(
    worker: Node, key_path: str, known_hosts: str, command: str, alive_s: int = 0
) -> tuple[str, ...]:
    """OpenSSH arguments, run on one node, to reach another with the relay key: host key
    checked against `known_hosts`, nothing but the key tried, no prompt; with `alive_s`,
    a peer that stops answering ends the connection after about 3 x alive_s seconds."""
    target = f"{worker.ssh.user}@{worker.address}"
    alive = ("-o", f"ServerAliveInterval={alive_s}", "-o", "ServerAliveCountMax=3")
    return (
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
        *(alive if alive_s else ()),
        target,
        command,
    )


@contextmanager
def _head_credentials(
    pool: Pool,
    head: Node,
    workers: list[Node],
    key: RelayKey,
    lifetime_s: int,
    cleanup_errors: dict[str, ProvisionerError],
) -> Iterator[tuple[str, str]]:
    """The temporary key and known_hosts on the head; removed on exit (and from workers).
    Every removal that fails lands in `cleanup_errors` (worker or head -> error)."""
    hs = pool.session(head)
    made = hs.run("mktemp -d", timeout=30).check().stdout.strip()
    tmp = shlex.quote(made)
    added: dict[str, Added | None] = {}
    lock = threading.Lock()

    def add(worker: Node) -> None:
        with lock:
            added[worker.name] = None  # from here on, a removal is due
        result = pool.session(worker).run(
            add_key_command(key, head.address, lifetime_s), timeout=30
        )
        with lock:
            added[worker.name] = parse_added(result.stdout, key, head.address)
        result.check()

    try:
        known = "\n".join(line for w in workers for line in known_host_lines(w)) + "\n"
        hs.run(f"umask 077 && cat > {tmp}/key", timeout=30, stdin=key.private_openssh).check()
        hs.run(f"umask 077 && cat > {tmp}/known_hosts", timeout=30, stdin=known.encode()).check()
        group = fan_out(workers, add, deadline=60)
        if group.errors:
            raise next(iter(group.errors.values()))
        yield f"{made}/key", f"{made}/known_hosts"
    finally:
        try:
            hs.run(f"rm -rf {tmp}", timeout=30).check()
        except ProvisionerError as exc:
            cleanup_errors[head.name] = exc
        cleanup_errors.update(_remove_keys(pool, workers, key, added))


def _remove_keys(
    pool: Pool, workers: list[Node], key: RelayKey, added: dict[str, Added | None]
) -> dict[str, ProvisionerError]:
    """Remove the relay key from every worker it may have reached; name each failure."""
    due = [w for w in workers if w.name in added]

    def remove(worker: Node) -> str:
        result = pool.session(worker).run(
            remove_key_command(key, added.get(worker.name)), timeout=30
        )
        result.check()
        return result.stdout

    group = fan_out(due, remove, deadline=60)
    return {name: remove_failed(name, key, exc) for name, exc in group.errors.items()}


def remove_failed(name: str, key: RelayKey, exc: ProvisionerError) -> RemoteError:
    """The error of a relay key left in `name`'s authorized_keys, with the fix."""
    return RemoteError(
        name,
        f"the temporary relay key could not be removed from ~/.ssh/authorized_keys: {exc}",
        f"remove the line ending in {key.comment} from ~/.ssh/authorized_keys on {name} "
        f"(it stops working by itself at its expiry-time)",
        kind="relay-cleanup",
    )


def _relay_worker(
    pool: Pool,
    head: Session,
    worker: Node,
    pin: Pin,
    opts: PushOptions,
    creds: tuple[str, str],
    report: Reporter,
    head_id: str = "",
) -> NodeDelivery:
    t0 = time.monotonic()

    def attempt(n: int) -> NodeDelivery:
        ws = pool.session(worker)
        plan = gather_plan(ws, pin, opts, report=report)
        image_id = plan.image_id or pin.image_id
        out = NodeDelivery(
            worker.name,
            plan.action,
            len(pin.layers),
            attempts=n,
            via=head.host,
            store=plan.store,
            image_id=image_id,
        )
        if plan.action == "send":
            report(f"{worker.name}: the head sends the image ({head.host} -> {worker.name})")
            command = relay_command(pin, worker, *creds, head_id=head_id)
            result = head.run(command, timeout=opts.timeout)
            if not (result.ok and image_id in result.stdout):
                raise RemoteError(
                    worker.name,
                    f"the head could not send the image: {result.tail(3)}",
                    "check that the head reaches the worker's sshd, or push without --star",
                    kind="relay",
                )
            out.layers_sent = len(pin.layers)
        if plan.action != "none":
            verify_and_tag(ws, pin, opts.tag, image_id)
        out.seconds = time.monotonic() - t0
        report(f"{worker.name}: {plan.action} done via {head.host} in {out.seconds:.0f}s")
        return out

    def again(exc: RemoteError) -> None:
        report(f"{worker.name}: relay failed ({exc.message}); retrying")

    return retrying(attempt, opts.retries, lambda exc: exc.kind == "relay", again)


def push_star(
    pool: Pool,
    inventory: Inventory,
    pin: Pin,
    opts: PushOptions,
    report: Reporter,
    out: DeliveryReport,
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
                "not pushed: the star's head failed",
                "fix the head, push again",
                kind="relay",
            )
        return
    workers = list(inventory.workers)
    lock = threading.Lock()

    def safe(line: str) -> None:
        with lock:
            report(line)

    cleanup_errors: dict[str, ProvisionerError] = {}
    lifetime = int(opts.timeout * (opts.retries + 1)) + KEY_GRACE_S
    try:
        with _head_credentials(
            pool, head, workers, make_relay_key(), lifetime, cleanup_errors
        ) as creds:
            hs = pool.session(head)
            group = fan_out(
                workers,
                lambda w: _relay_worker(
                    pool, hs, w, pin, opts, creds, safe, out.nodes[head.name].image_id
                ),
                parallelism=opts.parallelism,
                deadline=opts.timeout * (opts.retries + 1),
            )
    except ProvisionerError as exc:
        for w in workers:
            out.errors[w.name] = exc
    else:
        out.nodes.update(group.results)
        out.errors.update(group.errors)
    out.errors.update(cleanup_errors)  # a key left behind is an error, even after success
