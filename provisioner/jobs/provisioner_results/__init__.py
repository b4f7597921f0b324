"""How a job's results travel home: a tar.gz, base64, in marked lines of the job's own log.

The job's driver runs on the head; its files stay there. The Jobs API, which `submit`
already reaches through the tunnel with the token, serves the job's log and nothing
else. So after the playbook exits, the job's entrypoint runs `python -m
provisioner_results pack DIR`, which prints DIR as marked lines; the client finds them
in the log, checks the digest and unpacks. No second channel, no SSH into the head's
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


def archive(directory: Path) -> bytes:
    """`directory`'s content as a tar.gz (paths relative to it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def pack(directory: Path) -> Iterator[str]:
    """The marked lines that carry `directory` (no trailing newlines)."""
    data = archive(directory)
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
    """The tar.gz carried by the last complete BEGIN..END block among `lines`."""
    found: bytes | None = None
    header: list[str] | None = None
    chunks: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        if line.startswith(BEGIN + " "):
            header, chunks = line.split()[1:], []
        elif line.startswith(DATA + " ") and header is not None:
            chunks.append(line[len(DATA) + 1 :])
        elif line == END and header is not None:
            found = _checked(header, "".join(chunks))
            header = None
    if header is not None and found is None:
        raise ResultsError("the results in the job log are cut short (no end mark)")
    if found is None:
        raise ResultsError("the job log carries no results")
    return found


def _checked(header: list[str], text: str) -> bytes:
    if len(header) != 2:
        raise ResultsError(f"bad results header: {' '.join(header)!r}")
    data = base64.b64decode(text.encode("ascii"), validate=True)
    size, digest = int(header[0]), header[1]
    if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
        raise ResultsError("the results in the job log do not match their digest")
    return data


def extract(data: bytes, destination: Path) -> list[Path]:
    """Unpack a tar.gz into `destination`, refusing paths that leave it."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        tar.extractall(destination, filter="data")
        names = [m.name for m in tar.getmembers() if m.isfile()]
    return [destination / name for name in names]
