"""One node's push from this machine, and what a push reports; shared by the direct push
(`push.py`), the star (`star.py`) and the chain (`chain.py`).

One round trip gathers Docker's state; a pure decision says send nothing, only re-tag,
or send the layers the node lacks; the layers go as a `docker save` stream (with held
layers left out) into `docker load` over the node's SSH session; the ID is checked and
only then is the cluster tag moved. A stream that breaks is retried from the start on a
fresh connection (`retrying`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TypeVar

from provisioner.console import Reporter, quiet
from provisioner.errors import OperationError, ProvisionerError, RemoteError
from provisioner.image.compress import (
    DECODE_BPS,
    MIN_AUTO_BYTES,
    PROBE_BYTES,
    PROBE_SECONDS,
    CacheRecord,
    Codec,
    Estimate,
    LayerCache,
    Mode,
    best_level,
    calibrate,
    choose,
    compressed_stream,
    layer_ids,
    local_codecs,
    measure,
    node_reads,
    pick_codec,
    sample_rate,
    sender_cores,
    small_send,
)
from provisioner.image.pin import Pin
from provisioner.image.savepipe import (
    SavePipe,
    SaveSource,
    cached_stream,
    from_file,
    kept_any,
    sample_save,
    save_argv,
)
from provisioner.image.savestream import (
    CHUNK,
    SavedImage,
    containerd_id,
    oci_layout,
    partial,
    passthrough,
    read_saved,
)
from provisioner.inventory import Node
from provisioner.local import need, state_root
from provisioner.node.delivery import NodeDelivery
from provisioner.remote import Pool, Result, Session
from provisioner.runtime.delivery_options import HeadStartMode, PushOptions
from provisioner.runtime.docker.push_plan import (
    NodePlan,
    decide,
    facts_script,
    parse_facts,
    verify_and_tag_command,
)

# A broken stream, a failed load, a command past its time, or a reconnection whose
# authentication an overloaded node did not finish: the next attempt may well succeed.
RETRYABLE = frozenset({"connection-lost", "load-failed", "command-timeout", "auth-timeout"})
# Under the SSH user's home: while a push's `docker load` reads its stream, the loader's
# pid, in a file named for the push (`load_command`), so that a push interrupted here ends
# its own loads on the nodes (`end_loads_command`) rather than leave them reading.
LOADS_DIR = ".provisioner/loads"
_PUSH_ID = re.compile(r"[0-9a-f]{8,64}")


def _loads_dir() -> str:
    return f'"$HOME"/{LOADS_DIR}'


def _checked_push_id(push_id: str) -> str:
    if not _PUSH_ID.fullmatch(push_id):
        raise ValueError(f"a push id is 8-64 lowercase hex digits, not {push_id!r}")
    return push_id


def load_command(push_id: str, loader: str = "docker") -> str:
    """`LOADER load` of the stream on stdin, its pid kept in LOADS_DIR/PUSH_ID.SHELLPID while
    it reads (gone once it ended); exits with the load's status. `push_id`: the push's
    own id (hex), which `end_loads_command` names."""
    d, f = _loads_dir(), f"{_loads_dir()}/{_checked_push_id(push_id)}.$$"
    return (
        # a command put in the background reads /dev/null (POSIX; dash even with `<&0`):
        # the stream goes in as fd 3 first
        f"mkdir -p {d} || exit 1; exec 3<&0; {shlex.quote(loader)} load <&3 3<&- & p=$!; "
        f"exec 3<&-; echo $p > {f}; "
        f'wait "$p"; rc=$?; rm -f {f}; exit "$rc"'
    )


def end_loads_command(push_id: str) -> str:
    """Run on a node once a push was interrupted: end each load of that push still reading
    (by the pid its file holds; SIGKILL: a loader blocked on its daemon, say one that
    stopped reading, ends all the same, and its daemon drops the load), and drop the
    files."""
    pattern = f"{_loads_dir()}/{_checked_push_id(push_id)}.*"
    return (
        f'for f in {pattern}; do [ -f "$f" ] || continue; p=$(cat "$f"); '
        'case "$p" in ""|*[!0-9]*) ;; *) kill -KILL "$p" 2>/dev/null ;; esac; '
        'rm -f "$f"; done; true'
    )


# how fast `docker save` is taken to prepare its export, before its first byte (here: 1.95 GB
# in 11.5 s, 170 MB/s); taken faster, so the head start's budget errs short
SAVE_BPS = 300e6
T = TypeVar("T")


@contextmanager
def save_stream(image_id: str) -> Iterator[IO[bytes]]:
    """`docker save IMAGE_ID` from the local engine, as a file; the process ends with the
    block, even when the stream is abandoned half-way."""
    proc = subprocess.Popen(
        save_argv(image_id), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=CHUNK
    )
    assert proc.stdout is not None
    try:
        yield proc.stdout
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        proc.wait()


def local_images() -> dict[str, tuple[str, ...]]:
    """Every image in this machine's Docker (intermediate ones too) by ID, with its layer
    diff IDs, base first; empty when Docker does not answer."""
    docker = need("docker", "docker.io")
    ids = subprocess.run(
        [docker, "image", "ls", "-aq", "--no-trunc"], capture_output=True, text=True, check=False
    )
    wanted = sorted(set(ids.stdout.split())) if ids.returncode == 0 else []
    if not wanted:
        return {}
    fmt = "image {{.Id}} {{range .RootFS.Layers}}{{.}} {{end}}"
    proc = subprocess.run(
        [docker, "image", "inspect", "--format", fmt, *wanted],
        capture_output=True,
        text=True,
        check=False,
    )
    return dict(parse_facts(proc.stdout).images)  # an image gone meanwhile: left out


def head_start_image(
    pin: Pin, images: Mapping[str, tuple[str, ...]], budget: float
) -> tuple[str, int] | None:
    """The image to load ahead of the pin, with how many of the pin's layers it holds:
    of the images whose layers are a strict, non-empty start of the pin's, the longest
    whose bytes fit `budget` and at most half the pin's (so the ahead send stays within
    the save's head start and never doubles the pin). None: none fits, or the pin's
    layer sizes are unknown."""
    sizes = pin.layer_sizes
    if sizes is None or len(sizes) != len(pin.layers):
        return None
    best: tuple[str, int] | None = None
    for image_id, layers in sorted(images.items()):
        k = len(layers)
        if not 0 < k < len(pin.layers) or layers != pin.layers[:k]:
            continue
        if sum(sizes[:k]) > min(budget, pin.bytes_for(0) / 2):
            continue
        if best is None or k > best[1]:
            best = (image_id, k)
    return best


class HeadStart:
    """A cold node's first layers, loaded ahead of the pin's own stream, from an image in
    this machine's Docker whose layers start the pin's (the pin's base, or a stage the
    build left, such as the one ending with the torch layer), `docker save`d into the
    node's `docker load` on a channel of its own while the pin's `docker save` prepares
    its export (about 12 s before its first byte for the 1.95 GB pin here), when the
    link would otherwise idle.

    Why it pays: `docker load` registers layers only once the whole tar is in, one after
    another, and skips a layer whose chain the node already holds, so the ahead image's
    share of that work is done before the pin's stream ends. The pin's stream still
    carries those layers (`docker save` cannot leave them out), so a head start that
    fails costs nothing but its gain: the node registers the layers from the pin's
    stream as it would have. What may go ahead is what the link carries in the
    save's head start (`budget`: the link's rate times the pin's size over SAVE_BPS), at
    most half the pin (`budget_for`). The pin's last chunk waits until the head start
    ended (at most its own channel's `timeout`): the node reads the stream's manifest only
    when the tar ends, and a head start still loading then would register the same
    layers beside the pin's load, and could leave its image behind once the pin's push
    ended. Once the pin is verified, the image sent ahead is removed again (`drop`): only
    the pin is left on the node."""

    def __init__(
        self, session: Session, pin: Pin, budget: float, timeout: float, command: str
    ) -> None:
        self.session, self.pin, self.timeout, self.command = session, pin, timeout, command
        self.budget = budget
        self.done = threading.Event()
        self.image_id = ""
        self.loaded = False
        self.sent = 0  # bytes sent ahead
        self.note = ""
        self._thread = threading.Thread(target=self._run, name="head-start", daemon=True)

    def start(self) -> HeadStart:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            chosen = head_start_image(self.pin, local_images(), self.budget)
            if chosen is None:
                self.note = (
                    f"no head start: no local image starting the pin fits "
                    f"{self.budget / 1e6:,.0f} MB"
                )
                return
            self.image_id, k = chosen
            with save_stream(self.image_id) as out:
                result = self.session.run_streaming_stdin(
                    self.command, passthrough(out), on_bytes=self._count, timeout=self.timeout
                )
            self.loaded = result.ok and self.image_id in result.stdout
            self.note = (
                f"head start: {k} layer(s), {self.sent / 1e6:,.0f} MB, loaded ahead"
                if self.loaded
                else f"head start not loaded ({result.tail(1)}); the pin's stream carries it"
            )
        except (ProvisionerError, OSError) as exc:
            self.note = f"head start failed ({exc}); the pin's stream carries its layers"
        finally:
            self.done.set()

    def _count(self, total: int) -> None:
        self.sent = total

    def wait(self) -> bool:
        """Wait until the head start ended (its channel ends within its timeout, and
        a little more); whether it loaded."""
        self.done.wait(self.timeout + 30)
        return self.loaded

    def drop(self) -> str:
        """The image to remove from the node once the pin is verified: the one sent ahead,
        if any was (the node held no layer of the pin, so it held no image that starts
        like the pin: it was not there before)."""
        return self.image_id if self.sent else ""


def budget_for(mode: HeadStartMode, pin: Pin, link_bps: float) -> float:
    """How many bytes may go ahead of the pin (`HeadStart`): what the link carries while
    `docker save` prepares the pin's export (taken at SAVE_BPS, faster than measured
    here, so that it errs short); `always`: any amount (`head_start_image` still keeps
    it to half the pin); `never`: none."""
    if mode == "never":
        return 0.0
    if mode == "always":
        return float("inf")
    return link_bps * pin.bytes_for(0) / SAVE_BPS


def held_back(chunks: Iterator[bytes], before_last: Callable[[], object]) -> Iterator[bytes]:
    """`chunks` as they come, but `before_last()` runs before the last one is yielded
    (the tar's end, after which the node's `docker load` reads the manifest)."""
    held: bytes | None = None
    for chunk in chunks:
        if held is not None:
            yield held
        held = chunk
    before_last()
    if held is not None:
        yield held


class SavedCache:
    """The pinned image saved once to a file, for every partial send of a push (and of
    later pushes: the file is kept until another pin replaces it)."""

    def __init__(self, pin: Pin, directory: Path | None) -> None:
        self.pin = pin
        self.directory = directory or state_root() / "images"
        self.layers = LayerCache(self.directory / "layers")
        self._lock = threading.Lock()
        self._saved: SavedImage | None = None

    def on_disk(self) -> bool:
        """Whether the pin is saved here already (a partial or compressed send reads it)."""
        return self._saved is not None or self._path().exists()

    def _path(self) -> Path:
        return self.directory / f"{self.pin.image_id.removeprefix('sha256:')}.tar"

    def get(self, report: Reporter) -> SavedImage:
        with self._lock:
            if self._saved is None:
                self._saved = self._load_or_save(report)
            return self._saved

    def _load_or_save(self, report: Reporter) -> SavedImage:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.pin.image_id.removeprefix('sha256:')}.tar"
        if path.exists():
            try:
                kept: SavedImage | None = read_saved(path)
            except OperationError:  # not a whole `docker save` file: saved anew below
                kept = None
            if kept is not None and kept.config == self.pin.image_id:
                return kept
            path.unlink()
        for old in self.directory.glob("*.tar"):
            old.unlink()
        report(f"saving {self.pin.short_id()} once for partial sends: {path}")
        tmp = path.with_suffix(".partial")
        proc = subprocess.run(
            [need("docker", "docker.io"), "save", "-o", str(tmp), self.pin.image_id],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise OperationError(
                f"docker save of {self.pin.short_id()} failed: {proc.stderr.strip()[-300:]}",
                "check the local Docker engine and free disk under " + str(self.directory),
            )
        try:
            saved = read_saved(tmp)
            if saved.config != self.pin.image_id:
                raise OperationError(
                    f"docker saved {saved.config[:19]}, not the pinned {self.pin.short_id()}",
                    "run `provisioner image build` again",
                )
            problems = saved_problems(saved, self.pin.layers)
            if problems:
                raise OperationError(
                    f"docker save of {self.pin.short_id()} wrote {'; '.join(problems)}",
                    "check the local Docker engine and the disk under "
                    f"{self.directory}, then push again",
                )
            tmp.rename(path)
        finally:
            tmp.unlink(missing_ok=True)
        return replace(saved, path=path)

    def reject(self, record: CacheRecord, codec: Codec | None) -> list[str]:
        """After a node's load rejected what was sent (or the stream broke on what was
        read here): remove the cache entries it was made of whose content is not what
        their names say, so that the next attempt makes them anew; what was removed. The
        saved image is checked when this push read it."""
        dropped: list[str] = []
        if codec is not None:
            for diff_id in self.layers.drop_bad([*record.hits, *record.misses], codec):
                dropped.append(f"the compressed layer {diff_id[:19]}")
        with self._lock:
            if self._saved is None:
                return dropped
            path = self._saved.path
            try:
                problems = saved_problems(read_saved(path), self.pin.layers)
            except OperationError as exc:
                problems = [exc.message]
            except OSError:  # gone: another node's attempt dropped it
                problems = []
            if problems:
                path.unlink(missing_ok=True)
                dropped.append(f"the saved image {path.name} ({'; '.join(problems)})")
            self._saved = None  # the next attempt reads the file again, or saves it anew
        return dropped


def saved_problems(saved: SavedImage, diff_ids: Sequence[str]) -> list[str]:
    """What in a saved image file is not the image it names: its config (whose sha256 is
    the image ID) or a layer file whose content does not hash to its diff ID."""
    names = {_norm(m.name): m for m in saved.members}
    hexd = saved.config.removeprefix("sha256:")
    config = names.get(f"{hexd}.json") or names.get(f"blobs/sha256/{hexd}")
    wanted = [(config, saved.config, "the config")]
    by_name = layer_ids(saved, diff_ids)
    wanted += [
        (m, by_name[m.name], f"layer {by_name[m.name][:19]}")
        for m in saved.members
        if m.name in by_name
    ]
    if set(by_name.values()) != set(diff_ids):
        return [f"a file of {len(diff_ids)} layers that holds {len(set(by_name.values()))} of them"]
    problems: list[str] = []
    with saved.path.open("rb") as f:
        for member, digest, what in wanted:
            if member is None or _member_digest(f, member) != digest:
                problems.append(f"{what}, not its content")
    return problems


def _member_digest(f: IO[bytes], member: tarfile.TarInfo) -> str:
    digest = hashlib.sha256()
    f.seek(member.offset_data)
    left = member.size
    while left > 0 and (block := f.read(min(CHUNK, left))):
        digest.update(block)
        left -= len(block)
    return "" if left else "sha256:" + digest.hexdigest()


def _norm(name: str) -> str:
    return name.removeprefix("./")


def store_ids(pin: Pin, cache_dir: Path | None = None) -> frozenset[str]:
    """The IDs the pin has in Docker's image stores: its own (the classic store) and, when
    it is saved here (a push to a node with the containerd image store saves it), the one
    that store gives it (`containerd_id`). Nothing is saved for this."""
    cache = SavedCache(pin, cache_dir)
    if not cache._path().exists():
        return frozenset({pin.image_id})
    try:
        saved = read_saved(cache._path())
        if saved.config != pin.image_id:
            return frozenset({pin.image_id})
        return frozenset({pin.image_id, containerd_id(saved, pin.layers)})
    except OperationError:
        return frozenset({pin.image_id})


class Guarded:
    """Wraps the chunk generator: an error inside it ends the stream early (so `docker
    load` sees a truncated tar and fails) and is kept to be raised afterwards."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.error: BaseException | None = None

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self.chunks
        except Exception as exc:
            self.error = exc


