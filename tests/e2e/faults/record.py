"""Each fault or security scenario records what the suite observed, for docs/reliability.md's table.

`with scenario("a node dies during up", "exit 1 naming it; others up") as s:` runs the
checks. What the table says the test found comes from the values it checked, never from
prose that could say more: `s.expect("exit", run.code, 1)` asserts a value and records
it, `s.saw(alive=2)` records a value the test asserted otherwise, and `s.observed` is the
template that shows them (`"exit {exit}; the {alive} others alive"`). The values must not
change from run to run (no node names, no timings: the table is compared with them every
run). What this run measured (seconds, counts) goes to `s.measure(seconds=3.1)` and the
`s.measured` template (`"{seconds:.1f} s"`). `scripts/reliability_table.py` fills both
(`fill`): a template naming a value not recorded, a recorded value it does not show, or
a column of prose with no values at all fails the scenario here, when the test runs.

The record (scenario -> expected, the templates and their values, passed, seconds, test)
goes to build/reliability.json (or $PROVISIONER_RELIABILITY_JSON); the script renders it
into docs/reliability.md. A scenario whose checks raise is recorded as failed, with the
first line of the error.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RECORD = Path(os.environ.get("PROVISIONER_RELIABILITY_JSON", ROOT / "build" / "reliability.json"))


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "reliability_table", ROOT / "scripts" / "reliability_table.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _plain(value: Any) -> Any:
    """A value as JSON holds it (sets sorted into lists)."""
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@dataclass
class Scenario:
    name: str
    expected: str
    kind: str
    observed: str = ""  # template over `values`
    measured: str = ""  # template over `measures`
    values: dict[str, Any] = field(default_factory=dict)
    measures: dict[str, Any] = field(default_factory=dict)

    def expect(self, key: str, actual: Any, want: Any, context: str = "") -> Any:
        """Assert `actual == want` and record it under `key` for the observed column
        (`context`: what the failure shows besides, e.g. the command's stderr)."""
        assert actual == want, f"{key}: {actual!r}, expected {want!r}" + (
            f"\n{context}" if context else ""
        )
        self.values[key] = _plain(actual)
        return actual

    def saw(self, **values: Any) -> None:
        """Record values the test asserted (by other comparisons) for the observed column."""
        self.values.update({k: _plain(v) for k, v in values.items()})

    def measure(self, **values: Any) -> None:
        """Record what this run measured, for the measured column."""
        self.measures.update({k: _plain(v) for k, v in values.items()})

    def rendered(self) -> tuple[str, str]:
        """The observed and measured columns, filled (TemplateError when they do not match
        the values, or when a column is prose with no values)."""
        entry = {"scenario": self.name, "observed": self.observed, "measured": self.measured}
        entry |= {"values": self.values} if self.values else {}
        entry |= {"measures": self.measures} if self.measures else {}
        filled = _renderer().filled
        return filled(entry, "observed", "values"), filled(entry, "measured", "measures")


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
        s.rendered()  # the templates show exactly the values recorded, or the test fails
        passed = True
    except BaseException as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        s.observed, s.values = f"FAILED: {first[:200]}", {}
        raise
    finally:
        entry: dict[str, object] = {
            "scenario": name,
            "kind": kind,
            "expected": expected,
            "observed": s.observed,
            "measured": s.measured,
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
            "passed": passed,
            "seconds": round(time.monotonic() - t0, 1),
        }
        if s.values:  # the templates' values (a passed entry without them is refused)
            entry["values"] = s.values
        if s.measures:
            entry["measures"] = s.measures
        _write(entry)
