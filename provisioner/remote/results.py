"""Result of one remote command, and of one step fanned out over many nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from provisioner.errors import CommandFailed, ProvisionerError

T = TypeVar("T")


@dataclass(frozen=True)
class Result:
    """What one command did on one host."""

    host: str
    command: str
    stdout: str
    stderr: str
    exit_code: int
    started: float = 0.0  # time.time() when the command was sent
    first_byte: float | None = None  # time.time() when its first output arrived
    finished: float = 0.0
    dropped: int = 0  # bytes of output left out past the cap (see Session.run)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, n: int = 10) -> str:
        """The last n lines of stderr (or stdout when stderr is empty)."""
        text = self.stderr.strip() or self.stdout.strip()
        return "\n".join(text.splitlines()[-n:])

    def check(self, fix: str | None = None) -> Result:
        """Return self, or raise CommandFailed showing the output's last lines."""
        if self.ok:
            return self
        first = self.command.splitlines()[0] if self.command else ""
        shown = first if len(first) <= 120 else first[:117] + "..."
        message = f"`{shown}` exited with {self.exit_code}"
        tail = self.tail()
        if tail:
            message += ":\n" + tail
        error = CommandFailed(self.host, message, fix, kind="command")
        error.result = self  # type: ignore[attr-defined]
        raise error


@dataclass
class GroupResult(Generic[T]):
    """A step over many nodes: node name -> value, or node name -> error."""

    results: dict[str, T] = field(default_factory=dict)
    errors: dict[str, ProvisionerError] = field(default_factory=dict)

    @property
    def succeeded(self) -> dict[str, T]:
        return self.results

    @property
    def failed(self) -> dict[str, ProvisionerError]:
        return self.errors

    @property
    def ok(self) -> bool:
        return not self.errors

    def reasons(self) -> dict[str, str]:
        """Node name -> what went wrong there, for a line or a key that names the node
        already: the error's message without its `where` when that is the node's name
        (`str(error)` would say "w1: w1: connection refused")."""
        return {
            name: exc.message if exc.where == name else str(exc)
            for name, exc in self.errors.items()
        }
