"""Run a program with a temporary directory as the account's home, as OpenSSH reads it.

OpenSSH expands `~` and `%d` with the home of the account's passwd entry, not $HOME, so a
test that gives ssh a home of default keys cannot do it with $HOME. Here the program runs
in a private mount namespace (`unshare --mount`, propagation private: nothing leaks to the
machine) where /etc/passwd is a copy whose entry for the running uid names that home;
`ssh`, `ssh -G` and provisioner (Python's pwd) all read it. As root the namespace is a plain
mount namespace; otherwise a user namespace maps the user to root inside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

_BIND = 'mount --bind "$0" /etc/passwd && exec "$@"'


def passwd_with_home(text: str, uid: int, home: Path) -> str:
    """/etc/passwd's `text` with the home of `uid`'s entry replaced by `home` (pure)."""
    lines = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) == 7 and fields[2] == str(uid):
            fields[5] = str(home)
        lines.append(":".join(fields))
    return "\n".join(lines) + "\n"


def in_account_home(home: Path, work: Path, argv: list[str]) -> list[str]:
    """The command line that runs `argv` with `home` as the account's home; the passwd copy
    is written in `work`."""
    root = os.geteuid() == 0
    passwd = work / "passwd"
    passwd.write_text(passwd_with_home(Path("/etc/passwd").read_text(), 0, home))  # uid 0 inside
    prefix = ["unshare", "--mount"] if root else ["unshare", "--user", "--map-root-user", "--mount"]
    return [*prefix, "sh", "-c", _BIND, str(passwd), *argv]


def home_env(home: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a user whose home is `home`, with no SSH agent."""
    env = dict(os.environ if base is None else base)
    env["HOME"] = str(home)
    env.pop("SSH_AUTH_SOCK", None)
    return env