class Progress:
    """Bytes and rate for one node, reported every few seconds."""

    def __init__(self, host: str, report: Reporter, every: float = 3.0) -> None:
        self.host, self.report, self.every = host, report, every
        self.t0 = time.monotonic()
        self.last = self.t0
        self.sent = 0

    def __call__(self, total: int) -> None:
        self.sent = total
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            rate = total / max(now - self.t0, 1e-6)
            self.report(f"{self.host}: {total / 1e6:,.0f} MB sent, {rate / 1e6:.1f} MB/s")


@dataclass
class Sent:
    """What one stream carried: bytes on the wire, bytes of held layers left out, and
    the codec with its cache record (codec None: plain)."""

    bytes_sent: int = 0
    bytes_omitted: int = 0
    codec: Codec | None = None
    reason: str = ""
    record: CacheRecord = field(default_factory=CacheRecord)
    head_start: HeadStart | None = None  # the image loaded ahead (a plain cold send)

    def into(self, out: NodeDelivery) -> None:
        out.bytes_sent, out.bytes_omitted = self.bytes_sent, self.bytes_omitted
        out.codec = self.codec.family if self.codec else ""
        out.compress_reason = self.reason
        out.cache_hits, out.cache_misses = len(self.record.hits), len(self.record.misses)
        out.head_start_bytes = self.head_start.sent if self.head_start else 0


