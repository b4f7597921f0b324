"""Read what a playbook writes (metrics.csv, scaling.csv, summary.json), bounded.

These files come from a job, so a read never takes more than a cap: a CSV is read row by
row and stops after `MAX_ROWS` rows or `MAX_TABLE_BYTES`, a JSON file over
`MAX_JSON_BYTES` is refused (ValueError naming the file and the cap), and a link is
never followed (O_NOFOLLOW).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path
from typing import Any

MAX_TABLE_BYTES = 64 * 1024 * 1024  # the most of one CSV read (its first rows)
MAX_ROWS = 1_000_000
MAX_JSON_BYTES = 16 * 1024 * 1024
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


def read_bytes(path: Path, limit: int) -> tuple[bytes, bool]:
    """At most `limit` bytes of `path` (never through a link), and whether there was more."""
    fd = os.open(path, _FLAGS)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit], len(data) > limit


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in `path`; ValueError when it is over `limit` bytes or not JSON."""
    data, more = read_bytes(path, limit)
    if more:
        raise ValueError(f"{path.name} is over {limit} bytes; not read")
    return json.loads(data.decode("utf-8"))


def read_rows(
    path: Path, *, limit: int = MAX_TABLE_BYTES, max_rows: int = MAX_ROWS
) -> list[dict[str, float]]:
    """A CSV of numbers as dicts; a cell that is not a number becomes NaN. At most
    `limit` bytes and `max_rows` rows are read (a cut last line is dropped)."""
    data, more = read_bytes(path, limit)
    if more:
        data = data[: data.rfind(b"\n") + 1]
    text = io.StringIO(data.decode("utf-8", "replace"), newline="")
    rows: list[dict[str, float]] = []
    for row in csv.DictReader(text):
        if len(rows) >= max_rows:
            break
        rows.append({key: _number(value) for key, value in row.items()})
    return rows


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except (ValueError, TypeError):
        return math.nan


def column(rows: list[dict[str, float]], name: str) -> list[float]:
    """One column of `rows` (NaN where a row lacks it)."""
    return [row.get(name, math.nan) for row in rows]
