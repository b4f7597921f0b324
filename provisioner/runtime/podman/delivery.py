"""The podman runtime's image delivery: the pin goes as `docker save`'s stream (from this
machine's Docker, where `image build` made it) into each node's `podman load` as the SSH
user, and is verified by ID. Podman keeps a docker-archive under the ID Docker gives it
(the digest of the image's config), written bare, without `sha256:`. A node whose Podman
holds the pin already is sent nothing.

Compressed when the link says so, by the same rule and the same kept stream as Docker's
cold push (`runtime.docker.direct.whole_codec`, `send_whole`): `podman load` decompresses its
input itself. Which codecs it reads, tried in the lab with the pin's stream
(`podman_reads`): Podman 4.3 (Debian 12) loads zstd but refuses gzip ("loading tar
component manifest.json: archive/tar: invalid tar header", from gzip -1 and pigz alike);
Podman 5.4 (Debian 13) loads both.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.errors import InputError, RemoteError
from provisioner.image.compress import Codec, Mode, local_codecs, pick_codec
from provisioner.image.pin import Pin
from provisioner.image.savepipe import SaveSource, kept_any
from provisioner.inventory import Inventory, Node
from provisioner.node.delivery import DeliveryReport, NodeDelivery
from provisioner.remote import fan_out
from provisioner.runtime.docker.direct import (
    Guarded,
    Progress,
    SavedCache,
    raise_save_failure,
    send_whole,
    whole_codec,
)

if TYPE_CHECKING:
    from provisioner.console import Reporter
    from provisioner.remote import Pool, Result, Session

LOAD_TIMEOUT_S = 1800.0
LOAD_PARALLELISM = 4


def bare_id(image_id: str) -> str:
    """An image ID as Podman names it: the hex digits, without `sha256:`."""
    return image_id.removeprefix("sha256:")


def full_id(image_id: str) -> str:
    """An image ID as the pin writes it: `sha256:` and the hex digits."""
    return image_id if image_id.startswith("sha256:") or not image_id else f"sha256:{image_id}"


def has_image_command(image_id: str) -> str:
    """Prints the ID Podman holds the pin under ("": not held)."""
    i = shlex.quote(bare_id(image_id))
    return f"podman image inspect --format '{{{{.Id}}}}' {i} 2>/dev/null || true"


def holds_image(stdout: str, image_id: str) -> bool:
    """Pure: `has_image_command`'s output names exactly the pin's ID (Podman's bare hex)."""
    return bool(image_id) and stdout.strip() == bare_id(image_id)


LOAD_COMMAND = "podman load"
ZSTD_SINCE = (4, 3)  # the oldest Podman seen loading a zstd stream (Debian 12's 4.3.1)
GZIP_SINCE = (5, 0)  # Podman 4.3.1 refused a gzip stream; 5.4.2 (Debian 13) loads it


def state_command(image_id: str) -> str:
    """Two lines: the ID Podman holds the pin under ("": not held), then Podman's version."""
    return (
        has_image_command(image_id)
        + "; echo; podman version --format '{{.Client.Version}}' 2>/dev/null || true"
    )


def parse_state(stdout: str) -> tuple[str, str]:
    """Pure: `state_command`'s output as (held ID, Podman's version)."""
    lines = [*stdout.splitlines(), "", ""]
    return lines[0].strip(), lines[1].strip()


def podman_reads(version: str) -> tuple[str, ...]:
    """Pure: the compressed streams (codec families) a Podman of `version` loads."""
    try:
        major, minor = (int(p) for p in version.split(".")[:2])
    except ValueError:
        return ()
    reads = ("zst",) if (major, minor) >= ZSTD_SINCE else ()
    return (*reads, "gz") if (major, minor) >= GZIP_SINCE else reads


def _verify(session: Session, pin: Pin) -> None:
    got = session.run(has_image_command(pin.image_id), timeout=60).stdout.strip()
    if not holds_image(got, pin.image_id):
        raise RemoteError(
            session.host,
            f"podman load did not leave the pinned image {pin.short_id()} "
            f"(the node's Podman holds: {got or 'no such image'})",
            "run `provisioner up` again; it sends the image again",
            kind="load-failed",
        )


def _failed(session: Session, result: Result) -> RemoteError:
    space = "no space left on device" in (result.stderr + result.stdout).lower()
    return RemoteError(
        session.host,
        f"podman load failed: {result.tail(3)}",
        "free space under the user's Podman storage (`podman info --format "
        "'{{.Store.GraphRoot}}'`; `podman image prune -a` removes unused images), then "
        "run `provisioner up` again"
        if space
        else "run `provisioner up` again; `podman load` on the node shows the error",
        kind="no-space" if space else "load-failed",
    )


def _check(session: Session, pin: Pin, failure: BaseException | None, result: Result) -> None:
    """Raise what a stream into `podman load` ended with, unless it loaded the pin."""
    raise_save_failure(session.host, failure)
    if not result.ok:
        raise _failed(session, result)
    _verify(session, pin)


def _load(
    session: Session,
    pin: Pin,
    report: Reporter,
    reads: Sequence[str],
    opts: LoadOptions,
) -> tuple[int, Codec | None, str]:
    """Stream `docker save` of the pin into the node's `podman load`, compressed when
    `whole_codec` says so; checked by ID. The bytes sent, the codec (None: plain), why."""
    progress = Progress(session.host, report, every=10.0)
    saved = SavedCache(pin, opts.cache_dir)
    with closing(SaveSource(pin.image_id)) as source:
        if not kept_any(saved.directory, pin.image_id):
            source.start()  # its seconds before the first byte overlap the probe
        codec = pick_codec(opts.codecs or local_codecs(), reads)
        if codec is None:
            why = (
                "compression off"
                if opts.compress == "never"
                else "the node's podman load reads none of the streams this machine can compress"
            )
        else:
            codec, why = whole_codec(session, pin, codec, opts.compress, saved.directory, source)
        how = f"compressed: {codec.name} -{codec.level}" if codec else "plain"
        report(f"{session.host}: {how} ({why})")
        if codec is not None:
            send_whole(
                session,
                pin,
                codec,
                saved,
                source,
                LOAD_COMMAND,
                progress,
                LOAD_TIMEOUT_S,
                lambda guarded, result: _check(session, pin, guarded.error, result),
            )
            return progress.sent, codec, why
        guarded = Guarded(source.chunks())  # a broken local save: the load sees a short tar
        result = session.run_streaming_stdin(
            LOAD_COMMAND, iter(guarded), on_bytes=progress, timeout=LOAD_TIMEOUT_S
        )
        _check(session, pin, guarded.error, result)
    return progress.sent, None, why


@dataclass(frozen=True)
class LoadOptions:
    """How the pin goes into `podman load`: `compress` as a push's (auto: by the link);
    `codecs`: the compressors this machine may use (default: those it has); `cache_dir`:
    where the kept compressed stream lives (default: the state dir's saved images)."""

    compress: Mode = "auto"
    codecs: tuple[str, ...] = ()
    cache_dir: Path | None = None


def deliver(
    pool: Pool, nodes: list[Node], pin: Pin, report: Reporter, opts: LoadOptions = LoadOptions()
) -> DeliveryReport:
    """Every node holds the pin in its user's Podman: nodes that hold it are left alone;
    the others get `docker save`'s stream into `podman load` (compressed in a codec the
    node's Podman reads, when the link says so); each is checked by ID."""
    t0 = time.monotonic()
    out = DeliveryReport(pin.image_id, "")
    lock = threading.Lock()

    def said(line: str) -> None:
        with lock:
            report(line)

    def one(node: Node) -> NodeDelivery:
        started = time.monotonic()
        session = pool.session(node)
        held, version = parse_state(session.run(state_command(pin.image_id), timeout=60).stdout)
        if holds_image(held, pin.image_id):
            said(f"{node.name}: already holds the pinned image; nothing sent")
            return NodeDelivery(node.name, "none", len(pin.layers))
        said(f"{node.name}: podman load of {pin.short_id()} (Podman {version or 'unknown'})")
        sent, codec, why = _load(session, pin, said, podman_reads(version), opts)
        push = NodeDelivery(node.name, "send", len(pin.layers), len(pin.layers), sent)
        push.codec, push.compress_reason = (codec.family if codec else ""), why
        push.seconds = time.monotonic() - started
        said(f"{node.name}: loaded and verified; {sent / 1e6:,.0f} MB in {push.seconds:.0f}s")
        return push

    group = fan_out(nodes, one, parallelism=LOAD_PARALLELISM, deadline=LOAD_TIMEOUT_S + 120)
    out.nodes.update(group.results)
    out.errors.update(group.errors)
    out.seconds = time.monotonic() - t0
    return out


class PodmanDelivery:
    """The podman runtime's delivery (`runtime.protocol.Delivery`): `docker save`'s stream of
    the pin into each node's `podman load`, verified by ID; a node that holds it is sent
    nothing."""

    def __init__(
        self, inventory: Inventory, pin: Pin | None, options: LoadOptions | None = None
    ) -> None:
        self.inventory = inventory
        self.pin = pin
        self.image_id = pin.image_id if pin else ""
        self.options = options or LoadOptions()

    def has_command(self) -> str:
        return has_image_command(self.image_id)

    def holds(self, stdout: str) -> bool:
        return holds_image(stdout, self.image_id)

    def verify(self, session: Session) -> None:
        _verify(session, self._pin())

    def _pin(self) -> Pin:
        if self.pin is None:
            raise InputError(
                "the inventory names no image pin (image.lock), and the podman runtime runs "
                "Ray in the pinned image",
                "run `provisioner image build`, then set image.lock in the inventory",
                where=str(self.inventory.path),
            )
        return self.pin

    def deliver(
        self, pool: Pool, report: Reporter, *, ready: Mapping[str, str] | None = None
    ) -> DeliveryReport:
        ready = ready or {}
        pin = self._pin()
        report(f"image: making every node's Podman hold {pin.short_id()} (podman load)")
        nodes = [n for n in self.inventory.nodes if n.name not in ready]
        out = deliver(pool, nodes, pin, report, self.options)
        for name in ready:
            out.nodes[name] = NodeDelivery(name, "none", len(pin.layers), via="doctor")
        return out
