"""The chain, planned: who feeds whom, what each hop drops, the hop script.

Pure functions only (chain.py runs them). The nodes that lack layers form one chain,
ordered by how many of the pin's first layers each holds (fewest first, then inventory
order): the control machine sends the first node the layers it lacks, and every node
streams what it receives on to the next one while its own `docker load` reads it. A
node that holds more layers than the one before it gets the stream with the files of
those layers cut out (`tar --delete` on the pipe), so every node receives only the
layers it lacks. A node that holds everything is not in the chain.

Each node sends at most one stream in a round. A node that fails mid-chain leaves the
nodes after it with a broken stream; the next round re-feeds them, in a chain of their
own, from a node that holds the verified image and has sent the least (so no node sends
more than about two images), or from the control machine when no node holds it.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from provisioner.image.savestream import SavedImage
from provisioner.runtime.docker.push_plan import NodePlan

HOP_SCRIPT = "hop"  # the script each node runs for the stream it receives, in its relay dir
RECEIVED = "received"  # bytes the node's hop read from its sender, counted by `wc -c`
STARTED = "started"  # made by a round's hop when it starts: a second start is refused
# The image tags the stream's own manifest gave (`docker load`'s "Loaded image: NAME"): a
# pin's stream is a `docker save` by image ID and carries none, so any tag is the sender's
# own doing; each is removed and the node's earlier image of that name (TAGS_BEFORE)
# tagged again, and the round fails on that node (the control machine reads FOREIGN).
FOREIGN = "foreign"
TAGS_BEFORE = "tags.before"
FOREIGN_RC = 4  # the hop's exit status when its stream carried tags
HOP_PIDS = "hop.pids"  # each round's hop appends its pid: the push's end ends any left
SEND_KEY = "send.key"  # a sender's private half of its edge's key, in its relay dir
SEND_KNOWN_HOSTS = "send.known_hosts"  # the host keys of its receiver only
ALIVE_S = 10  # a hop's ssh ends ~30 s after the next node stops answering
KEY_BASE_S = 60  # an edge key's lifetime: this, plus KEY_PER_HOP_S per hop of the round
KEY_PER_HOP_S = 15  # on top of each hop's connect timeout


@dataclass(frozen=True)
class Hop:
    """One node of a round's chain: what it holds, whom it feeds, which files it drops."""

    node: str
    first_missing: int  # the node holds the pin's first layers up to here
    next: str | None = None
    drop: tuple[str, ...] = ()  # tar members the next node holds: cut before forwarding


@dataclass(frozen=True)
class Chain:
    """One round: the feeder (None: the control machine) and the hops in stream order."""

    feeder: str | None
    hops: tuple[Hop, ...]

    @property
    def first_missing(self) -> int:
        """What the feeder sends: the pin's layers from here on."""
        return self.hops[0].first_missing if self.hops else 0

    def edges(self) -> list[tuple[str, str]]:
        """(sender, receiver) of every node-to-node stream of the round: the feeder's
        into the first hop, then each hop's into the next (the control machine's own
        stream goes over its SSH session, with no relay key)."""
        out = [(self.feeder, self.hops[0].node)] if self.feeder and self.hops else []
        return out + [(h.node, h.next) for h in self.hops if h.next]

    def sender_of(self, node: str) -> str:
        """Who sent `node` its stream ("control" for the control machine)."""
        before = self.feeder or "control"
        for hop in self.hops:
            if hop.node == node:
                return before
            before = hop.node
        raise KeyError(node)


def chain_order(plans: Mapping[str, NodePlan], inventory_order: Sequence[str]) -> list[str]:
    """The nodes that need layers, fewest held first, then in inventory order."""
    rank = {name: i for i, name in enumerate(inventory_order)}
    send = [n for n, p in plans.items() if p.action == "send"]
    return sorted(send, key=lambda n: (plans[n].first_missing, rank.get(n, len(rank))))


def layer_members(saved: SavedImage, first: int) -> set[str]:
    """The tar members (as named in the saved file) holding the pin's first `first`
    layers and no later one: a later layer's file may be a link to an earlier one."""
    by_name = {_norm(m.name): m for m in saved.members}
    needed = set(saved.layer_files[first:])
    for name in list(needed):
        member = by_name.get(name)
        if member is not None and member.issym():
            needed.add(
                _norm(posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname)))
            )
    held = set(saved.layer_files[:first]) - needed
    return {m.name for m in saved.members if m.isfile() and _norm(m.name) in held}


def _norm(name: str) -> str:
    return name.removeprefix("./")


