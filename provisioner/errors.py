"""One exception tree. Every expected failure is a ProvisionerError with a fix.

The CLI maps InputError to exit code 2 and every other ProvisionerError to 1;
anything else is a bug and gets a traceback file.
"""

from __future__ import annotations


class ProvisionerError(Exception):
    """Base of every error the tool expects. `fix` says what the user can do."""

    exit_code = 1

    def __init__(self, message: str, fix: str | None = None, *, where: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.where = where

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        return text

    def to_json(self) -> dict[str, str | int | None]:
        """The error as `--json` output carries it."""
        return {
            "kind": type(self).__name__,
            "message": self.message,
            "where": self.where,
            "fix": self.fix,
            "exit_code": self.exit_code,
        }


class InputError(ProvisionerError):
    """Bad input: usage, inventory, configuration. Exit code 2."""

    exit_code = 2


class InventoryError(InputError):
    """The inventory cannot be read or is invalid."""


class OperationError(ProvisionerError):
    """An operation failed on the machines. Exit code 1."""


class RemoteError(OperationError):
    """A remote command or connection failed on one host."""

    def __init__(
        self, host: str, message: str, fix: str | None = None, *, kind: str = "remote"
    ) -> None:
        super().__init__(message, fix, where=host)
        self.host = host
        self.kind = kind


class ConnectError(RemoteError):
    """SSH could not connect or authenticate (kind: dns, refused, timeout, auth, hostkey...)."""


class CommandFailed(RemoteError):
    """A remote command exited non-zero; carries its result."""


class ReceiveError(OperationError):
    """Files coming home from a node or a job were refused (unsafe, too big, or corrupt)."""


class TooLargeError(ReceiveError):
    """One file coming home was refused for its size (over a cap, or more than the space
    free here); the transfer may go on without it."""


class LabError(OperationError):
    """The local lab could not be built, started or changed."""


class PrerequisiteError(InputError):
    """Something this machine needs is missing (docker, debootstrap, ...)."""
