"""Follow a job's log live, surviving dropped streams and tunnels.

Ray's log stream (`tail_job_logs`) always starts at the beginning of the job's log, so
the follower counts the whole lines it has handed on and, after a reconnection, skips
that many: nothing is repeated and nothing is lost. A stream that ends while the job
still runs, a tunnel that drops, a dashboard that does not answer: each is a reason to
reconnect, not a failure. While following, the job's results are pulled every few
seconds (new checkpoints and metrics come home as they appear).

Lines marked `PROVISIONER-PROGRESS {json}` (printed by the playbooks each iteration)
become the live progress line instead of output.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.cluster.tunnel import NotThisCluster
from provisioner.console import Reporter, quiet
from provisioner.errors import InputError, OperationError, ProvisionerError
from provisioner.jobs.client import AuthRefused
from provisioner.jobs.head_folder import pull
from provisioner.jobs.link import Link, Target
from provisioner.remote.pull import Pulled

if TYPE_CHECKING:
    from provisioner.cluster.storage import Sync
    from provisioner.remote.session import Session
    from provisioner.runtime.protocol import RayState

PROGRESS_MARK = "PROVISIONER-PROGRESS"
QUIET_CHECK_S = 15.0  # a silent stream: check the job (and the link) this often
CHECK_TIMEOUT_S = 20.0


class JobNotFound(OperationError):
    """The Jobs API does not know the job."""


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


def progress_of(line: str) -> dict[str, Any] | None:
    """The figures of a progress line, or None for any other line."""
    if not line.startswith(PROGRESS_MARK + " "):
        return None
    try:
        data = json.loads(line[len(PROGRESS_MARK) + 1 :])
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def visible(lines: list[str]) -> list[str]:
    """The lines a person reads in job.log: everything but the progress marks."""
    return [line for line in lines if progress_of(line) is None]


@dataclass
class Handlers:
    """Where a follower's findings go (each defaults to nowhere)."""

    on_line: Callable[[str], None] = quiet
    on_progress: Callable[[dict[str, Any]], None] = lambda _: None
    on_pulled: Callable[[Pulled], None] = lambda _: None
    report: Reporter = quiet


@dataclass
class Followed:
    """How following ended: a terminal status, or the last known one."""

    status: str
    message: str = ""
    lines: int = 0
    reconnects: int = 0
    progress: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)

    @property
    def terminal(self) -> bool:
        return self.status in ("SUCCEEDED", "FAILED", "STOPPED")


@dataclass
class _State:
    seen: int = 0
    progress: dict[str, Any] | None = None


def _handle(line: str, n: int, state: _State, h: Handlers) -> None:
    if n <= state.seen:
        return
    state.seen = n
    figures = progress_of(line)
    if figures is not None:
        state.progress = figures
        h.on_progress(figures)
    else:
        h.on_line(line)


async def _check(link: Link, job_id: str) -> Any:
    return await asyncio.wait_for(
        asyncio.to_thread(link.client.get_job_info, job_id), CHECK_TIMEOUT_S
    )


async def _tail(link: Link, job_id: str, state: _State, h: Handlers) -> None:
    """Hand on the new lines of one stream until it ends; raise when the link breaks."""
    splitter = LineSplitter()
    n = 0
    stream = link.client.tail_job_logs(job_id).__aiter__()
    while True:
        nxt = asyncio.ensure_future(stream.__anext__())
        while True:
            done, _ = await asyncio.wait({nxt}, timeout=QUIET_CHECK_S)
            if done:
                break
            try:
                await _check(link, job_id)  # the link still answers: keep waiting
            except BaseException:
                nxt.cancel()
                raise
        try:
            chunk = nxt.result()
        except StopAsyncIteration:
            break
        for line in splitter.feed(chunk):
            n += 1
            _handle(line, n, state, h)
    for line in splitter.flush():  # the stream ended whole: the last line had no newline
        n += 1
        _handle(line, n, state, h)


def _from_store(session: Session, target: Target, job_id: str, sync: Sync, h: Handlers) -> None:
    """Tune's folder of the job in the cluster's store, onto the head (cluster.storage.Sync)."""
    try:
        sync(session, target.runtime, target.inventory, job_id)
    except ProvisionerError as exc:
        h.report(f"Tune's results not copied from the store this time: {exc}")


