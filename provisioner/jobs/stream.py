"""Follow a job's log live: chunks from Ray become whole lines, results lines hidden."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from provisioner.jobs.provisioner_results import is_marked

MAX_LINE = 1024 * 1024  # an unfinished line longer than this is passed on in pieces


class LineSplitter:
    """Turns arbitrary text chunks into whole lines, holding back an unfinished one (at
    most MAX_LINE characters: a job printing without newlines cannot fill memory)."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._partial = ""
        self._max = max_line

    def feed(self, chunk: str) -> list[str]:
        text = self._partial + chunk
        *lines, self._partial = text.split("\n")
        while len(self._partial) > self._max:
            lines.append(self._partial[: self._max])
            self._partial = self._partial[self._max :]
        return lines

    def flush(self) -> list[str]:
        rest, self._partial = self._partial, ""
        return [rest] if rest else []


def visible(lines: list[str]) -> list[str]:
    """The lines a person should see: everything but the results shipment."""
    return [line for line in lines if not is_marked(line)]


def follow(client: Any, job_id: str, on_line: Callable[[str], None]) -> None:
    """Call `on_line` for each visible log line of `job_id` until the job ends."""

    async def tail() -> None:
        splitter = LineSplitter()
        async for chunk in client.tail_job_logs(job_id):
            for line in visible(splitter.feed(chunk)):
                on_line(line)
        for line in visible(splitter.flush()):
            on_line(line)

    asyncio.run(tail())
