"""Connections to the inventory's nodes, made on first use and reused until closed."""

from __future__ import annotations

import threading
from types import TracebackType

from provisioner.errors import ProvisionerError
from provisioner.inventory import Inventory, Node
from provisioner.remote.session import Session

WARM_LIMIT = 32  # as many as the doctor's rounds connect at once (its parallelism)


class Pool:
    """`with Pool(inventory) as pool: pool.session(node).run(...)`; closes every session on exit.

    A node whose connection failed keeps failing with the same error for the pool's
    life, so later steps do not wait for the same timeout again.
    """

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self._sessions: dict[str, Session] = {}
        self._failures: dict[str, ProvisionerError] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._closed = False

    def __enter__(self) -> Pool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _lock(self, name: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(name, threading.Lock())

    def warm(self, limit: int = WARM_LIMIT) -> Pool:
        """Start connecting to the first `limit` nodes now, each in a thread of its own, and
        return at once: the caller goes on (a command loading the rest of itself) while
        the nodes answer. A later `session(node)` waits for that node's connection, or
        raises its failure, as if it had made it itself. The limit keeps a large inventory
        from opening more connections at once than the doctor's own rounds do (a jump
        host's sshd drops new connections beyond its MaxStartups)."""
        for node in self.inventory.nodes[:limit]:
            threading.Thread(target=self._warm_one, args=(node,), daemon=True).start()
        return self

    def _warm_one(self, node: Node) -> None:
        try:
            self.session(node)
        except Exception:  # `session` raises it again to its caller (a ProvisionerError kept)
            return
        if self._closed:  # the pool closed while this one connected: it is nobody's
            self.forget(node)

    def session(self, node: Node) -> Session:
        """The node's session, connecting on first use (raises ConnectError)."""
        with self._lock(node.name):
            if node.name in self._failures:
                raise self._failures[node.name]
            if node.name not in self._sessions:
                try:
                    self._sessions[node.name] = Session.connect(node)
                except ProvisionerError as exc:
                    self._failures[node.name] = exc
                    raise
            return self._sessions[node.name]

    def open_sessions(self) -> dict[str, Session]:
        """Node name -> its session, for the connections made already (none is made)."""
        with self._guard:
            return dict(self._sessions)

    def forget(self, node: Node) -> None:
        """Drop the node's session (or remembered failure) so the next use reconnects."""
        with self._lock(node.name):
            session = self._sessions.pop(node.name, None)
            self._failures.pop(node.name, None)
        if session is not None:
            session.close()

    def close(self) -> None:
        with self._guard:
            self._closed = True
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()
