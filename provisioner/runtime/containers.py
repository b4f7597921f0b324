"""The shell both container runtimes use to touch a container only when it is this
cluster's: the owner lookup by the cluster-id label, the guard that leaves anyone else's
container alone (saying so), the guarded removal, and "run this only on ours".

Docker and Podman differ only in their words (`Words`): how the id label is read, where
the container is ("on this node", "of this user"), and the commands that remove a
container and tell whether it is still there.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.node import layout


@dataclass(frozen=True)
class Words:
    """A runtime's words. `owner(name)`: shell setting o to the container's cluster id
    label ("" when there is no such container, "-" when it carries none); `where`: how
    the message places it; `cli`: the runtime's command (the fix's `CLI rm -f NAME`);
    `remove(word)` / `exists(word)`: shell removing the (quoted) container, and telling
    whether it is still there."""

    owner: Callable[[str], str]
    where: str
    cli: str
    remove: Callable[[str], str]
    exists: Callable[[str], str]


def _id(cluster_id: str) -> str:
    return shlex.quote(cluster_id or "none")


def foreign_guard(words: Words, name: str, cluster_id: str, then: str) -> str:
    """Shell: when a container called `name` exists and does not carry this cluster's id
    label (another cluster's, or one without any id: not provably ours), say so on stderr
    and run `then` (`exit 3`: refuse; `:`: go on, leaving it alone). Nothing is ever
    removed or run into on a name alone."""
    return f"{words.owner(name)}; {foreign_verdict(words, name, cluster_id, then)}"


def foreign_verdict(words: Words, name: str, cluster_id: str, then: str) -> str:
    """Shell: `foreign_guard` once "$o" holds the container's id label ("": no such
    container, "-": it carries none), however it was read."""
    return (
        f'if [ -n "$o" ] && [ "$o" != {_id(cluster_id)} ]; then '
        'if [ "$o" = - ]; then w="carries no cluster id"; '
        'else w="belongs to another cluster (cluster id $o)"; fi; '
        f"echo \"the container {name} {words.where} $w, not this state folder's "
        f"(cluster id {cluster_id or 'none yet'}): left alone; if it is yours from another "
        "state folder, take it down from there, else remove it "
        f'({words.cli} rm -f {name})" >&2; '
        f"{then}; fi"
    )


def guarded_remove(words: Words, cluster: str, cluster_id: str) -> str:
    """Shell: remove this cluster's container (and one an older provisioner named
    `ray-CLUSTER`), each only when it carries this cluster's id label; succeeds when there
    is none. One without that label is left alone, and said so (`foreign_guard`)."""
    names = dict.fromkeys(
        (layout.container_name(cluster, cluster_id), layout.container_name(cluster))
    )
    steps = []
    for name in names:
        word = shlex.quote(name)
        steps.append(
            f"{foreign_guard(words, name, cluster_id, ':')}; "
            f'if [ -n "$o" ] && [ "$o" = {_id(cluster_id)} ]; then '
            f"{words.remove(word)} >/dev/null 2>&1; {words.exists(word)} >/dev/null 2>&1 && "
            f'{{ echo "the container {name} could not be removed" >&2; exit 1; }}; fi'
        )
    return "; ".join(steps) + "; exit 0"


def only_ours(words: Words, cluster: str, cluster_id: str, then: str) -> str:
    """Shell: run `then` (with the container's name in "$n") only when this cluster's
    container exists and carries its id label; else fail (exit 1)."""
    name = layout.container_name(cluster, cluster_id)
    return (
        f"n={shlex.quote(name)}; {words.owner(name)}; "
        f'[ -n "$o" ] && [ "$o" = {_id(cluster_id)} ] && {then}'
    )
