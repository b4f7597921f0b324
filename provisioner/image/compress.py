"""Compressed pushes: which codec, whether to compress at all, and the compressed stream.

What the node decompresses with: Docker's own `docker load`. It unpacks the `docker
save` tar and then opens each layer file through its decompressing reader
(moby `image/tarexport/load.go` `loadLayer` -> `archive.DecompressStream`, which tells
gzip, bzip2, xz and, from Docker 20.10, zstd by their magic bytes). So the stream
stays a plain tar whose layer files are compressed one by one; the node needs no
decompressor of its own, the image ID is unchanged (the config and the layers' diff
IDs are of the uncompressed data, which Docker checks as it applies them), the
layers the node holds are still left out, and the forwarding chain's `tar --delete`
still works on the stream. An image store that keeps compressed blobs by digest (Docker
with the containerd store) is sent plain.

The codec: zstd (multi-threaded, `-T0`) where this machine has it and the node's
Docker reads it; else pigz, else gzip (any Docker reads gzip). Each layer is compressed
once per codec into a cache on this machine (`<saved images dir>/layers/<diff-id>.<codec>`),
so a second cluster's push of the same pin compresses nothing.

Whether to compress: a send of at most SMALL_BYTES is compressed unmeasured
(`small_send`: its compression costs milliseconds). Above it, `choose` compares the
estimated times, from a measured link rate (the best of two probes, random data sent to
the node for about PROBE_SECONDS each, timed from the first chunk) and a measured
compressor rate and ratio (a sample of the image): plain takes S/link; compressed takes
max(S_uncached/cpu, S/decode, ratio*S/link), since the stages overlap (decode: an assumed
rate of Docker's decompressor, DECODE_BPS). Compression is chosen when it is at least
1/MARGIN faster: on a link faster than the compressor (or than the node's decompressor,
for cached layers), plain goes.

A node that holds none of the image gets it as one stream, `docker save` piped through
the compressor (`savepipe`), which `docker load` decompresses whole. For it the rule
weighs zstd's levels (`levels`, `best_level`): -9 sends about a tenth fewer bytes than -3
at a third of its speed, so it wins only where the link, not the CPU, is the limit. Its
compressor rate is one core's, measured, times the cores the push leaves it
(`sender_cores`): SSH's encryption and `docker save` run beside it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import subprocess
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Literal, Protocol

from provisioner.errors import OperationError
from provisioner.image.savestream import CHUNK, SavedImage, omitted_members, sent_members

Mode = Literal["auto", "always", "never"]
CODECS = ("zstd", "pigz", "zlib")  # preference order on this machine; zlib is built in
SUFFIX = {"zstd": "zst", "pigz": "gz", "zlib": "gz"}  # pigz and zlib write gzip: one entry
LEVEL = {"zstd": 3, "pigz": 1, "zlib": 1}
DENSE_ZSTD = 9  # the level a cold push over a slow link may take instead of zstd's 3
ZLIB_CHUNK = 8 << 20  # zlib: each thread compresses this much into one gzip member
MARGIN = 0.9  # compressed must be estimated at least 10% faster than plain
LEVEL_MARGIN = 0.97  # a slower level must be estimated at least 3% faster
SAMPLE_BYTES = 16 << 20  # of the largest layer, to measure the compressor
PROBE_BYTES = 32 << 20  # at most this much is sent to the node to measure the link
PROBE_SECONDS = 1.0  # ... for at most about this long (each of two probes)
CALIBRATE_BYTES = 8 << 20  # compressed here once, to bound the compressor's rate
MIN_AUTO_BYTES = 256 << 20  # auto leaves smaller sends plain: little to win, a probe to pay
# ... except the smallest: auto compresses a send of at most this many bytes without a probe
# (a project's own code after a one-line change: a layer of kilobytes, where the image's
# config and the tar's headers weigh as much as the change). Python's zlib at level 1
# compresses it in about 50 ms on one core, zstd in less: on no link is that worth a probe.
SMALL_BYTES = 4 << 20
DECODE_BPS = {"gz": 100e6, "zst": 400e6}  # the node's docker load decompressing (assumed)
ZSTD_SINCE = (23, 0)  # Docker 20.10 refuses a zstd layer ("invalid tar header", seen in the lab)
GRAPH_DRIVERS = frozenset(
    {"overlay2", "overlay", "fuse-overlayfs", "btrfs", "zfs", "vfs", "aufs", "devicemapper"}
)


@dataclass(frozen=True)
class Codec:
    name: Literal["zstd", "pigz", "zlib"]
    level: int

    @property
    def family(self) -> str:
        """What the output is (the cache key's codec part): `zst` or `gz`."""
        return SUFFIX[self.name]


def compress_argv(codec: Codec, threads: int = 0) -> list[str]:
    """The local compressor, stdin to stdout, on every core (`threads` 0) or on that many
    (zlib: none, it runs here)."""
    level = f"-{int(codec.level)}"
    if codec.name == "zstd":
        return ["zstd", f"-T{int(threads)}", level, "-q", "-c"]
    if codec.name == "pigz":
        return (
            ["pigz", level, "-c"]
            if threads <= 0
            else ["pigz", "-p", str(int(threads)), level, "-c"]
        )
    return []


def node_reads(engine: str) -> tuple[str, ...]:
    """The codec families a node's `docker load` reads inside a layer, from the facts'
    `engine` line (`VERSION DRIVER`); () when unknown or a containerd image store."""
    words = engine.split()
    if len(words) < 2 or words[1] not in GRAPH_DRIVERS:
        return ()
    try:
        major, minor = (int(p) for p in words[0].split(".")[:2])
    except ValueError:
        return ()
    return ("zst", "gz") if (major, minor) >= ZSTD_SINCE else ("gz",)


def pick_codec(have: Sequence[str], reads: Sequence[str]) -> Codec | None:
    """The first codec of CODECS that this machine has (`have`) and the node reads."""
    for name in CODECS:
        if name in have and SUFFIX[name] in reads:
            return Codec(name, LEVEL[name])  # type: ignore[arg-type]
    return None


def local_codecs() -> tuple[str, ...]:
    """The codecs this machine can run: zlib always (Python's, in threads)."""
    return tuple(n for n in CODECS if n == "zlib" or shutil.which(n))


@dataclass(frozen=True)
class Estimate:
    """What the choice is made from (bytes per second; ratio = compressed / plain)."""

    link_bps: float
    cpu_bps: float
    ratio: float
    send_bytes: int
    uncached_bytes: int
    decode_bps: float = DECODE_BPS["gz"]

    def plain_s(self) -> float:
        return self.send_bytes / max(self.link_bps, 1.0)

    def compressed_s(self) -> float:
        cpu = self.uncached_bytes / max(self.cpu_bps, 1.0)
        decode = self.send_bytes / max(self.decode_bps, 1.0)
        return max(cpu, decode, self.ratio * self.send_bytes / max(self.link_bps, 1.0))


def small_send(total: int) -> str | None:
    """Why auto compresses a send of `total` bytes without measuring anything, or None
    when it is too big for that (the link and the compressor decide: `choose`)."""
    if total > SMALL_BYTES:
        return None
    return f"{total / 1e3:,.0f} kB: compressed unmeasured (milliseconds of CPU, no probe)"


def choose(mode: Mode, est: Estimate | None) -> tuple[bool, str]:
    """Compress or not, and why (one line for the report). `est` None: nothing was
    measured (mode decides, auto sends plain)."""
    if mode == "never":
        return False, "compression off"
    if mode == "always":
        return True, "compression forced"
    if est is None:
        return False, "no estimate: plain"
    c, p = est.compressed_s(), est.plain_s()
    why = (
        f"link {est.link_bps / 1e6:.0f} MB/s, compressor {est.cpu_bps / 1e6:.0f} MB/s, "
        f"ratio {est.ratio:.2f}, {est.uncached_bytes / 1e6:,.0f} MB to compress: "
        f"compressed ~{c:.0f}s vs plain ~{p:.0f}s"
    )
    return c < p * MARGIN, why


@dataclass
class CacheRecord:
    """What one push took from the cache (hits) and compressed now (misses)."""

    hits: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)


