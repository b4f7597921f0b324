"""How a job's results travel home: a tar.gz, base64, in marked lines of the job's own log.

The job's driver runs on the head; its files stay there. The Jobs API, which `submit`
already reaches through the tunnel with the token, serves the job's log and nothing
else. So after the playbook exits, the job's entrypoint runs `python -m
provisioner_results pack DIR`, which prints DIR as marked lines; the client finds them
in the log, checks the digest and unpacks them with provisioner.remote.receive (never
`tarfile.extractall`: the job controls these bytes). No second channel, no SSH into the head's
container, no knowledge of where Ray keeps working directories.

This package is uploaded with the job (runtime_env py_modules), so it uses the standard
library only and never imports `provisioner`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

BEGIN = "PROVISIONER-RESULTS-BEGIN"
DATA = "PROVISIONER-RESULTS-DATA"
END = "PROVISIONER-RESULTS-END"
MARK = "PROVISIONER-RESULTS"
LINE_CHARS = 4096
# The job log is held by Ray's dashboard and read whole by the client: keep it bounded.
MAX_BYTES = 64 * 1024 * 1024


class ResultsError(Exception):
    """The results in a log are absent, cut short or corrupt."""


def is_marked(line: str) -> bool:
    """True for the lines that carry results (the stream hides them)."""
    return line.startswith(MARK)


def split_lines(text: str) -> list[str]:
    """Lines split on newline only: a carriage return or a record separator inside a
    line (which `str.splitlines` would split on) can never start a results line."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def archive(directory: Path, skipped: list[str] | None = None) -> bytes:
    """`directory`'s regular files and directories as a tar.gz (paths relative to it);
    anything else (a symbolic link, a FIFO) stays behind, named in `skipped`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            name = str(path.relative_to(directory))
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                if skipped is not None:
                    skipped.append(name)
                continue
            tar.add(path, arcname=name, recursive=False)
    return buffer.getvalue()


def pack(directory: Path, skipped: list[str] | None = None) -> Iterator[str]:
    """The marked lines that carry `directory` (no trailing newlines)."""
    data = archive(directory, skipped)
    if len(data) > MAX_BYTES:
        raise ResultsError(
            f"results in {directory} are {len(data)} bytes compressed, over {MAX_BYTES}"
        )
    text = base64.b64encode(data).decode("ascii")
    yield f"{BEGIN} {len(data)} {hashlib.sha256(data).hexdigest()}"
    for start in range(0, len(text), LINE_CHARS):
        yield f"{DATA} {text[start : start + LINE_CHARS]}"
    yield END


def unpack(lines: Iterable[str]) -> bytes:
    """The tar.gz carried by the one BEGIN..END block among `lines`.

    Exactly one block is accepted: a second BEGIN (a block printed by the playbook, or
    by anything else writing to the job's output) refuses them all, since nothing tells
    the real one apart. The size is bounded by MAX_BYTES; the digest only catches a
    block cut or garbled on the way, it proves nothing about who wrote it.
    """
    header: list[str] | None = None
    chunks: list[str] = []
    blocks = 0
    chars = 0
    ended = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.startswith(BEGIN):
            blocks += 1
            if blocks > 1:
                raise ResultsError(
                    "the job log carries more than one results block (one was printed by "
                    "something other than the results shipment); none was taken"
                )
            header, chunks, ended = line.split()[1:], [], False
        elif line.startswith(DATA) and header is not None and not ended:
            chunk = line[len(DATA) + 1 :]
            chars += len(chunk)
            if chars > _MAX_CHARS:
                raise ResultsError(f"the results in the job log are over {MAX_BYTES} bytes")
            chunks.append(chunk)
        elif line == END and header is not None:
            ended = True
    if header is None:
        raise ResultsError("the job log carries no results")
    if not ended:
        raise ResultsError("the results in the job log are cut short (no end mark)")
    return _checked(header, "".join(chunks))


_MAX_CHARS = (MAX_BYTES + 2) // 3 * 4


def _checked(header: list[str], text: str) -> bytes:
    if len(header) != 2 or not header[0].isdigit() or len(header[1]) != 64:
        raise ResultsError(f"bad results header: {' '.join(header)[:200]!r}")
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ResultsError("the results in the job log are not valid base64") from None
    size, digest = int(header[0]), header[1]
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ResultsError("the results in the job log do not match their digest")
    return data
