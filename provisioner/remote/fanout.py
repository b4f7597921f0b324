"""Run one step on many nodes at once: bounded, with a deadline per node.

Unlike fabric's ThreadingGroup, the number of threads is bounded, each node has its
own deadline counted from when its work starts, and a node that overruns is reported
as timed out while the others carry on (its daemon thread is abandoned).

`beside` runs one step in the background of another (e.g. `up`'s token install beside
the doctor's round); Ctrl-C leaves it behind as it leaves a node's thread behind.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from provisioner.errors import ProvisionerError, RemoteError
from provisioner.inventory import Node
from provisioner.remote.results import GroupResult

T = TypeVar("T")


def fan_out(
    nodes: Iterable[Node],
    fn: Callable[[Node], T],
    *,
    parallelism: int = 32,
    deadline: float,
) -> GroupResult[T]:
    """`fn(node)` for every node; node name -> value or error. Never raises for one node."""
    queue = deque(nodes)
    group: GroupResult[T] = GroupResult()
    started: dict[str, float] = {}
    done = threading.Condition()
    pending = {node.name: node for node in queue}

    def finish(name: str, value: T | None, error: ProvisionerError | None) -> None:
        with done:
            if name not in pending:  # already timed out
                return
            del pending[name]
            if error is not None:
                group.errors[name] = error
            else:
                group.results[name] = value  # type: ignore[assignment]
            done.notify_all()

    def worker() -> None:
        while True:
            with done:
                if not queue:
                    return
                node = queue.popleft()
                started[node.name] = time.monotonic()
            try:
                finish(node.name, fn(node), None)
            except ProvisionerError as exc:
                finish(node.name, None, exc)
            except Exception as exc:  # a bug in fn must not stop the other nodes
                finish(
                    node.name,
                    None,
                    RemoteError(
                        node.name,
                        f"unexpected {type(exc).__name__}: {exc}",
                        "please report this",
                        kind="internal",
                    ),
                )

    for _ in range(max(1, min(parallelism, len(queue)))):
        threading.Thread(target=worker, daemon=True).start()

    with done:
        while pending:
            now = time.monotonic()
            for name, t0 in list(started.items()):
                if name in pending and now - t0 >= deadline:
                    del pending[name]
                    group.errors[name] = RemoteError(
                        name,
                        f"no answer within {deadline:g}s",
                        "the node or its sshd is hung or very slow; check it on the console",
                        kind="deadline",
                    )
            waits = [t0 + deadline - now for n, t0 in started.items() if n in pending]
            done.wait(max(0.01, min(waits)) if waits else 0.1)
    return group


class Side(Generic[T]):
    """`fn()` running on a daemon thread of its own (see `beside`)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn,), daemon=True).start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value = fn()
        except BaseException as exc:  # handed to whoever asks for the result
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> BaseException | None:
        """Wait until `fn` ended (Ctrl-C ends the wait); its error, None when it returned."""
        self._done.wait()
        return self._error

    def result(self) -> T:
        """`fn`'s value, or its error raised (waits until it ended)."""
        error = self.wait()
        if error is not None:
            raise error
        return self._value  # type: ignore[return-value]


@contextmanager
def beside(fn: Callable[[], T]) -> Iterator[Side[T]]:
    """`with beside(fn) as side: ...`: `fn()` runs on a thread of its own while the block
    runs; leaving the block waits until it ended (as a ThreadPoolExecutor's `with` does),
    the block's own error raised after that wait.

    Except on Ctrl-C (KeyboardInterrupt, or any BaseException that is no Exception): then
    nothing waits. The thread is a daemon, so the process does not wait for it at exit
    either (a ThreadPoolExecutor's thread is joined at exit: `up` interrupted while it
    connected to a hung node waited for the connect timeout, then fan_out's deadline).
    What it was doing is left as a node past fan_out's deadline is: whatever it writes
    lands whole or not at all (a temporary file renamed), and the next run redoes it."""
    side = Side(fn)
    try:
        yield side
    except Exception:
        side.wait()
        raise
    side.wait()
