"""Repeats that may fail: `make bench` keeps going when one run of one tool stumbles.

Every measured run goes through `Repeats.run`: a run that raises (an exception, or the
SystemExit the bench helpers raise on a tool's failure) is recorded with its error and
tried again, at most `retries` more times; a repeat whose every attempt failed gives no
figure, and the run goes on. The failures are shown next to the figure in bench.md
(how many repeats failed, and whether a retry recovered them) and listed in full.
Pure bookkeeping: no I/O but the log callback.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Attempt:
    """One failed attempt of one repeat of one measured label."""

    label: str
    repeat: int  # 1-based
    attempt: int  # 1-based; attempt > 1 is a retry
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "repeat": self.repeat, "attempt": self.attempt,
                "error": self.error}  # fmt: skip


def error_text(exc: BaseException, limit: int = 1600) -> str:
    """What a failed run said, in one string: the message, or a failed command's output tail."""
    if isinstance(exc, SystemExit):
        text = str(exc.code) if exc.code is not None else "SystemExit"
    elif isinstance(exc, subprocess.CalledProcessError):
        out = exc.stderr or exc.output or b""
        tail = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        text = f"{exc}: {tail.strip()}" if tail.strip() else str(exc)
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= limit else "…" + text[-limit:]


@dataclass
class Repeats:
    """Runs measurements with bounded retries; keeps every failure by label."""

    retries: int = 2
    log: Callable[[str], None] = lambda _line: None
    failures: dict[str, list[Attempt]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def run(self, label: str, fn: Callable[[], T]) -> T | None:
        """fn's value, retried after a failure; None when every attempt failed."""
        repeat = self.counts[label] = self.counts.get(label, 0) + 1
        for attempt in range(1, self.retries + 2):
            try:
                return fn()
            except (Exception, SystemExit) as exc:
                failed = Attempt(label, repeat, attempt, error_text(exc))
                self.failures.setdefault(label, []).append(failed)
                again = "retrying" if attempt <= self.retries else "giving this repeat up"
                self.log(f"{label}: repeat {repeat} attempt {attempt} failed ({failed.error}); "
                         f"{again}")  # fmt: skip
        return None

    def of(self, label: str) -> list[Attempt]:
        return list(self.failures.get(label, []))


def lost_repeats(failures: list[Attempt], retries: int) -> int:
    """Repeats whose every attempt (1 + retries) failed."""
    per: dict[int, int] = {}
    for a in failures:
        per[a.repeat] = per.get(a.repeat, 0) + 1
    return sum(1 for n in per.values() if n > retries)


def summary(failures: list[Attempt], repeats: int, retries: int) -> str:
    """How the repeats of one figure went, for its table cell ('' when none failed):
    '1 of 3 repeats failed once, retried' or '2 of 3 repeats failed (1 lost)'."""
    if not failures:
        return ""
    hit = len({a.repeat for a in failures})
    lost = lost_repeats(failures, retries)
    head = f"{hit} of {repeats} {'repeat' if repeats == 1 else 'repeats'} failed"
    if lost:
        return f"{head} ({lost} lost after {retries} {'retry' if retries == 1 else 'retries'})"
    times = len(failures)
    return f"{head} {'once' if times == 1 else f'{times} times'}, retried"
