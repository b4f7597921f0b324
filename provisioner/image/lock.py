"""The requirements lock: every package of the image, its exact version and wheel hash.

`images/requirements.in` names what the image needs; `images/requirements.lock` is made
from it by pip's own resolver (`pip download` of linux x86_64 CPython 3.11 wheels) and
lists each wheel as `name==version --hash=sha256:...`, the format that
`pip install --require-hashes` reads. Two builds from the same lock install the same
bytes, on any day.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError

# The image's platform: pip resolves for it whatever machine makes the lock.
PYTHON_VERSION = "3.11"
# Debian bookworm's glibc is 2.36: every manylinux_2_N up to it (NVIDIA's CUDA wheels are
# tagged manylinux_2_27, for one), and the legacy aliases.
PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in range(36, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)
# A requirements-file option naming a package index (pip's own syntax): the lock carries
# it so that a machine whose pip knows no such index resolves the lock's wheels all the same.
_INDEX = re.compile(r"^(?:--index-url|--extra-index-url|-i)(?:\s+|=)(?P<url>\S+)$")
_LINE = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)\s+--hash=sha256:(?P<sha>[0-9a-f]{64})$"
)


@dataclass(frozen=True, order=True)
class LockedWheel:
    """One line of the lock: a distribution, its exact version, its wheel's sha256."""

    name: str
    version: str
    sha256: str
    filename: str = ""

    def requirement(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def lock_sha256(text: str) -> str:
    """The requirements hash the pin records: sha256 of the lock's requirement lines."""
    lines = [w.requirement() for w in parse_lock(text, "requirements.lock")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def index_urls(text: str) -> list[str]:
    """Pure: the package indexes a requirements file names (`--extra-index-url URL` lines,
    `--index-url` and `-i` too), in order."""
    urls: list[str] = []
    for raw in text.replace("\\\n", " ").splitlines():
        m = _INDEX.fullmatch(" ".join(raw.split("#", 1)[0].split()))
        if m is not None and m["url"] not in urls:
            urls.append(m["url"])
    return urls


def without_indexes(text: str) -> str:
    """Pure: a requirements file's text without its index lines: what pip reads first (its
    own configuration only), and the lock as the image's build context holds it."""
    kept = [
        line
        for line in text.splitlines(keepends=True)
        if _INDEX.fullmatch(" ".join(line.split("#", 1)[0].split())) is None
    ]
    return "".join(kept)


def format_lock(wheels: Iterable[LockedWheel], source: str, indexes: Sequence[str] = ()) -> str:
    """The lock file's text, sorted by name, with a header naming its source and the
    package indexes its wheels may come from (besides pip's own configuration)."""
    out = [
        f"# The exact Python packages of the cluster image, made from {source} by",
        "# `provisioner image lock` (pip's resolver; linux x86_64, CPython 3.11).",
        "# Do not edit: change requirements.in and run the command again.",
    ]
    out += [f"--extra-index-url {url}" for url in indexes]
    for w in sorted(wheels, key=lambda w: (canonicalize_name(w.name), w.version)):
        out.append(f"{w.name}=={w.version} \\\n    --hash=sha256:{w.sha256}")
    return "\n".join(out) + "\n"


def parse_lock(text: str, where: str) -> list[LockedWheel]:
    """Parse a lock; every requirement must be `name==version --hash=sha256:HEX`."""
    wheels: list[LockedWheel] = []
    logical = text.replace("\\\n", " ")
    for number, raw in enumerate(logical.splitlines(), start=1):
        line = " ".join(raw.split("#", 1)[0].split())
        if not line or _INDEX.fullmatch(line):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise InputError(
                f"line {number}: {line!r} is not `name==version --hash=sha256:HEX`",
                "run `provisioner image lock` to make the lock again from requirements.in",
                where=where,
            )
        wheels.append(LockedWheel(m["name"], m["version"], m["sha"]))
    if not wheels:
        raise InputError("the lock lists no packages", "run `provisioner image lock`", where=where)
    names = [canonicalize_name(w.name) for w in wheels]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(
            f"the lock lists {', '.join(dupes)} more than once",
            "run `provisioner image lock` to make the lock again",
            where=where,
        )
    return wheels


def wheels_in(directory: Path) -> list[LockedWheel]:
    """Every wheel file in a directory, with its name, version and sha256."""
    found: list[LockedWheel] = []
    for path in sorted(directory.glob("*.whl")):
        try:
            name, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        found.append(LockedWheel(str(name), str(version), file_sha256(path), path.name))
    return found


def pip_download_args(dest: Path, python_version: str = PYTHON_VERSION) -> list[str]:
    """`pip download` for the image's platform (binary wheels only), into `dest`; for
    another CPython release with `python_version` (the lab's host-mode nodes of Debian 13)."""
    args = [sys.executable, "-m", "pip", "download", "--dest", str(dest), "--only-binary=:all:"]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return [*args, "--python-version", python_version, "--implementation", "cp"]


def run_pip(args: Sequence[str], report: Reporter, what: str) -> None:
    report(what)
    proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise OperationError(
            f"{what} failed: {tail}",
            "check that this machine reaches its Python package index (pip config list), "
            "or bring a wheelhouse made elsewhere and pass --wheelhouse",
        )


def run_pip_with_indexes(
    args: Sequence[str], requirements: str, indexes: Sequence[str], report: Reporter, what: str
) -> None:
    """pip on `requirements` (text), first with pip's own configuration alone (a local
    mirror or wheel folder serves everything there, and no other index is asked); when
    that fails and the requirements name indexes, once more with them as extra indexes
    (a stock machine: PyPI has no CPU build of torch, PyTorch's CPU index has it)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="requirements-") as req:
        req.write(without_indexes(requirements))
        req.flush()
        try:
            run_pip([*args, "-r", req.name], report, what)
        except OperationError:
            if not indexes:
                raise
            extra = [a for url in indexes for a in ("--extra-index-url", url)]
            run_pip([*args, *extra, "-r", req.name], report, f"{what}, with {', '.join(indexes)}")


def report_args(report_path: Path) -> list[str]:
    """pip's resolver for the image's platform, without downloading: `pip install --dry-run
    --report` names each wheel with its URL and the index's sha256."""
    args = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"]
    args += ["--only-binary=:all:", "--target", str(report_path.parent / "target")]
    for platform in PLATFORMS:
        args += ["--platform", platform]
    return [
        *args,
        "--python-version",
        PYTHON_VERSION,
        "--implementation",
        "cp",
        "--report",
        str(report_path),
    ]


def wheels_in_report(data: dict[str, Any]) -> list[LockedWheel]:
    """Pure: the wheels of a pip installation report, with the sha256 the index gave."""
    found: list[LockedWheel] = []
    for item in data.get("install", []):
        info = item.get("download_info") or {}
        url = str(info.get("url", ""))
        digest = str(((info.get("archive_info") or {}).get("hashes") or {}).get("sha256", ""))
        # an index may percent-encode the name (PyTorch's: `torch-2.13.0%2Bcpu-...`)
        filename = unquote(url.rsplit("/", 1)[-1].split("#", 1)[0])
        if not digest or not filename.endswith(".whl"):
            raise OperationError(
                f"pip's report gives no wheel with a sha256 for {filename or item}",
                "resolve with downloads instead (`provisioner image lock` without --no-download)",
            )
        name, version, _, _ = parse_wheel_filename(filename)
        found.append(LockedWheel(str(name), str(version), digest, filename))
    return found


def _require_file(requirements_in: Path) -> None:
    if not requirements_in.is_file():
        raise InputError(
            "no such requirements file",
            "run from the repository root or pass --images-dir",
            where=str(requirements_in),
        )


def resolve_without_download(requirements_in: Path, report: Reporter = quiet) -> list[LockedWheel]:
    """Resolve requirements.in with pip's resolver, downloading no wheel (the build later
    fetches each by its hash): for images of gigabytes, such as the CUDA one."""
    _require_file(requirements_in)
    with tempfile.TemporaryDirectory(prefix="provisioner-lock-") as tmp:
        path = Path(tmp, "report.json")
        text = requirements_in.read_text()
        run_pip_with_indexes(
            report_args(path),
            text,
            index_urls(text),
            report,
            f"resolving {requirements_in.name} with pip (no download)",
        )
        return wheels_in_report(json.loads(path.read_text()))


def resolve(requirements_in: Path, wheelhouse: Path, report: Reporter = quiet) -> list[LockedWheel]:
    """Resolve requirements.in with pip in a fresh directory; keep the wheels in the
    wheelhouse (so the next build needs no download) and return them."""
    _require_file(requirements_in)
    with tempfile.TemporaryDirectory(prefix="provisioner-lock-") as tmp:
        text = requirements_in.read_text()
        run_pip_with_indexes(
            pip_download_args(Path(tmp)),
            text,
            index_urls(text),
            report,
            f"resolving {requirements_in.name} with pip",
        )
        wheels = wheels_in(Path(tmp))
        wheelhouse.mkdir(parents=True, exist_ok=True)
        for w in wheels:
            shutil.move(Path(tmp, w.filename), wheelhouse / w.filename)
        return wheels
