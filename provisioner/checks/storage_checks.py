"""The doctor's `storage.shared`: is the folder the inventory names (`storage: {path: DIR}`)
the same filesystem on every node? A file written on the head must be read, whole, on every
other node. Pure: judges what the nodes answered (doctor.run gathers it)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from provisioner.checks.findings import Finding, error, ok

CHECK = "storage.shared"


def shared_write_command(path: str, name: str, token: str) -> str:
    """Shell, on the head: a file with `token` written in the shared folder (made if
    missing), then the folder's free space (`df -Pk`'s line: ... AVAILABLE_KB ...)."""
    target = shlex.quote(f"{path}/{name}")
    return (
        f"mkdir -p {shlex.quote(path)} && printf '%s' {shlex.quote(token)} > {target} && "
        f"df -Pk {shlex.quote(path)} | tail -1"
    )


def shared_read_command(path: str, name: str) -> str:
    """Shell, on every other node: the file's content (nothing when it cannot be read)."""
    return f"cat {shlex.quote(f'{path}/{name}')}"


def shared_remove_command(path: str, name: str) -> str:
    return f"rm -f {shlex.quote(f'{path}/{name}')}"


@dataclass(frozen=True)
class Answer:
    """One node's answer: its exit code and output, or why it did not answer."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""


def free_kb(df_line: str) -> int | None:
    """`df -Pk`'s line for the folder: its available KiB (the 4th column)."""
    words = df_line.split()
    return int(words[3]) if len(words) >= 4 and words[3].isdigit() else None


def judge_shared(
    path: str, head: str, token: str, wrote: Answer, reads: Mapping[str, Answer]
) -> list[Finding]:
    """An error for the head when it could not write, and for each node that did not read
    the head's file back; else one ok finding with the folder's free space."""
    fix_head = (
        f"make {path} writable by the SSH user on {head} (mkdir -p {path}; chown), or "
        "leave `storage:` out of the inventory (the head then serves a store)"
    )
    if wrote.exit_code != 0:
        return [
            error(
                CHECK, head, f"cannot write a file in {path}", wrote.stderr.strip()[-300:], fix_head
            )
        ]
    findings = []
    for name, got in sorted(reads.items()):
        if got.exit_code == 0 and got.stdout == token:
            continue
        why = (
            "a different file of that name (another filesystem)"
            if got.exit_code == 0
            else "no such file (another filesystem, or none mounted there)"
        )
        findings.append(
            error(
                CHECK,
                name,
                f"does not share {path} with {head}: the file written there reads as {why}",
                got.stderr.strip()[-300:],
                f"mount the filesystem {head} has at {path} on {name} too (the same export, "
                "the same path), or leave `storage:` out of the inventory (the head then "
                "serves a store)",
            )
        )
    if findings:
        return findings
    free = free_kb(wrote.stdout.strip().splitlines()[-1] if wrote.stdout.strip() else "")
    space = f", {free / 2**20:.1f} GiB free" if free is not None else ""
    return [
        ok(
            CHECK,
            "cluster",
            f"{path} is shared: written on {head}, read on {len(reads)} other node(s){space}",
        )
    ]


def candidates(mounts: Mapping[str, tuple[tuple[str, str, str], ...]]) -> list[Finding]:
    """Network filesystems mounted at the same path, from the same source, on every node
    (`NodeFacts.net_mounts` by node): named as candidates for `storage: {path: DIR}`, to
    be proven by storage.shared. Nothing when none is common (or no node answered)."""
    if not mounts:
        return []
    common = set.intersection(*(set(m) for m in mounts.values()))
    if not common:
        return []
    named = ", ".join(f"{path} ({kind} {source})" for path, kind, source in sorted(common))
    return [
        ok(
            CHECK,
            "cluster",
            f"network filesystems on every node: {named}; candidates for the inventory's "
            "storage: {path: DIR} (the doctor then proves it shared)",
        )
    ]
