"""A cold compressed push: `docker save` piped through the compressor straight into the
node's `docker load`, with nothing written here first.

Why a whole compressed stream, not the saved file's layers compressed one by one
(`compress.compressed_stream`): a node that holds none of the pin needs every byte, and
a layer compressed on its own must be compressed whole before its tar header (which
names its size) can be sent, so the biggest layer would be compressed while the link
idles, after `docker save` had written the whole image to disk. Here `docker save`, the
compressor, the link and the node's `docker load` all run at once; the push takes about
as long as its slowest stage.

What the node decompresses with: `docker load` itself. It reads its input through
moby's `archive.DecompressStream`, which tells gzip, bzip2, xz and zstd apart by their
magic bytes (zstd there from Docker 23, moby#41759; `compress.node_reads` says which a
node reads), so the node command stays a plain `docker load` and the image ID it prints
is checked as for a plain push.

The compressed stream is also kept on this machine (`<saved images>/<pin id>.tar.<zst|gz>`,
written beside the stream and renamed into place only once the node loaded it), so the
next cluster's cold push of the same pin neither saves nor compresses: it sends that
file. One stream file is kept per codec family; a new pin replaces the old pin's files.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from provisioner.errors import OperationError
from provisioner.image.compress import SAMPLE_BYTES, Codec, compress_argv, stream_zlib
from provisioner.image.savestream import CHUNK
from provisioner.local import need

HEAD_MAX = 256 << 20  # what a sample may read ahead of the push and keep for it


def stream_path(directory: Path, image_id: str, family: str) -> Path:
    """Where the compressed stream of `image_id` is kept (family: `zst` or `gz`)."""
    return directory / f"{image_id.removeprefix('sha256:')}.tar.{family}"


def cached_stream(directory: Path, image_id: str, family: str) -> Path | None:
    """The kept compressed stream of `image_id` in `family`, if there is one."""
    path = stream_path(directory, image_id, family)
    return path if path.is_file() and path.stat().st_size > 0 else None


def kept_any(directory: Path, image_id: str) -> bool:
    """Whether a compressed stream of `image_id` is kept here, in any family."""
    return any(cached_stream(directory, image_id, family) for family in ("zst", "gz"))


def from_file(path: Path) -> Iterator[bytes]:
    """A kept stream, chunk by chunk."""
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            yield block


def save_argv(image_id: str) -> list[str]:
    return [need("docker", "docker.io"), "save", image_id]


class _TooMuch(Exception):
    pass


class _Recorder:
    """A file over `docker save`'s stdout that keeps every byte read through it."""

    def __init__(self, raw: IO[bytes], kept: list[bytes], limit: int) -> None:
        self.raw, self.kept, self.limit, self.size = raw, kept, limit, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.size += len(data)
        if self.size > self.limit:
            raise _TooMuch
        self.kept.append(data)
        return data


class SaveSource:
    """`docker save IMAGE`, started at most once for a cold push: a sample of its first
    big layer for the rule (`sample`), then the whole stream from its first byte
    (`chunks`: the bytes the sample read, kept, then the rest). `docker save` prepares
    the whole image before its first byte (about 13 s for the 1.9 GB pin here), so the
    rule's sample costs no second save. Its process ends with `close()`."""

    def __init__(self, image_id: str) -> None:
        self.image_id = image_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.head: list[bytes] = []
        self.replayable = True

    def start(self) -> subprocess.Popen[bytes]:
        """Start `docker save` (once; again only after a sample that could not be kept)."""
        if self.proc is None or not self.replayable:
            self.close()
            self.head, self.replayable = [], True
            self.proc = subprocess.Popen(
                save_argv(self.image_id),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=CHUNK,
            )
        return self.proc

    def sample(self, nbytes: int = SAMPLE_BYTES, limit: int = HEAD_MAX) -> bytes:
        """Up to `nbytes` of the first layer file of at least 1 MB (b"" when none comes
        within `limit` bytes of the stream: then `chunks` saves again)."""
        proc = self.start()
        assert proc.stdout is not None
        rec = _Recorder(proc.stdout, self.head, limit)
        try:
            with tarfile.open(fileobj=rec, mode="r|") as tar:  # type: ignore[call-overload]
                for member in tar:
                    if member.isfile() and member.size >= 1 << 20:
                        f = tar.extractfile(member)
                        return f.read(min(nbytes, member.size)) if f is not None else b""
        except (tarfile.TarError, OSError, _TooMuch):
            self.replayable = False
        return b""

    def chunks(self) -> Iterator[bytes]:
        """The whole `docker save` stream; raises OperationError when it failed."""
        proc = self.start()
        assert proc.stdout is not None
        head, self.head = self.head, []
        yield from head
        while block := proc.stdout.read(CHUNK):
            yield block
        rc = proc.wait()
        if rc != 0:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise OperationError(
                f"docker save of {self.image_id[:19]} failed (exit {rc}): {err.strip()[-300:]}",
                "check the local Docker engine (`docker image inspect` the pinned ID)",
            )

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        proc.wait()


