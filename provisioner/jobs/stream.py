"""Follow a job's log live: chunks from Ray become whole lines, results lines hidden."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from provisioner.jobs.provisioner_results import is_marked


class LineSplitter:
    """Turns arbitrary text chunks into whole lines, holding back an unfinished one."""

    def __init__(self) -> None:
        self._partial = ""

    def feed(self, chunk: str) -> list[str]:
        text = self._partial + chunk
        *lines, self._partial = text.split("\n")
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