def probe_link(session: Session, tries: int = 2) -> float:
    """The node's link from here, bytes per second: the best of `tries` probes
    (`probe_once`). A busy moment on either end only ever reads slower than the link,
    so the fastest probe is the nearest to it."""
    return max(probe_once(session) for _ in range(max(1, tries)))


def probe_once(
    session: Session, nbytes: int = PROBE_BYTES, seconds: float = PROBE_SECONDS
) -> float:
    """The node's link from here, in bytes per second: random data into `cat` over the
    node's SSH session (encryption included, as a push has it), up to `nbytes` or for
    about `seconds`. Timed from the first chunk sent to the command's end, over the
    bytes after that chunk, so opening the channel is not counted against the link."""
    block = os.urandom(CHUNK)
    first: list[float] = []
    total = [0]

    def on_bytes(sent: int) -> None:
        total[0] = sent
        if not first:
            first.append(time.monotonic())

    def chunks() -> Iterator[bytes]:
        sent = 0
        while sent < nbytes and not (first and time.monotonic() - first[0] > seconds):
            sent += len(block)
            yield block

    session.run_streaming_stdin("cat > /dev/null", chunks(), on_bytes=on_bytes, timeout=60).check()
    if not first or total[0] <= len(block):
        return 1.0
    return (total[0] - len(block)) / max(time.monotonic() - first[0], 1e-6)


