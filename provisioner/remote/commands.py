"""Remote commands as data: pure builders that quote every value.

Every value from an inventory or a user goes through shlex.quote before it reaches a
shell. Secrets can be masked for display with `masked`.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def command(*argv: str | int) -> str:
    """One command line from its words, each quoted."""
    return " ".join(shlex.quote(str(word)) for word in argv)


def sudo(cmd: str) -> str:
    """`cmd` as root, failing at once instead of asking for a password."""
    return f"sudo -n sh -c {shlex.quote(cmd)}"


def login_shell(cmd: str) -> str:
    """`cmd` in a login interactive bash, the way Ray's cluster launcher runs commands."""
    return f"bash --login -i -c {shlex.quote(cmd)}"


def script(interpreter: str = "bash", args: Iterable[str | int] = ()) -> str:
    """Run a script fed on stdin (`bash -s -- ARGS`), so its text never shows in `ps`."""
    extra = command(*args)
    return (
        f"{interpreter} -s -- {extra}".rstrip()
        if interpreter == "bash"
        else f"{interpreter} - {extra}".rstrip()
    )


def masked(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (and its quoted form) replaced by ***."""
    for secret in secrets:
        if secret:
            text = text.replace(shlex.quote(secret), "***").replace(secret, "***")
    return text