def first_chain(
    order: Sequence[str], plans: Mapping[str, NodePlan], saved: SavedImage | None
) -> Chain:
    """Round one, fed by the control machine. `saved` (the saved image's index) names
    the files to cut where a node holds more layers than the one before it; None when
    every node of the chain lacks the same layers (nothing to cut)."""
    hops: list[Hop] = []
    for i, name in enumerate(order):
        nxt = order[i + 1] if i + 1 < len(order) else None
        drop: tuple[str, ...] = ()
        if nxt is not None and plans[nxt].first_missing > plans[name].first_missing:
            if saved is None:
                raise ValueError(
                    "the chain's nodes lack different layers: the saved index is needed"
                )
            cut = layer_members(saved, plans[nxt].first_missing) - layer_members(
                saved, plans[name].first_missing
            )
            drop = tuple(sorted(cut))
        hops.append(Hop(name, plans[name].first_missing, nxt, drop))
    return Chain(None, tuple(hops))


def refeed_chain(failed: Sequence[str], holders: Sequence[str], sent: Mapping[str, int]) -> Chain:
    """A later round: the nodes still lacking the image, fed by the holder that has sent
    the fewest bytes so far (None: the control machine, when no node holds it). The
    holder's own `docker save` carries the whole image; a node skips the layers it holds."""
    feeder = (
        min(holders, key=lambda h: (sent.get(h, 0), list(holders).index(h))) if holders else None
    )
    hops = [
        Hop(name, 0, failed[i + 1] if i + 1 < len(failed) else None)
        for i, name in enumerate(failed)
    ]
    return Chain(feeder, tuple(hops))


def hop_script(directory: str, next_ssh: Sequence[str] | None, drop: Sequence[str]) -> str:
    """The script a node runs on the stream it receives (written to DIR/hop; the relay
    key's forced command on that node runs it). It counts the bytes it receives, loads
    them, and forwards them at the same time to `next_ssh` (an ssh command line to the
    next node), without the files in `drop`. `tee -p` keeps going when one reader stops:
    a next node that fails does not break this node's load, and a load that fails does
    not stop the forwarding. It waits for the forwarding to end before it exits, so the
    feeder's stream ends when the whole chain is done."""
    d = shlex.quote(directory)
    lines = [
        f"cd {d} || exit 1",
        # one stream per round: the relay key that runs this can load once, not again
        f"mkdir {STARTED} 2>/dev/null || "
        "{ echo 'hop: this round has received its stream already' >&2; exit 3; }",
        f"rm -f fwd cnt {RECEIVED} load.out load.rc fwd.rc {FOREIGN} {TAGS_BEFORE}",
        f"echo $$ >> {HOP_PIDS}",
        "mkfifo cnt",
        f"wc -c < cnt > {RECEIVED} &",
        "w=$!",
    ]
    outputs = "cnt"
    if next_ssh is not None:
        filt = (
            ("tar --delete -f - " + " ".join(shlex.quote(m) for m in drop) + " < fwd | ")
            if drop
            else ""
        )
        src = "" if drop else " < fwd"
        ssh = " ".join(shlex.quote(a) for a in next_ssh)
        lines += [
            "mkfifo fwd",
            f"{{ {filt}{ssh}{src} >/dev/null 2>fwd.err; echo $? > fwd.rc; }} &",
            "f=$!",
        ]
        outputs = "fwd cnt"
    lines += guarded_load_lines(f"tee -p {outputs} | ")
    if next_ssh is not None:
        lines.append('wait "$f"')
    lines += ['wait "$w"', 'exit "$(cat load.rc)"']
    return "\n".join(lines) + "\n"


def guarded_load_lines(feed: str = "") -> list[str]:
    """`docker load` of the stream on stdin (through `feed`, a pipeline's start such as
    "tee -p fwd cnt | "), keeping none of the tags the stream names: shell lines, run in
    a private folder (they write TAGS_BEFORE, load.out, load.rc and FOREIGN there). The
    node's tags are recorded before the load; a tag `docker load` reports ("Loaded image:
    NAME") is the sender's doing (a pin's stream is saved by ID and names none): it is
    removed, the node's earlier image of that name tagged again, and load.rc made
    FOREIGN_RC. The one guard of every stream a node receives from another (the chain's
    hops, the star's workers). No line ends in `&`, `then` or `do`: joined with "; "
    they are one line too (an authorized_keys forced command)."""
    return [
        "docker image ls --no-trunc --format '{{.Repository}}:{{.Tag}} {{.ID}}' "
        f"> {TAGS_BEFORE} 2>/dev/null </dev/null",
        f"{feed}docker load > load.out 2>&1",
        "echo $? > load.rc",
        # the pin's stream names no tag: one it names is the sender's, and goes
        f"sed -n 's/^Loaded image: //p' load.out > {FOREIGN}",
        f"if [ -s {FOREIGN} ]; then while IFS= read -r t; do "
        'docker rmi --no-prune "$t" </dev/null >/dev/null 2>&1 || '
        'docker rmi -f --no-prune "$t" </dev/null >/dev/null 2>&1; '
        f"old=$(awk -v t=\"$t\" '$1 == t {{print $2; exit}}' {TAGS_BEFORE}); "
        '[ -z "$old" ] || docker tag "$old" "$t" </dev/null >/dev/null 2>&1; '
        f"done < {FOREIGN}; echo {FOREIGN_RC} > load.rc; fi",
    ]


