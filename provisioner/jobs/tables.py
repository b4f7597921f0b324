"""Read the tables a playbook writes (metrics.csv, scaling.csv) into typed rows."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, float]]:
    """A CSV of numbers as dicts; a cell that is not a number becomes NaN."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        return [{key: _number(value) for key, value in row.items()} for row in csv.DictReader(f)]


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def column(rows: list[dict[str, float]], name: str) -> list[float]:
    """One column of `rows` (NaN where a row lacks it)."""
    return [row.get(name, math.nan) for row in rows]