def plan_codec(
    session: Session,
    pin: Pin,
    plan: NodePlan,
    opts: PushOptions,
    report: Reporter,
    saved: SavedCache,
    whole: bool = True,
    source: SaveSource | None = None,
    probed: list[float] | None = None,
) -> tuple[Codec | None, str]:
    """Whether to send the node's layers compressed, with which codec, and why.

    auto, cheapest first: a codec both sides read; a send big enough to matter; the link
    probed; with every layer cached, the cache's own ratio; else the compressor's rate
    on a fixed sample, and only when even a perfect ratio would beat plain, the ratio on
    a sample of the image (its saved file, or else its `docker save` stream)."""
    if opts.compress == "never":
        return None, "compression off"
    if plan.store == "containerd":
        return None, "the node's containerd image store gets its layers as an OCI layout"
    codec = pick_codec(local_codecs(), node_reads(plan.engine))
    if codec is None:
        return None, f"the node's docker load ({plan.engine or 'unknown'}) reads no codec here"
    # the whole image as one stream, `docker save | compressor` (savepipe): a node that
    # holds none of it, fed by a caller that can send it so (`whole`; not the chain,
    # whose hops take layers out of the tar)
    if whole and plan.first_missing == 0:
        return whole_codec(session, pin, codec, opts.compress, saved.directory, source, probed)
    if opts.compress == "always":
        saved.get(report)
        return codec, "compression forced"
    total = pin.bytes_for(plan.first_missing)
    small = small_send(total)
    if small is not None:
        saved.get(report)
        return codec, small
    if total < MIN_AUTO_BYTES:
        return None, f"{total / 1e6:,.0f} MB: too little to be worth compressing"
    sizes = list(pin.layer_sizes or ())
    known = len(sizes) == len(pin.layers)
    send = list(zip(pin.layers, sizes if known else [0] * len(pin.layers), strict=True))
    send = send[plan.first_missing :]
    cached = [(d, n) for d, n in send if saved.layers.has(d, codec)]
    if known:
        uncached = total - sum(n for _, n in cached)
    else:
        uncached = 0 if len(cached) == len(send) else total
    link = probe_link(session)
    if probed is not None:
        probed.append(link)
    decode = DECODE_BPS[codec.family]
    if uncached == 0:
        got = sum(saved.layers.path(d, codec).stat().st_size for d, _ in cached)
        est = Estimate(link, float("inf"), got / max(total, 1), total, 0, decode)
        use, why = choose("auto", est)
        return (codec if use else None), why
    cpu = calibrate(codec)
    best, why = choose("auto", Estimate(link, cpu, 0.0, total, uncached, decode))
    if not best:
        return None, f"plain even at any ratio: {why}"
    if saved.on_disk():
        image = saved.get(report)
        ids = layer_ids(image, pin.layers)
        biggest = max((m for m in image.members if m.name in ids), key=lambda m: m.size)
        _, ratio = sample_rate(image, biggest, codec)
    else:
        _, ratio = measure(sample_save(pin.image_id), codec)
    use, why = choose("auto", Estimate(link, cpu, ratio, total, uncached, decode))
    return (codec if use else None), why


