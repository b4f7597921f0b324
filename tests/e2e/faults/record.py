"""Each fault or security scenario records what the suite observed, for docs/reliability.md's table.

`with scenario("a node dies during up", "exit 1 naming it; others up") as s:` runs the
checks; `s.observed = "..."` states what the checks asserted and found to hold, in words
that do not change from run to run (no node names, no timings: the table is compared
with it every run), and `s.measured = "..."` what this run measured (seconds, counts).
The record (scenario -> expected, observed, measured, passed, seconds, test) goes to
build/reliability.json (or $PROVISIONER_RELIABILITY_JSON); `scripts/reliability_table.py`
renders it into docs/reliability.md. A scenario whose checks raise is recorded as failed, with the
first line of the error.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORD = Path(os.environ.get("PROVISIONER_RELIABILITY_JSON", ROOT / "build" / "reliability.json"))


@dataclass
class Scenario:
    name: str
    expected: str
    kind: str
    observed: str = ""
    measured: str = ""


def _write(entry: dict[str, object]) -> None:
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    # the two e2e processes record side by side: one read-modify-write at a time
    with open(RECORD.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(RECORD.read_text()) if RECORD.exists() else {}
        data[str(entry["scenario"])] = entry
        tmp = RECORD.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(RECORD)


@contextmanager
def scenario(name: str, expected: str, *, kind: str = "fault") -> Iterator[Scenario]:
    """Record the scenario's outcome whether its checks pass or fail."""
    s = Scenario(name, expected, kind)
    t0 = time.monotonic()
    passed = False
    try:
        yield s
        passed = True
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        s.observed = f"FAILED: {first[:200]}"
        raise
    finally:
        _write(
            {
                "scenario": name,
                "kind": kind,
                "expected": expected,
                "observed": s.observed,
                "measured": s.measured,
                "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
                "passed": passed,
                "seconds": round(time.monotonic() - t0, 1),
            }
        )
