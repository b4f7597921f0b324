"""The wheelhouse: a directory of wheel files from which the image is built offline.

The build never reaches a package index: it installs only the wheels named, with their
hashes, in requirements.lock. This module makes sure the wheelhouse holds each of them,
downloading only the missing ones with pip (`--require-hashes`), unless told to stay
offline, as an air-gapped machine must (then bring the directory on a disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError
from provisioner.image.lock import (
    PYTHON_VERSION,
    LockedWheel,
    pip_download_args,
    run_pip_with_indexes,
    wheels_in,
)


def match(
    locked: Sequence[LockedWheel], present: Sequence[LockedWheel]
) -> tuple[dict[str, Path], list[LockedWheel]]:
    """Pure: which locked wheels the wheelhouse holds (by hash) and which it lacks."""
    by_hash = {w.sha256: w for w in present}
    found: dict[str, Path] = {}
    missing: list[LockedWheel] = []
    for w in locked:
        hit = by_hash.get(w.sha256)
        if hit is None:
            missing.append(w)
        else:
            found[w.sha256] = Path(hit.filename)
    return found, missing


def ensure_wheels(
    locked: Sequence[LockedWheel],
    wheelhouse: Path,
    *,
    offline: bool = False,
    indexes: Sequence[str] = (),
    report: Reporter = quiet,
    python_version: str = PYTHON_VERSION,
) -> list[Path]:
    """The wheel file of every locked package, downloading the missing ones (unless offline):
    from pip's own configuration, then from the `indexes` the lock names; wheels for
    CPython `python_version`."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    _, missing = match(locked, wheels_in(wheelhouse))
    if missing and offline:
        names = ", ".join(f"{w.name}=={w.version}" for w in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise InputError(
            f"the wheelhouse lacks {len(missing)} locked wheel(s): {names}{more}",
            "run `provisioner image build` without --offline on a machine that reaches "
            "a package index, then carry the wheelhouse directory here",
            where=str(wheelhouse),
        )
    if missing:
        run_pip_with_indexes(
            [*pip_download_args(wheelhouse, python_version), "--no-deps", "--require-hashes"],
            "\n".join(w.requirement() for w in missing) + "\n",
            indexes,
            report,
            f"downloading {len(missing)} wheel(s) into {wheelhouse}",
        )
    present = wheels_in(wheelhouse)
    found, missing = match(locked, present)
    if missing:
        raise InputError(
            f"pip did not bring {', '.join(w.name for w in missing)} into the wheelhouse",
            "check the package index with `pip download` by hand",
            where=str(wheelhouse),
        )
    return [wheelhouse / found[w.sha256] for w in locked]