def remove_relay_dir_command(directory: str) -> str:
    """Run on a node once the push ended: any hop of it still running there (a round cut
    off mid-stream, whose load and forwarding wait on streams that never end) ended with
    its process group (sshd starts a session's command as a group of its own: the hop's
    tee, docker load, wc and its ssh to the next node), then the relay dir removed. A pid
    is taken as the hop's only while its command line still names the hop script."""
    d = shlex.quote(directory)
    return (
        f'for p in $(cat {d}/{HOP_PIDS} 2>/dev/null); do case "$p" in ""|*[!0-9]*) continue;; '
        'esac; tr "\\000" " " < /proc/"$p"/cmdline 2>/dev/null | grep -q "/hop" || continue; '
        'g=$(ps -o pgid= -p "$p" | tr -d " "); '
        'case "$g" in ""|*[!0-9]*|0|1) continue;; esac; kill -9 -"$g" 2>/dev/null; done; '
        f"rm -rf {d}"
    )


def feed_command(image_id: str, first_ssh: Sequence[str]) -> str:
    """Run on a holder: its `docker save` of the pin, into the first node's hop."""
    ssh = " ".join(shlex.quote(a) for a in first_ssh)
    script = f"set -o pipefail; docker save {shlex.quote(image_id)} | {ssh}"
    return f"bash -c {shlex.quote(script)}"


def hop_command(directory: str) -> str:
    """The relay key's forced command on a node: its hop script, nothing else."""
    return f"sh {directory}/{HOP_SCRIPT}"


def write_hop_command(directory: str) -> str:
    """Run on a node before a round: its hop script (from stdin) in place, and the
    round's one start allowed again."""
    d = shlex.quote(directory)
    return f"rm -rf {d}/{STARTED} && cat > {d}/{HOP_SCRIPT}"


def private_file_command(directory: str, name: str) -> str:
    """Run on a node: stdin into a 0600 file of its relay dir (a sender's edge key, its
    receiver's known_hosts)."""
    return f"umask 077 && cat > {shlex.quote(directory)}/{name}"


def drop_sender_files_command(directory: str) -> str:
    """Run on a round's sender after the round: its edge key and known_hosts gone."""
    d = shlex.quote(directory)
    return f"rm -f {d}/{SEND_KEY} {d}/{SEND_KNOWN_HOSTS}"


def edge_key_lifetime_s(hops: int, connect_timeout_s: float) -> int:
    """How long an edge key is valid (sshd's `expiry-time`, checked when a connection
    authenticates, not after): every edge of a round connects when the round starts,
    one hop after the other, each within its connect timeout."""
    return KEY_BASE_S + max(1, hops) * (int(connect_timeout_s) + KEY_PER_HOP_S)


def sent_bytes(chain: Chain, received: Mapping[str, int]) -> dict[str, int]:
    """Bytes each sender put on the wire in one round, as the receiver counted them:
    a sender sent what its next node received ("control" for the control machine)."""
    out: dict[str, int] = {}
    for hop in chain.hops:
        sender = chain.sender_of(hop.node)
        out[sender] = out.get(sender, 0) + received.get(hop.node, 0)
    return out


def round_result_command(directory: str) -> str:
    """Run on a node after a round: the bytes its hop received, then each tag its stream
    carried that the hop removed (`tag: NAME`, one a line)."""
    d = shlex.quote(directory)
    return f"cat {d}/{RECEIVED}; echo; sed 's/^/tag: /' {d}/{FOREIGN} 2>/dev/null; true"


def parse_round_result(stdout: str) -> tuple[int, list[str]]:
    """`round_result_command`'s answer: (bytes received, the tags the stream carried)."""
    lines = stdout.splitlines()
    tags = [line.removeprefix("tag: ") for line in lines[1:] if line.startswith("tag: ")]
    return parse_received(lines[0] if lines else ""), tags


def parse_received(stdout: str) -> int:
    """A node's RECEIVED file (`wc -c` output); 0 when missing or unreadable."""
    word = stdout.strip().split()[:1]
    return int(word[0]) if word and word[0].isdigit() else 0