def whole_codec(
    session: Session,
    pin: Pin,
    codec: Codec,
    mode: Mode,
    directory: Path,
    source: SaveSource | None = None,
    probed: list[float] | None = None,
) -> tuple[Codec | None, str]:
    """Whether the whole image, one `docker save` stream for a node that holds none of it
    (`send_whole`), goes through `codec` (a family the node's loader reads), at which
    level, and why. auto: a send big enough to matter; the link probed; with the stream
    kept here from an earlier push, that file's own ratio; else the compressor's rate
    (one core's, times the cores the push leaves it), and only when even a perfect ratio
    would beat plain, zstd's levels weighed on a sample of the save (`source`'s, when
    given, so the save that is sent is the one sampled)."""
    if mode == "never":
        return None, "compression off"
    if mode == "always":
        return codec, "compression forced"
    total = pin.bytes_for(0)
    small = small_send(total)
    if small is not None:
        return codec, small
    if total < MIN_AUTO_BYTES:
        return None, f"{total / 1e6:,.0f} MB: too little to be worth compressing"
    decode = DECODE_BPS[codec.family]
    kept = cached_stream(directory, pin.image_id, codec.family)
    link = probe_link(session)
    if probed is not None:
        probed.append(link)
    if kept is not None:  # a cold push sent before: its compressed stream, kept here
        ratio = kept.stat().st_size / max(total, 1)
        use, why = choose("auto", Estimate(link, float("inf"), ratio, total, 0, decode))
        return (codec if use else None), why
    cores = sender_cores()
    cpu = calibrate(codec) * cores / (os.cpu_count() or 1)
    best, why = choose("auto", Estimate(link, cpu, 0.0, total, total, decode))
    if not best:
        return None, f"plain even at any ratio: {why}"
    data = source.sample() if source is not None else sample_save(pin.image_id)
    level, est = best_level(data, codec, link, total, cores)
    use, why = choose("auto", est)
    return (level if use else None), why


