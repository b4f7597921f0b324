"""ProxyJump and ProxyCommand values as OpenSSH reads them (pure)."""

from __future__ import annotations

import re

from provisioner.errors import InventoryError
from provisioner.inventory.sshconfig import Resolved

_TOKEN = re.compile(r"%(.)")


def split_jump(text: str) -> tuple[str, tuple[str | None, str, str | None]]:
    """`a,b,c` -> ("a,b", spec of c): OpenSSH reaches the last hop through the others.
    A spec is [user@]host[:port] or ssh://[user@]host[:port]; [v6] addresses in brackets."""
    rest, _, last = text.strip().rpartition(",")
    spec = last.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://") :].rstrip("/")
    user, _, hostport = spec.rpartition("@")
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port = hostport.partition(":")
    return rest.strip(), (user or None, host, port or None)


def expand_proxy_command(command: str, found: Resolved, alias: str) -> str:
    """ProxyCommand's tokens as ssh_config(5) defines them: %h %p %r %n %%."""
    values = {
        "h": found.hostname,
        "p": str(found.port),
        "r": found.user,
        "n": alias,
        "%": "%",
    }

    def one(match: re.Match[str]) -> str:
        token = match.group(1)
        if token not in values:
            raise InventoryError(
                f"ProxyCommand {command!r} uses %{token}, which ProxyCommand does not accept",
                "use %h, %p, %r, %n or %%",
            )
        return values[token]

    return _TOKEN.sub(one, command)
