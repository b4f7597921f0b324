"""Collect every node's Ray logs and the runtime's own log (the container's, or `ray
start`'s output); name the known errors found in them."""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from provisioner.console import Reporter, quiet
from provisioner.errors import ReceiveError
from provisioner.inventory import Inventory, Node
from provisioner.local import private_dir
from provisioner.node import layout
from provisioner.remote import Pool, Session, fan_out
from provisioner.remote.receive import Limits, check_name, receive_tar
from provisioner.runtime.protocol import Runtime

# What one node's logs may bring home (Ray's session logs are usually a few MiB).
LIMITS = Limits(
    members=20_000,
    file_bytes=256 * 1024 * 1024,
    total_bytes=512 * 1024 * 1024,
    compressed_bytes=128 * 1024 * 1024,
)
_LINE_CHARS = 64 * 1024  # a longer line is triaged in pieces


@dataclass(frozen=True)
class Pattern:
    name: str
    regex: re.Pattern[str]
    cause: str
    fix: str
    min_count: int = 1  # occurrences in one file before it counts (for loops)


PATTERNS: tuple[Pattern, ...] = (
    Pattern(
        "address-in-use",
        re.compile(r"Errno 98|[Aa]ddress already in use"),
        "a Ray port is taken by a stale Ray or another service",
        "run `provisioner down`, then `provisioner doctor` to see which process holds the port",
    ),
    Pattern(
        "version-mismatch",
        re.compile(r"[Vv]ersion mismatch|does not match the version|RuntimeError: Version"),
        "Ray or Python versions differ between nodes or between client and cluster",
        "run every node from the pinned image (`provisioner image push`, then `up`)",
    ),
    Pattern(
        "authentication",
        re.compile(
            r"UNAUTHENTICATED|[Aa]uthentication (?:token|failed|error)|AuthenticationError"
            r"|Invalid authentication token|Missing authentication token"
        ),
        "a process reached the cluster without the right token",
        "run `provisioner up` again (it installs the token on every node); "
        "clients need RAY_AUTH_MODE=token and the token",
    ),
    Pattern(
        "tls",
        re.compile(
            r"Handshake failed with fatal error|CERTIFICATE_VERIFY_FAILED"
            r"|PEER_DID_NOT_RETURN_A_CERTIFICATE|RAY_TLS_SERVER_KEY and RAY_TLS_CA_CERT must"
        ),
        "a process reached Ray without a certificate of this cluster's CA, or without TLS "
        "(a Ray of another cluster or of an old CA, a client started by hand)",
        "run `provisioner up` again (it gives every node its certificate); a process of "
        "your own needs RAY_USE_TLS=1 and the RAY_TLS_* files of a node of this cluster",
    ),
    Pattern(
        "oom-kill",
        re.compile(r"OutOfMemoryError|killed due to memory|[Oo]ut of memory|OOMKilled|oom-kill"),
        "a process was killed for lack of memory",
        "use fewer or smaller workers per node, or give the nodes more memory",
    ),
    Pattern(
        "lost-heartbeat",
        re.compile(
            r"missed too many heartbeats|failed to send heartbeat|health check failed"
            r"|marked as dead|node .* is dead|Failed to connect to GCS"
        ),
        "a node lost contact with the GCS (network cut, firewall, or the head went away)",
        "run `provisioner doctor` (port matrix between nodes), then `provisioner up`",
    ),
    Pattern(
        "worker-crash",
        re.compile(r"SIGSEGV|Segmentation fault|worker died|Worker crashed|core dumped"),
        "a Ray worker process crashed",
        "read the worker's log named here; `provisioner submit` reruns the job",
    ),
    Pattern(
        # Ray's event summary (`autoscaler/_private/event_summarizer.py`, v2's
        # `event_logger.py`): "Adding 1 node(s) of type local.cluster.node." for the local
        # provider's one type, "... of type ray-legacy-head-node-type." where a config went
        # through Ray's legacy translation; v2's scheduler: "Adding 1 nodes to satisfy min
        # count for node type: T." The node type is any.
        "launcher-adding-loop",
        re.compile(
            r"Adding \d+ node(?:\(s\)|s)? (?:of type \S|to satisfy min count for node type)"
        ),
        "Ray's launcher keeps asking for nodes it never starts: the autoscaler on the head "
        "does not count the nodes already running (autoscaler v2 with the local provider, "
        "a config of another shape than `provisioner render` writes, or the launcher's "
        "state file from an earlier `ray down`)",
        "use a cluster.yaml from `provisioner render` and remove /tmp/ray/cluster-NAME.state "
        "on the machine running `ray up` before it; or `provisioner up`",
        min_count=3,
    ),
    Pattern(
        # monitor.py, `destroy_autoscaler_workers`: after the monitor failed or was stopped
        # with RAY_AUTOSCALER_FATESHARE_WORKERS=1, its teardown of the workers raised; it
        # retries every 2 s, for ever.
        "monitor-cleanup-loop",
        re.compile(r"Monitor: Cleanup exception"),
        "Ray's monitor on the head failed or was stopped and, with "
        "RAY_AUTOSCALER_FATESHARE_WORKERS=1, tries to take the workers down through the "
        "launcher's config, which fails; it retries every 2 s and never exits",
        "read the monitor's first error above this line (monitor.log, monitor.err); unset "
        "RAY_AUTOSCALER_FATESHARE_WORKERS on the head, then `provisioner down` (it stops "
        "every node's Ray without the launcher) and `provisioner up`",
    ),
    Pattern(
        # commands.py, `teardown_cluster`: "2 random worker nodes will not be shut down.
        # (due to --keep-min-workers)" (bold/dim escapes between the words when coloured).
        "keep-min-workers",
        re.compile(r"random worker nodes will not be shut down.*keep-min-workers"),
        "a teardown kept min_workers workers running (`ray down --keep-min-workers`, or Ray's "
        "monitor cleaning up after its failure); a rendered cluster.yaml's min_workers is "
        "every worker, so no worker's Ray was stopped",
        "run `provisioner down -i INVENTORY` (it stops every node), or `ray down -y "
        "cluster.yaml` without --keep-min-workers",
    ),
)