def check_codec_all(codec: Codec, plans: list[NodePlan]) -> bool:
    """Whether every node (by its plan's engine) reads the codec inside a layer."""
    return all(codec.family in node_reads(p.engine) for p in plans)


def stream_layers(
    session: Session,
    pin: Pin,
    plan: NodePlan,
    opts: PushOptions,
    report: Reporter,
    saved: SavedCache,
) -> Sent:
    """Send the layers of `plan` into the node's `docker load`, compressed when
    plan_codec says so. A whole image streams from one `docker save` (whose start the
    rule samples first), plain or through the compressor (`cold_stream`); a partial one
    from the saved file, its layers compressed there one by one when compressed.

    A stream the node's load rejected, or one that broke on what was read here, has the
    cache entries it was made of checked against their layers' diff IDs (`reject`);
    those that are not what their names say are dropped, and the attempt is then one to
    retry (`load-failed`): the next one makes them anew."""
    out = Sent()
    try:
        _stream_layers(session, pin, plan, opts, report, saved, out)
    except OperationError as exc:
        if isinstance(exc, RemoteError) and exc.kind != "load-failed":
            raise
        dropped = saved.reject(out.record, out.codec)
        if not dropped:
            raise
        report(f"{session.host}: dropped from the cache: {', '.join(dropped)}")
        raise RemoteError(
            session.host,
            f"{exc.message} (dropped from the cache: {', '.join(dropped)})",
            "run the push again: what was dropped is made anew",
            kind="load-failed",
        ) from exc
    return out