async def _pull_loop(
    link: Link, target: Target, job_id: str, home: Path, every: float, h: Handlers
) -> None:
    from provisioner.cluster.storage import Sync

    sync = Sync()  # Tune's folder in the store, copied to the head at most every 30 s
    while True:
        await asyncio.sleep(every)
        try:
            await asyncio.to_thread(_from_store, link.head(), target, job_id, sync, h)
            got = await asyncio.to_thread(pull, link.head(), target.cluster, job_id, home)
        except ProvisionerError as exc:
            h.report(f"results not pulled this time: {exc}")
            continue
        h.on_pulled(got)


async def _follow_once(
    link: Link,
    target: Target,
    job_id: str,
    state: _State,
    h: Handlers,
    home: Path | None,
    pull_every: float,
) -> None:
    puller = None
    if home is not None and link.pool is not None:
        puller = asyncio.ensure_future(_pull_loop(link, target, job_id, home, pull_every, h))
    try:
        await _tail(link, job_id, state, h)
    finally:
        if puller is not None:
            puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await puller


def job_info(link: Link, job_id: str) -> Any:
    """Ray's info on the job; JobNotFound when the cluster does not know it."""
    try:
        return link.client.get_job_info(job_id)
    except RuntimeError as exc:
        if "does not exist" in str(exc) or "404" in str(exc):
            raise JobNotFound(
                f"the cluster knows no job {job_id}",
                "list the jobs with `provisioner jobs list` (a head restart forgets old jobs; "
                "their results stay on its disk: `provisioner jobs results JOB`)",
            ) from None
        raise


def head_verdict(state: RayState) -> str | None:
    """Pure: why a job followed on this head cannot go on, from the head's Ray as its
    runtime reports it; None while it may (running, paused, or not known)."""
    if state.status == "absent":
        return "the cluster was taken down"
    if state.ended:  # no job outlives its head: the driver and Ray's supervisor ran there
        return f"the head's Ray is not running ({state.status}): the job was lost with it"
    return None


def _head_verdict(target: Target) -> str | None:
    """`head_verdict` of the head's Ray, asked over SSH; None when the head does not
    answer (a link that drops is waited for, up to `give_up_after`)."""
    if target.inventory is None:
        return None
    runtime = target.runtime
    try:
        with target.ssh() as session:
            facts = session.run(runtime.state_command(), timeout=30)
    except ProvisionerError:
        return None
    return head_verdict(runtime.parse_state(facts.stdout)) if facts.ok else None


def follow(
    target: Target,
    job_id: str,
    handlers: Handlers | None = None,
    *,
    home: Path | None = None,
    pull_every: float = 5.0,
    give_up_after: float = 120.0,
) -> Followed:
    """Follow `job_id` until it ends; reconnect whenever the stream or the link breaks.

    After `give_up_after` seconds without a working link, return the last known state
    (status "UNKNOWN"): the job itself is never touched. When the head answers and its
    Ray is gone or not running (a crashed or killed head container), return that at once:
    no job outlives its head, and `submit --retries` can repair and resume without waiting."""
    h = handlers or Handlers()
    state = _State()
    failing_since: float | None = None
    reconnects = 0
    errors: list[str] = []
    while True:
        try:
            with target.link() as link:
                job_info(link, job_id)
                failing_since = None
                asyncio.run(_follow_once(link, target, job_id, state, h, home, pull_every))
                info = link.client.get_job_info(job_id)
                if info.status.is_terminal():
                    return Followed(
                        str(info.status.value),
                        str(info.message or ""),
                        state.seen,
                        reconnects,
                        state.progress,
                        errors,
                    )
                why = "the log stream ended while the job runs"
        except (JobNotFound, InputError, AuthRefused, NotThisCluster):
            raise
        except (TimeoutError, ProvisionerError, RuntimeError, OSError, EOFError) as exc:
            why = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # aiohttp's client errors and the like: the link broke
            if type(exc).__module__.split(".")[0] not in ("aiohttp", "requests", "urllib3"):
                raise
            why = f"{type(exc).__name__}: {exc}"
        reconnects += 1
        errors.append(why)
        now = time.monotonic()
        failing_since = failing_since or now
        verdict = _head_verdict(target)
        if verdict is not None:
            return Followed(
                "UNKNOWN",
                verdict,
                state.seen,
                reconnects,
                state.progress,
                errors,
            )
        if now - failing_since > give_up_after:
            return Followed(
                "UNKNOWN",
                f"lost the connection: {why}",
                state.seen,
                reconnects,
                state.progress,
                errors,
            )
        h.report(f"{why}; reconnecting (the job goes on)")
        time.sleep(min(5.0, 1.0 + reconnects))