class LayerCache:
    """Compressed layers on this machine, by layer diff ID and codec family. Every hit
    and miss is also appended to `record.jsonl` in the cache directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()

    def path(self, diff_id: str, codec: Codec) -> Path:
        return self.directory / f"{diff_id.removeprefix('sha256:')}.{codec.family}"

    def has(self, diff_id: str, codec: Codec) -> bool:
        return self.path(diff_id, codec).is_file()

    def note(self, diff_id: str, codec: Codec, event: str) -> None:
        line = json.dumps(
            {"diff_id": diff_id, "codec": codec.family, "event": event, "at": round(time.time(), 3)}
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock, (self.directory / "record.jsonl").open("a") as f:
            f.write(line + "\n")

    def holds(self, path: Path, diff_id: str, codec: Codec) -> bool:
        """Whether the file `path` decompresses to the layer `diff_id` names (the sha256
        of the uncompressed layer tar)."""
        try:
            return content_digest(path, codec.family) == diff_id
        except (OperationError, OSError):
            return False

    def get(
        self,
        saved: SavedImage,
        member: tarfile.TarInfo,
        diff_id: str,
        codec: Codec,
        record: CacheRecord,
    ) -> Path:
        """The member's data compressed: from the cache, or compressed now into it. A new
        entry is written under a temporary name and put in place only once its content
        is checked against the layer's diff ID, so the cache never holds a wrong layer
        under a right name (one that went bad later is dropped by `drop_bad` once a load
        rejected it)."""
        path = self.path(diff_id, codec)
        if path.is_file():
            record.hits.append(diff_id)
            self.note(diff_id, codec, "hit")
            return path
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
        try:
            _compress_member(saved, member, codec, tmp)
            if not self.holds(tmp, diff_id, codec):
                raise OperationError(
                    f"layer {diff_id[:19]} as read from {saved.path} is not that layer (its "
                    "content does not hash to the diff ID): nothing was cached",
                    "push again: the layer is compressed anew, from the image saved anew "
                    "when the saved file is the corrupt one",
                )
            tmp.rename(path)
        finally:
            tmp.unlink(missing_ok=True)
        record.misses.append(diff_id)
        self.note(diff_id, codec, "miss")
        return path

    def drop_bad(self, diff_ids: Sequence[str], codec: Codec) -> list[str]:
        """Remove the entries of `diff_ids` whose content is not their layer (after a load
        rejected a stream they were in: the next push compresses them anew); the diff IDs
        of those removed."""
        dropped: list[str] = []
        for diff_id in dict.fromkeys(diff_ids):
            path = self.path(diff_id, codec)
            if path.is_file() and not self.holds(path, diff_id, codec):
                path.unlink(missing_ok=True)
                self.note(diff_id, codec, "dropped")
                dropped.append(diff_id)
        return dropped


def content_digest(path: Path, family: str) -> str:
    """`sha256:<hex>` of a compressed file's content (`gz` or `zst`); OperationError when
    it is not a whole stream of that codec."""
    digest = hashlib.sha256()
    for block in decompressed(path, family):
        digest.update(block)
    return "sha256:" + digest.hexdigest()


def decompressed(path: Path, family: str) -> Iterator[bytes]:
    """A compressed file's content, chunk by chunk (at most CHUNK bytes each for gzip,
    however well the data compressed); OperationError when it is not a whole stream."""
    if family == "zst":
        yield from _unzstd(path)
        return
    with path.open("rb") as f:
        member, fed = zlib.decompressobj(31), False  # 31: gzip members, one after another
        try:
            while block := f.read(CHUNK):
                while block:
                    fed = True
                    yield member.decompress(block, CHUNK)
                    block = member.unconsumed_tail
                    if member.eof:
                        block, member, fed = member.unused_data, zlib.decompressobj(31), False
            while fed and not member.eof and (out := member.decompress(b"", CHUNK)):
                yield out
        except zlib.error as exc:
            raise OperationError(
                f"{path} is not gzip data: {exc}",
                "delete it (the push saves and compresses it anew) and push again",
            ) from None
    if fed and not member.eof:
        raise OperationError(
            f"{path} ends inside a gzip member",
            "delete it (the push saves and compresses it anew) and push again",
        )


def _unzstd(path: Path) -> Iterator[bytes]:
    zstd = shutil.which("zstd")
    if zstd is None:
        raise OperationError(
            f"{path} cannot be checked here: no zstd",
            "install zstd on this machine (apt install zstd), or push with --compress never",
        )
    proc = subprocess.Popen(
        [zstd, "-d", "-q", "-c", "--", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    ended = False
    try:
        while block := proc.stdout.read(CHUNK):
            yield block
        ended = True
    finally:
        # read to its end: zstd's exit is waited for (its output ends before it exits);
        # left early (the reader stopped): zstd is ended
        if not ended and proc.poll() is None:
            proc.kill()
        proc.stdout.close()
        code = proc.wait()
    if code != 0:
        raise OperationError(
            f"{path} is not a whole zstd stream (zstd exited {code})",
            "delete it (the push saves and compresses it anew) and push again",
        )


def _compress_member(saved: SavedImage, member: tarfile.TarInfo, codec: Codec, out: Path) -> None:
    with out.open("wb") as sink:
        compress_range(saved.path, member.offset_data, member.size, codec, sink)


def compress_range(path: Path, offset: int, size: int, codec: Codec, sink: IO[bytes]) -> None:
    """`size` bytes of `path` from `offset`, compressed with `codec`, into `sink`."""
    with path.open("rb") as src:
        src.seek(offset)
        compress_file(src, size, codec, sink)


def compress_file(
    src: IO[bytes], size: int, codec: Codec, sink: IO[bytes], threads: int = 0
) -> None:
    """The next `size` bytes of `src`, compressed with `codec`, into `sink`, on every core
    (`threads` 0) or on that many."""
    if codec.name == "zlib":
        _zlib_threads(src, size, codec.level, sink, threads)
        return
    try:
        sink.fileno()
    except (AttributeError, io.UnsupportedOperation):  # in memory (a sample): no pipe to it
        done = subprocess.run(
            compress_argv(codec, threads), input=src.read(size), capture_output=True
        )
        if done.returncode != 0:
            raise OperationError(
                f"compressing with {codec.name} failed: {done.stderr.decode()[-300:]}",
                "check this machine's disk space and the compressor, or push with --compress never",
            ) from None
        sink.write(done.stdout)
        return
    proc = subprocess.Popen(
        compress_argv(codec, threads), stdin=subprocess.PIPE, stdout=sink, stderr=subprocess.PIPE
    )
    assert proc.stdin is not None and proc.stderr is not None
    left = size
    try:
        while left > 0 and (block := src.read(min(CHUNK, left))):
            left -= len(block)
            proc.stdin.write(block)
    except BrokenPipeError:
        pass
    finally:
        proc.stdin.close()
    err = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0 or left:
        raise OperationError(
            f"compressing a layer with {codec.name} failed: {err.strip()[-300:]}",
            "push with --compress never, or free disk under the state directory",
        )


def _gzip_member(data: bytes, level: int) -> bytes:
    z = zlib.compressobj(level, zlib.DEFLATED, 31)  # 31: a gzip header and trailer
    return z.compress(data) + z.flush()


def _zlib_threads(src: IO[bytes], size: int, level: int, sink: IO[bytes], threads: int = 0) -> None:
    """The next `size` bytes of `src` as gzip (`stream_zlib`); the source ending early
    is an error."""
    if stream_zlib(src, level, sink, size, threads) < size:
        raise OperationError(
            "the saved image ends early",
            "delete the saved image (the push saves it anew) and push again",
        )


class Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def stream_zlib(
    src: Readable, level: int, sink: IO[bytes], size: int | None = None, threads: int = 0
) -> int:
    """gzip on every core without pigz: `src` (its next `size` bytes, or up to its end)
    in ZLIB_CHUNK pieces, each compressed by its own thread (zlib lets go of the GIL)
    into one gzip member, written in order; returns the bytes read. Concatenated members
    are one valid gzip stream (RFC 1952), read whole by Go's gzip reader and by unpigz,
    which `docker load` uses. `threads` 0: one per core."""
    threads = threads if threads > 0 else max(1, os.cpu_count() or 1)
    left = size
    done = 0
    ended = False
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="zlib") as pool:
        pending: list[Future[bytes]] = []
        while not ended or pending:
            while not ended and len(pending) < 2 * threads:
                want = ZLIB_CHUNK if left is None else min(ZLIB_CHUNK, left)
                block = _read_full(src, want) if want > 0 else b""
                if not block:
                    ended = True
                    break
                done += len(block)
                if left is not None:
                    left -= len(block)
                pending.append(pool.submit(_gzip_member, block, level))
            if pending:
                sink.write(pending.pop(0).result())
    return done


def _read_full(src: Readable, n: int) -> bytes:
    """Up to `n` bytes of `src`, fewer only at its end (a pipe returns what it has)."""
    parts: list[bytes] = []
    while n > 0 and (block := src.read(n)):
        parts.append(block)
        n -= len(block)
    return b"".join(parts)


def layer_ids(saved: SavedImage, diff_ids: Sequence[str]) -> dict[str, str]:
    """Member name (as in the saved file) -> the layer's diff ID, for regular layer files."""
    by_file = dict(zip(saved.layer_files, diff_ids, strict=False))
    return {
        m.name: by_file[_norm(m.name)]
        for m in saved.members
        if m.isfile() and _norm(m.name) in by_file
    }