@dataclass(frozen=True)
class LogMatch:
    """A known error pattern found in a collected log: where first, how often."""

    node: str
    file: str
    line: int
    pattern: str
    cause: str
    fix: str
    excerpt: str
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def triage_lines(lines: Iterable[str], *, node: str = "", file: str = "") -> list[LogMatch]:
    """Known error patterns in one file: the first line of each, with the count."""
    first: dict[str, tuple[int, str]] = {}
    counts: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        for p in PATTERNS:
            if p.regex.search(line):
                counts[p.name] = counts.get(p.name, 0) + 1
                first.setdefault(p.name, (number, line.strip()[:300]))
    found = []
    for p in PATTERNS:
        if counts.get(p.name, 0) >= p.min_count:
            number, excerpt = first[p.name]
            found.append(
                LogMatch(node, file, number, p.name, p.cause, p.fix, excerpt, counts[p.name])
            )
    return found


def triage_text(text: str) -> list[LogMatch]:
    return triage_lines(text.splitlines())


def triage_dir(root: Path) -> list[LogMatch]:
    """Every known error in ROOT/NODE/** (text files only). A file that cannot be read
    (a name too long for this filesystem, a permission) is passed over, never fatal."""
    findings: list[LogMatch] = []
    for path in _files(root):
        rel = path.relative_to(root)
        if len(rel.parts) < 2:
            continue
        try:
            with path.open(errors="replace") as f:
                lines: Iterator[str] = iter(lambda: f.readline(_LINE_CHARS), "")
                findings += triage_lines(lines, node=rel.parts[0], file=str(Path(*rel.parts[1:])))
        except OSError:
            continue
    return findings


def _files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, _dirs, files in os.walk(root):  # errors (unreadable folders) are skipped
        found += [Path(folder) / name for name in files]
    return sorted(found)


def _ray_logs_dir(inventory: Inventory) -> str:
    # The cluster's Ray temp dir on the node (every runtime keeps it there); session_latest
    # may be a link to a path inside a container, so the newest session is found by name.
    return (
        f"cd {layout.node_ray_dir(inventory.cluster)} 2>/dev/null && "
        "s=$(ls -d session_2* 2>/dev/null | sort | tail -n 1)"
    )


def runtime_log_name(runtime: Runtime) -> str:
    """The file name the runtime's own log gets in DIR/NODE/ (the runtime says)."""
    return runtime.log_file