def sample_save(image_id: str) -> bytes:
    """`SaveSource.sample` of a `docker save` that is then stopped: the rule's sample
    for a push whose stream is not that save (a partial one, the chain's)."""
    with contextlib.closing(SaveSource(image_id)) as source:
        return source.sample()


class SavePipe:
    """`docker save IMAGE | COMPRESSOR` (the save from a `SaveSource`, which may have
    been sampled already), read chunk by chunk, each chunk also written to the kept
    stream's partial file; `keep()` (after the node loaded it) puts the file in place.
    The compressor ends with `close()`, even when the stream is abandoned."""

    def __init__(self, source: SaveSource, codec: Codec, directory: Path) -> None:
        self.source, self.codec, self.directory = source, codec, directory
        self.path = stream_path(directory, source.image_id, codec.family)
        self.partial = self.path.with_name(
            f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.partial"
        )
        self.complete = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._errors: list[str] = []

    def _feed(self, sink: IO[bytes]) -> None:
        """The save stream into the compressor (a thread of its own)."""
        try:
            with sink:
                if self.codec.name == "zlib":
                    stream_zlib(_Chunks(self.source.chunks()), self.codec.level, sink)
                else:
                    for block in self.source.chunks():
                        sink.write(block)
        except BrokenPipeError:
            self._errors.append(f"{self.codec.name} stopped reading")
        except (OSError, OperationError) as exc:
            self._errors.append(str(exc))

    def _start(self) -> IO[bytes]:
        argv = compress_argv(self.codec)
        if argv:
            self._proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            assert self._proc.stdin is not None and self._proc.stdout is not None
            sink, out = self._proc.stdin, self._proc.stdout
        else:  # no compressor program here: zlib in threads, into a pipe read below
            read_fd, write_fd = os.pipe()
            sink, out = os.fdopen(write_fd, "wb"), os.fdopen(read_fd, "rb")
        self._thread = threading.Thread(target=self._feed, args=(sink,), daemon=True)
        self._thread.start()
        return out

    def chunks(self) -> Iterator[bytes]:
        """The compressed stream; raises OperationError when `docker save` or the
        compressor failed (so the node's `docker load` sees a truncated stream)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        out = self._start()
        with out, self.partial.open("wb") as keep:
            while block := out.read(CHUNK):
                keep.write(block)
                yield block
        if self._thread is not None:
            self._thread.join()
        if self._proc is not None and self._proc.wait() != 0:
            err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
            self._errors.append(f"{self.codec.name} exited {self._proc.returncode}: {err[-200:]}")
        if self._errors:
            raise OperationError(
                f"docker save | {self.codec.name} of {self.source.image_id[:19]} failed: "
                + "; ".join(self._errors),
                "check the local Docker engine (`docker image inspect` the pinned ID) and "
                "free disk under " + str(self.directory),
            )
        self.complete = True

    def keep(self) -> Path | None:
        """After the node loaded the stream: keep it for the next push (the other pins'
        kept streams of this family go), or None when it did not run to its end."""
        if not self.complete:
            return None
        for old in self.directory.glob(f"*.tar.{self.codec.family}"):
            if old != self.path:
                old.unlink(missing_ok=True)
        self.partial.rename(self.path)
        return self.path

    def close(self) -> None:
        self.source.close()  # the feeding thread then sees its stream end
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            for f in (proc.stdin, proc.stdout, proc.stderr):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()
            proc.wait()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.partial.unlink(missing_ok=True)


class _Chunks:
    """An iterator of chunks as a file with `read(n)` (for the zlib compressor)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks, self.buf = chunks, b""

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self.buf) < n) and (block := next(self.chunks, b"")):
            self.buf += block
        out, self.buf = (self.buf, b"") if n < 0 else (self.buf[:n], self.buf[n:])
        return out