def _norm(name: str) -> str:
    return name.removeprefix("./")


def sample_rate(saved: SavedImage, member: tarfile.TarInfo, codec: Codec) -> tuple[float, float]:
    """(bytes per second, ratio) of the codec on the first SAMPLE_BYTES of a member."""
    size = min(SAMPLE_BYTES, member.size)
    if size <= 0:
        return 1.0, 1.0
    sink = io.BytesIO()
    t0 = time.monotonic()
    compress_range(saved.path, member.offset_data, size, codec, sink)
    dt = max(time.monotonic() - t0, 1e-6)
    return size / dt, len(sink.getvalue()) / size


_CALIBRATED: dict[Codec, float] = {}


def calibrate(codec: Codec) -> float:
    """The compressor's rate here, bytes per second, on CALIBRATE_BYTES of fixed
    pseudo-random text (once per process): a cheap bound before any image is read."""
    if codec not in _CALIBRATED:
        data = random.Random(0).randbytes(CALIBRATE_BYTES)
        data = data.translate(bytes(b"abcdefghijklmnop"[i % 16] for i in range(256)))
        t0 = time.monotonic()
        compress_file(io.BytesIO(data), len(data), codec, io.BytesIO())
        _CALIBRATED[codec] = len(data) / max(time.monotonic() - t0, 1e-6)
    return _CALIBRATED[codec]


