"""Run one step on many nodes at once: bounded, with a deadline per node.

Unlike fabric's ThreadingGroup, the number of threads is bounded, each node has its
own deadline counted from when its work starts, and a node that overruns is reported
as timed out while the others carry on (its daemon thread is abandoned).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

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