def _stream_layers(
    session: Session,
    pin: Pin,
    plan: NodePlan,
    opts: PushOptions,
    report: Reporter,
    saved: SavedCache,
    out: Sent,
) -> None:
    load = load_command(opts.push_id)
    with closing(SaveSource(pin.image_id)) as source:
        cold = plan.first_missing == 0 and plan.store != "containerd"
        if cold and not kept_any(saved.directory, pin.image_id):
            source.start()  # its 13 s before the first byte overlap the probe and sample
        probed: list[float] = []
        out.codec, out.reason = plan_codec(
            session, pin, plan, opts, report, saved, source=source, probed=probed
        )
        how = f"compressed: {out.codec.name} -{out.codec.level}" if out.codec else "plain"
        report(f"{session.host}: {how} ({out.reason})")

        def on_omitted(n: int) -> None:
            out.bytes_omitted += n

        progress = Progress(session.host, report)
        if plan.store == "containerd":
            chunks = oci_layout(saved.get(report), pin.layers, plan.first_missing, on_omitted)
            guarded = Guarded(chunks)
            result = session.run_streaming_stdin(
                load, iter(guarded), on_bytes=progress, timeout=opts.timeout
            )
        elif out.codec is not None and plan.first_missing == 0:
            cold_stream(session, pin, out, opts, saved, progress, source)
            out.bytes_sent = progress.sent
            return
        elif out.codec is not None:
            chunks = compressed_stream(
                saved.get(report),
                pin.layers,
                plan.first_missing,
                out.codec,
                saved.layers,
                out.record,
                on_omitted,
            )
            guarded = Guarded(chunks)
            result = session.run_streaming_stdin(
                load, iter(guarded), on_bytes=progress, timeout=opts.timeout
            )
        elif plan.first_missing == 0:
            link = 0.0
            if opts.head_start == "auto":
                link = probed[-1] if probed else probe_link(session)
            budget = budget_for(opts.head_start, pin, link)
            head = HeadStart(session, pin, budget, opts.timeout, load).start() if budget else None
            out.head_start = head
            chunks = source.chunks()
            guarded = Guarded(held_back(chunks, head.wait) if head else chunks)
            result = session.run_streaming_stdin(
                load, iter(guarded), on_bytes=progress, timeout=opts.timeout
            )
            if head is not None:
                report(f"{session.host}: {head.note or 'head start did not end'}")
        else:
            guarded = Guarded(partial(saved.get(report), plan.first_missing, on_omitted))
            result = session.run_streaming_stdin(
                load, iter(guarded), on_bytes=progress, timeout=opts.timeout
            )
        check_load(session, plan.image_id or pin.image_id, guarded, result)
        out.bytes_sent = progress.sent


def cold_stream(
    session: Session,
    pin: Pin,
    out: Sent,
    opts: PushOptions,
    saved: SavedCache,
    progress: Progress,
    source: SaveSource,
) -> None:
    """The whole image compressed into the node's `docker load` (`send_whole`), checked
    by the pin's ID."""
    assert out.codec is not None
    hit = send_whole(
        session,
        pin,
        out.codec,
        saved,
        source,
        load_command(opts.push_id),
        progress,
        opts.timeout,
        lambda guarded, result: check_load(session, pin.image_id, guarded, result),
    )
    (out.record.hits if hit else out.record.misses).append(pin.image_id)


def send_whole(
    session: Session,
    pin: Pin,
    codec: Codec,
    saved: SavedCache,
    source: SaveSource,
    command: str,
    progress: Callable[[int], None],
    timeout: float,
    check: Callable[[Guarded, Result], None],
) -> bool:
    """The whole image compressed into `command` on the node (a loader that decompresses
    its input: `docker load`, `podman load`): the stream kept from an earlier cold push
    when there is one (nothing saved or compressed), else `docker save` piped through the
    compressor (savepipe), kept once `check` (which raises unless the node loaded the
    pin) passed. Whether the kept stream was sent (a hit, noted in the cache's record)."""
    directory = saved.directory
    kept = cached_stream(directory, pin.image_id, codec.family)
    pipe: SavePipe | None = None
    if kept is not None:
        chunks = from_file(kept)
    else:
        pipe = SavePipe(source, codec, directory)
        chunks = pipe.chunks()
    try:
        guarded = Guarded(chunks)
        result = session.run_streaming_stdin(
            command, iter(guarded), on_bytes=progress, timeout=timeout
        )
        try:
            check(guarded, result)
        except RemoteError as exc:
            if kept is not None and exc.kind == "load-failed":  # rejected: made anew next time
                kept.unlink(missing_ok=True)
                saved.layers.note(f"stream:{pin.image_id}", codec, "dropped")
            raise
        if pipe is not None:
            pipe.keep()
    finally:
        if pipe is not None:
            pipe.close()
    saved.layers.note(f"stream:{pin.image_id}", codec, "hit" if kept is not None else "miss")
    return kept is not None


def raise_save_failure(host: str, error: BaseException | None) -> None:
    """Raise what broke the local side of a stream (a Guarded's error), if anything did:
    a ProvisionerError as it is, anything else as the local save having failed."""
    if error is None:
        return
    if isinstance(error, ProvisionerError):
        raise error
    raise RemoteError(
        host,
        f"reading the local image failed: {error}",
        "check the local Docker engine (`docker image inspect` the pinned ID)",
        kind="save-failed",
    )


def check_load(session: Session, image_id: str, guarded: Guarded, result: Result) -> None:
    """Raise what a stream into `docker load` ended with, unless it loaded `image_id` (the
    pin's ID in the node's image store)."""
    raise_save_failure(session.host, guarded.error)
    if not result.ok and "no space left on device" in (result.stderr + result.stdout).lower():
        raise RemoteError(
            session.host,
            f"the node's disk filled up while Docker loaded the image: {result.tail(1)}",
            "free space on the node under Docker's root and its tmp directory "
            "(`df -h /var/lib/docker`; `docker system prune` removes unused images), "
            "then push again",
            kind="no-space",
        )
    if not result.ok or image_id not in result.stdout:
        raise RemoteError(
            session.host,
            f"docker load did not load the pinned image: {result.tail(3) or result.stdout[-200:]}",
            "run the push again; it starts this node from the beginning",
            kind="load-failed",
        )