def measure(data: bytes, codec: Codec, threads: int = 0) -> tuple[float, float]:
    """(bytes per second, ratio) of the codec on `data` ((1, 1) for no data), on every
    core (`threads` 0) or on that many."""
    if not data:
        return 1.0, 1.0
    sink = io.BytesIO()
    t0 = time.monotonic()
    compress_file(io.BytesIO(data), len(data), codec, sink, threads)
    dt = max(time.monotonic() - t0, 1e-6)
    return len(data) / dt, len(sink.getvalue()) / len(data)


def sender_cores(cores: int | None = None) -> int:
    """The cores a cold push leaves its compressor: SSH's encryption and `docker save`
    take one of their own while it runs (one core: that one, shared)."""
    n = cores if cores is not None else (os.cpu_count() or 1)
    return max(1, n - 1)


def levels(codec: Codec) -> tuple[Codec, ...]:
    """The levels a cold push weighs for a codec: zstd's fast default and a denser one
    for slow links (zstd -9 is about a third of -3's speed for a tenth fewer bytes)."""
    if codec.name == "zstd":
        return (codec, Codec("zstd", DENSE_ZSTD))
    return (codec,)


def best_level(
    data: bytes, codec: Codec, link_bps: float, total: int, cores: int
) -> tuple[Codec, Estimate]:
    """Of `levels(codec)`, the one with the shortest estimated compressed push of
    `total` bytes over a link of `link_bps`, each measured on `data` on one core and
    counted at `cores` times that (a sample too small to keep several threads busy would
    otherwise read as one core's rate); a slower level must win by LEVEL_MARGIN."""
    best: tuple[Codec, Estimate] | None = None
    for level in levels(codec):
        rate, ratio = measure(data, level, threads=1)
        est = Estimate(link_bps, rate * cores, ratio, total, total, DECODE_BPS[level.family])
        if best is None or est.compressed_s() < best[1].compressed_s() * LEVEL_MARGIN:
            best = (level, est)
    assert best is not None
    return best


