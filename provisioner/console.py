"""Consoles for the CLI: results on stdout, progress and messages on stderr.

Library code never prints; it reports progress through a `Reporter` callback
that the CLI gives it. With `--json`, stdout carries exactly one JSON document.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.text import Text

# A reporter receives one line of progress (e.g. "node-1: loading image 40%").
Reporter = Callable[[str], None]

# What a node or a job may send that a terminal would act on: C0 controls but tab and
# newline (ESC starts colour, title and cursor sequences; CR overwrites a line), DEL, C1
# controls (CSI 0x9b), and the bidirectional overrides that reorder what is shown.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


# Escape sequences a job's output may carry: CSI (`ESC [` ... final byte; colours are
# the SGR ones, ending in `m`), OSC (`ESC ]` ... BEL or `ESC \\`: titles, hyperlinks),
# DCS/SOS/PM/APC strings, and the two-byte ones (`ESC 7`, `ESC c`); one left unfinished at
# the end of a line is dropped too.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*(?:[@-~]|$)"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\|$)"
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\|$)"
    r"|\x1b[ -/]*[0-~]?"
)
_SGR = re.compile(r"(\x1b\[[0-9;]*m)")
# What is left to drop once the sequences are gone: every control character but tab.
_STRAY = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(text: str) -> str:
    """`text` without escape sequences and control characters (tab kept): a job's line
    where it is not shown on a terminal (a pipe, --json, job.log)."""
    return _STRAY.sub("", _ESCAPES.sub("", text))


def sgr_only(text: str) -> str:
    """`text` with its colours (SGR sequences, `ESC [ digits;... m`) kept and every other
    escape sequence and control character dropped: a job's line shown on a terminal."""
    parts = _SGR.split(text)
    return "".join(part if i % 2 else plain(part) for i, part in enumerate(parts))


def clean(text: str) -> str:
    """`text` with every control character shown as an escape (`\\x1b`), never acted on."""
    return _CONTROLS.sub(lambda m: ascii(m.group())[1:-1], text)


class SafeConsole(Console):
    """A rich Console that shows control characters instead of sending them: every string
    it renders (printed text, table cells, titles) passes through `clean`. Markup is off
    unless a call asks for it (and then escapes what it interpolates)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(clean(text), **kwargs)


def quiet(_: str) -> None:
    """A reporter that drops everything (library default)."""


@dataclass
class Output:
    """The CLI's view of the terminal, injected so tests can capture it."""

    json_mode: bool = False
    stdout: TextIO = field(default_factory=lambda: sys.stdout)
    stderr: TextIO = field(default_factory=lambda: sys.stderr)

    def __post_init__(self) -> None:
        self.out = SafeConsole(file=self.stdout, highlight=False, soft_wrap=True, markup=False)
        self.err = SafeConsole(file=self.stderr, highlight=False, soft_wrap=True, markup=False)
        self._started = time.monotonic()
        self.nodes: dict[str, str] = {}  # watched node -> its last progress line
        self.emitted = False  # the one JSON document was written

    def watch_nodes(self, names: Iterable[str]) -> None:
        """Remember each node's last progress line, to say where it stood if interrupted."""
        self.nodes = {name: "" for name in names}

    def node_states(self) -> list[str]:
        """One line per watched node: its last reported step, or that none was reached."""
        return [f"{name}: {last or 'no step reported yet'}" for name, last in self.nodes.items()]

    def progress(self, line: str) -> None:
        """One line of progress on stderr, with the time since the command started."""
        name, sep, rest = line.partition(": ")
        if sep and name in self.nodes:
            self.nodes[name] = rest
        elapsed = time.monotonic() - self._started
        self.err.print(f"[dim]{elapsed:6.1f}s[/dim] {escape(line)}", markup=True, highlight=False)

    def say(self, text: str) -> None:
        """Human output on stdout (suppressed in --json mode)."""
        if not self.json_mode:
            self.out.print(text)

    def emit(self, document: Any) -> None:
        """The one JSON document of a --json command."""
        self.stdout.write(json.dumps(document, indent=2, sort_keys=False, default=str) + "\n")
        self.stdout.flush()
        self.emitted = True

    def emit_error(self, error: Mapping[str, Any]) -> None:
        """With --json, a command that ends in an error before its document still writes
        one: `{"ok": false, "error": {...}}`, so a script reading stdout always gets JSON."""
        if self.json_mode and not self.emitted:
            self.emit({"ok": False, "error": error})

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Show the start and end of a slow step on stderr."""
        self.progress(f"{what} ...")
        t0 = time.monotonic()
        yield
        self.progress(f"{what}: done in {time.monotonic() - t0:.1f}s")