def collect_command(runtime: Runtime) -> str:
    """Tar (base64) of the newest session's logs, plus the runtime's log, on stdout."""
    return (
        "t=$(mktemp -d) && trap 'rm -rf \"$t\"' EXIT && "
        f'{{ {runtime.runtime_log_command()}; }} >"$t/{runtime_log_name(runtime)}" 2>&1; '
        f'( {_ray_logs_dir(runtime.inventory)} && [ -n "$s" ] && cp -r "$s/logs" "$t/ray" ); '
        # only regular files and directories travel: the control machine refuses the rest
        'find "$t" -mindepth 1 ! -type f ! -type d -exec rm -f {} +; '
        'tar -C "$t" -czf - . | base64 -w0'
    )


def tail_command(runtime: Runtime, lines: int = 20) -> str:
    return (
        f"echo '== raylet.out'; ( {_ray_logs_dir(runtime.inventory)} && "
        f'tail -n {lines} "$s/logs/raylet.out" ); '
        f"echo '== {runtime.name} log'; {runtime.runtime_log_command(lines)}; true"
    )


def tail_node(session: Session, runtime: Runtime) -> str:
    """The last lines of a node's raylet log and the runtime's log."""
    text: str = session.run(tail_command(runtime), timeout=20).stdout
    return text


def receive_logs(blob: str, target: Path, node: str, *, limits: Limits = LIMITS) -> None:
    """Unpack a node's base64 tar.gz of logs into `target` (see provisioner.remote.receive)."""
    what = f"the logs of {node}"
    try:
        data = base64.b64decode(blob.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ReceiveError(
            f"refused {what}: the node's answer is not base64",
            f"run `provisioner logs` again; if it repeats, check `tar` and `base64` on {node}",
            where=node,
        ) from None
    if not data:
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
        return
    receive_tar(data, target, limits=limits, what=what, where=node)


def node_logs_dir(directory: Path, node: str) -> Path:
    """DIRECTORY/NODE, where a node's logs go: refused (ReceiveError) unless NODE is one
    plain folder name whose folder lies inside DIRECTORY once resolved. Node names from
    an inventory or a scheduler are checked where they are read; this holds whatever
    name arrives here (`../x`, `/x`, `a/b`, `.`)."""
    what = f"the logs of node {node!r}"
    parts = check_name(node, what=what, where=node)
    root = Path(os.path.realpath(directory))
    target = root / node
    if parts != (node,) or Path(os.path.realpath(target)).parent != root:
        raise ReceiveError(
            f"refused {what}: its name is not one folder name inside {directory}",
            "nothing was written; a node name is a host name: check the inventory, or the "
            "login node that named it",
            where=node,
        )
    return target


@dataclass
class Collected:
    directory: Path
    nodes: list[str]
    errors: dict[str, str]
    findings: list[LogMatch]

    def to_json(self) -> dict[str, Any]:
        return {
            "directory": str(self.directory) if self.nodes else None,  # none kept empty
            "nodes": self.nodes,
            "errors": self.errors,
            "findings": [f.to_json() for f in self.findings],
        }


def collect(
    inventory: Inventory,
    pool: Pool,
    report: Reporter = quiet,
    *,
    directory: Path,
    runtime: Runtime,
) -> Collected:
    """Fetch every node's logs into DIRECTORY/NODE/ and triage them."""
    command = collect_command(runtime)

    def one(node: Node) -> str:
        target = node_logs_dir(directory, node.name)  # before anything runs
        report(f"{node.name}: collecting logs")
        cap = LIMITS.compressed_bytes * 4 // 3 + 4
        result = pool.session(node).run(command, timeout=120, max_output=cap)
        result.check()
        if result.dropped:
            raise ReceiveError(
                f"refused the logs of {node.name}: over {LIMITS.compressed_bytes} bytes compressed",
                f"clear old Ray sessions on {node.name} (`provisioner down`, then `up`)",
                where=node.name,
            )
        receive_logs(result.stdout, target, node.name)
        return node.name

    made = _missing_folders(directory)
    private_dir(directory)  # before any node: a folder that cannot be made is bad input
    group = fan_out(inventory.nodes, one, deadline=150)
    if not group.results:  # no node's logs came: no empty folder left behind
        for folder in made:
            try:
                folder.rmdir()
            except OSError:
                break
    return Collected(directory, sorted(group.results), group.reasons(), triage_dir(directory))


def _missing_folders(directory: Path) -> list[Path]:
    """The folders of `directory` that do not exist yet, deepest first."""
    missing = []
    for folder in (directory, *directory.parents):
        if folder.exists():
            break
        missing.append(folder)
    return missing