def compressed_stream(
    saved: SavedImage,
    diff_ids: Sequence[str],
    omit_first: int,
    codec: Codec,
    cache: LayerCache,
    record: CacheRecord,
    on_omitted: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The saved tar without its first `omit_first` layers (as savestream.partial: the
    members `sent_members` names), every layer file replaced by its compressed bytes
    under the same name. Layers are compressed in the background, in stream order, while
    earlier ones are sent."""
    omit = omitted_members(saved, omit_first)
    ids = layer_ids(saved, diff_ids)
    sent = sent_members(saved, omit_first)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compress")
    jobs: dict[str, Future[Path]] = {
        m.name: pool.submit(cache.get, saved, m, ids[m.name], codec, record)
        for m in sent
        if m.name in ids
    }
    try:
        if on_omitted is not None:
            for m in saved.members:
                if m.isfile() and _norm(m.name) in omit:
                    on_omitted(m.size)
        with saved.path.open("rb") as f:
            for member in sent:
                if member.name in jobs:
                    yield from _member_from(member, jobs[member.name].result())
                    continue
                end = member.offset_data + (member.size if member.isfile() else 0)
                end += -end % tarfile.BLOCKSIZE
                f.seek(member.offset)
                remaining = end - member.offset
                while remaining > 0:
                    block = f.read(min(CHUNK, remaining))
                    if not block:
                        raise OperationError(
                            f"{saved.path} ends early",
                            "delete it (the push saves and compresses it anew) and push again",
                        )
                    remaining -= len(block)
                    yield block
        yield b"\0" * (2 * tarfile.BLOCKSIZE)
    finally:
        for job in jobs.values():
            job.cancel()
        pool.shutdown(wait=True)


def _member_from(member: tarfile.TarInfo, data: Path) -> Iterator[bytes]:
    info = tarfile.TarInfo(member.name)
    info.size = data.stat().st_size
    info.mode, info.mtime, info.uid, info.gid = member.mode, member.mtime, member.uid, member.gid
    info.uname, info.gname = member.uname, member.gname
    yield info.tobuf(tarfile.PAX_FORMAT)
    with data.open("rb") as f:
        while block := f.read(CHUNK):
            yield block
    if info.size % tarfile.BLOCKSIZE:
        yield b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
