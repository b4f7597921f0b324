"""The one check of a node's address, wherever it comes from: an inventory file (fields.py),
an SSH config, or what a SLURM login node answers (allocation.py).

An address is an IP address or a DNS name. `ipaddress` alone is not enough: it accepts an
IPv6 scope id of any characters but `%` and `/` (`fe80::1%$(cmd)` is an address to it),
and an address ends up in shell commands, in `from="..."` of authorized_keys and in the
names of a node's certificate. So a scope id is accepted only as an interface name
(letters, digits, '.', '_', '-', not starting with '.' or '-', at most IFNAMSIZ - 1 = 15
characters) or an interface's number. Checked whole (fullmatch: no trailing newline).
"""

from __future__ import annotations

import ipaddress
import re

# A DNS name (or a host name with '_', as /etc/hosts allows): 253 characters at most,
# letters, digits, '_', '.', '-', a letter, digit or '_' at both ends.
_HOST_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
IFNAMSIZ = 16  # Linux's interface name buffer, its NUL included
_SCOPE = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{IFNAMSIZ - 2}}}")
SCOPE_TEXT = (
    "an IPv6 scope id is an interface's name (letters, digits, '.', '_', '-', at most "
    f"{IFNAMSIZ - 1} characters) or its number, e.g. fe80::1%eth0"
)


def address_problem(address: object) -> str | None:
    """Why `address` is not an IP address or a DNS name this tool uses (None: it is one)."""
    if not isinstance(address, str):
        return f"{address!r} is neither an IP address nor a DNS name"
    if "%" in address:
        scope = address.partition("%")[2]
        if not _SCOPE.fullmatch(scope):
            return (
                f"address {address!r} has a scope id that is not an interface's name ({SCOPE_TEXT})"
            )
    try:
        ipaddress.ip_address(address)
        return None
    except ValueError:
        pass
    if _HOST_NAME.fullmatch(address):
        return None
    return f"address {address!r} is neither an IP address nor a DNS name"


def checked_address(address: str) -> str:
    """`address` as this tool writes it (an IP address in its usual form, a DNS name as
    given); ValueError naming the problem when it is neither."""
    why = address_problem(address)
    if why:
        raise ValueError(why)
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address