def retrying(
    attempt: Callable[[int], T],
    retries: int,
    retryable: Callable[[RemoteError], bool],
    on_retry: Callable[[RemoteError], None],
) -> T:
    """Run `attempt(1)`, `attempt(2)`, ...: again after a retryable RemoteError, at most
    `retries` more times; any other error, or the last one, is raised."""
    n = 0
    while True:
        n += 1
        try:
            return attempt(n)
        except RemoteError as exc:
            if not retryable(exc) or n > retries:
                raise
            on_retry(exc)


def gather_plan(
    session: Session,
    pin: Pin,
    opts: PushOptions,
    saved: SavedCache | None = None,
    report: Reporter = quiet,
) -> NodePlan:
    """The node's plan from its facts. A node with Docker's containerd image store names
    the pin by another ID (`containerd_id`), read from the pin saved here (`saved`)."""
    result = session.run(facts_script(opts.tag), timeout=60).check()
    facts = parse_facts(result.stdout)
    node_id = ""
    if facts.store == "containerd":
        node_id = containerd_id((saved or SavedCache(pin, opts.cache_dir)).get(report), pin.layers)
    plan = decide(pin, facts, session.host, opts.tag, node_id)
    if opts.full and plan.action == "send" and plan.first_missing:
        plan = replace(plan, first_missing=0, layers_to_send=pin.layers)
    return plan


def verify_and_tag(
    session: Session, pin: Pin, tag: str, image_id: str = "", drop: str = ""
) -> None:
    """Tag the pin on the node once its Docker names it by `image_id` (default: the pin's);
    then remove the image `drop` (what the push loaded ahead of the pin), if any."""
    command = verify_and_tag_command(image_id or pin.image_id, tag, drop)
    session.run(command, timeout=60).check(
        f"the node's Docker does not hold {pin.short_id()}; run the push again"
    )


def push_node(
    pool: Pool,
    node: Node,
    pin: Pin,
    opts: PushOptions,
    report: Reporter,
    saved: SavedCache | None = None,
) -> NodeDelivery:
    """Make one node hold the pin under the cluster tag, retrying a broken stream."""
    saved = saved or SavedCache(pin, opts.cache_dir)
    t0 = time.monotonic()

    def attempt(n: int) -> NodeDelivery:
        session = pool.session(node)
        plan = gather_plan(session, pin, opts, saved, report)
        drop = ""
        outcome = NodeDelivery(
            node.name,
            plan.action,
            len(pin.layers),
            attempts=n,
            store=plan.store,
            image_id=plan.image_id or pin.image_id,
        )
        if plan.action == "send":
            held = f", {plan.first_missing} held" if plan.first_missing else ""
            report(f"{node.name}: sending {len(plan.layers_to_send)} layer(s){held}")
            sent = stream_layers(session, pin, plan, opts, report, saved)
            sent.into(outcome)
            outcome.layers_sent = len(plan.layers_to_send)
            drop = sent.head_start.drop() if sent.head_start else ""
        if plan.action != "none":
            verify_and_tag(session, pin, opts.tag, plan.image_id, drop)
        outcome.seconds = time.monotonic() - t0
        report(_summary(outcome))
        return outcome

    def again(exc: RemoteError) -> None:
        report(f"{node.name}: {exc.message}; retrying from the start")
        pool.forget(node)

    return retrying(attempt, opts.retries, lambda exc: exc.kind in RETRYABLE, again)


def _summary(n: NodeDelivery) -> str:
    if n.action == "none":
        return f"{n.host}: already holds the pinned image; nothing sent"
    if n.action == "tag":
        return f"{n.host}: held the pinned image; tagged it"
    rate = n.bytes_sent / n.seconds / 1e6 if n.seconds else 0.0
    how = f", layers {n.codec} ({n.cache_hits} cached)" if n.codec else ""
    return (
        f"{n.host}: loaded and verified; {n.bytes_sent / 1e6:,.0f} MB in {n.seconds:.0f}s "
        f"({rate:.1f} MB/s), {n.bytes_omitted / 1e6:,.0f} MB held{how}"
    )
