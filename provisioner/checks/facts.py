"""A node's facts: the output of facts.sh, parsed into plain data (no judging here).

facts.sh gathers what every runtime needs; the runtime's own section (`Judges.facts`, run in
the same round trip) is parsed by the runtime (`Judges.parse`) into a `RuntimeFacts`, which
the shared checks read through its generic fields and the runtime's judges through its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from provisioner.gpu.facts import GpuFacts, parse_gpu_facts

_SECTION = re.compile(r"^@@([a-z_]+)$")
_SS_PROCESS = re.compile(r'\("([^"]+)",pid=(\d+)')


@dataclass(frozen=True)
class Shell:
    """Python and Ray as one kind of shell sees them."""

    path: str = ""
    python3: str | None = None  # path
    python3_version: str | None = None
    ray: str | None = None  # path of the `ray` executable
    ray_version: str | None = None
    ray_python: str | None = None  # Python version of the interpreter `ray` runs with
    ray_interpreter: str | None = None  # that interpreter (the `ray` script's #! line)
    ray_stack: str | None = None  # "rllib=V torch=V gymnasium=V" of that interpreter
    # every distribution that interpreter has, by canonical name (None: not told)
    ray_dists: dict[str, str] | None = None


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket and, when known, its process."""

    address: str
    port: int
    process: str = ""
    pid: int | None = None


@dataclass(frozen=True)
class Disk:
    path: str
    total_kb: int
    free_kb: int


@dataclass(frozen=True)
class Container:
    name: str
    image: str
    state: str
    cluster_label: str
    id: str = ""  # full (Docker's API) or short (the CLI's)


@dataclass(frozen=True)
class RuntimeFacts:
    """What the node's runtime told about itself in the doctor's round, parsed by the runtime
    from its own section. A runtime extends it with fields of its own (its judges read them);
    the shared checks read only these."""

    usable: bool = True  # the runtime answers the SSH user without sudo (nothing to repair)
    data_root: str = ""  # where it keeps its images on the node ("": none; a disk to judge)
    containers: tuple[Container, ...] = ()  # its containers (Ray's, this cluster's or others')
    image: str = ""  # "sha256:ID os/arch" of the pinned image it holds ("": not held, no pin)
    remove: str = ""  # the command that removes its containers by name, for fixes ("": none)

    def holds_cluster(self, cluster: str, *, running: bool = False) -> bool:
        """A container of `cluster` is on this node (`running`: and it runs)."""
        return any(
            c.cluster_label == cluster and (not running or c.state == "running")
            for c in self.containers
        )


RuntimeParser = Callable[[Mapping[str, str]], RuntimeFacts]
"""A runtime's parser: the node's sections (`split_sections`) -> its facts."""


def no_runtime_facts(sections: Mapping[str, str]) -> RuntimeFacts:
    """The parser of a runtime with no section of its own."""
    return RuntimeFacts()


@dataclass(frozen=True)
class RayProcess:
    """A Ray process (or a process listening on a port) and whose it is."""

    pid: int
    ppid: int
    title: str  # raylet, gcs_server, ray::JobSupervisor, ... (or the listener's command)
    container: str = ""  # the Docker container it runs in (full ID), if any
    cluster: str = ""  # the cluster whose node directory its command line names (host mode)
    flags: tuple[tuple[str, str], ...] = ()  # raylet / gcs_server: its --*port= flags


@dataclass
class NodeFacts:
    """What one node told us in one round trip."""

    host: str
    clock: float | None = None
    clock_uncertainty: float = 0.0
    sent_at: float = 0.0
    received_at: float = 0.0
    user: str = ""
    groups: tuple[str, ...] = ()
    hostname: str = ""
    hostname_addresses: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    route_source: str | None = None
    arch: str = ""
    cpus: int = 0
    mem_total_kb: int = 0
    mem_available_kb: int = 0
    shm_kb: int | None = None
    sudo: str = ""
    disks: tuple[Disk, ...] = ()
    plain: Shell = field(default_factory=Shell)
    login: Shell = field(default_factory=Shell)
    ray_python: Shell = field(default_factory=Shell)  # the inventory's ray.python, if named
    listening: tuple[Listener, ...] = ()
    ray_processes: tuple[str, ...] = ()
    ray_owners: tuple[RayProcess, ...] = ()
    ray_session: str = ""
    rsync: str = ""
    # network filesystems mounted here: (mountpoint, type, source), from /proc/mounts
    net_mounts: tuple[tuple[str, str, str], ...] = ()
    listener_pid: int | None = None
    bound_ports: tuple[int, ...] = ()
    complete: bool = False  # the script ran to its end
    ray_state: str | None = None  # the runtime's state command's output, when asked for
    # the runtime's own facts (its section of the round, `Judges.facts`), parsed by it
    runtime: RuntimeFacts = field(default_factory=RuntimeFacts)
    gpu: GpuFacts = field(default_factory=GpuFacts)  # NVIDIA GPUs, driver, container toolkit


def _net_mounts(text: str) -> tuple[tuple[str, str, str], ...]:
    """`MOUNTPOINT TYPE SOURCE` lines (/proc/mounts' octal escapes kept as they are)."""
    found = []
    for line in _lines(text):
        words = line.split()
        if len(words) == 3 and words[0].startswith("/"):
            found.append((words[0], words[1], words[2]))
    return tuple(found)


def split_sections(text: str) -> dict[str, str]:
    """'@@name' headed sections -> {name: body}."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _SECTION.fullmatch(line)
        if match:
            current = sections.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _int(text: str, default: int = 0) -> int:
    try:
        return int(text.strip())
    except ValueError:
        return default


def parse_shell(text: str) -> Shell:
    values: dict[str, str] = {}
    for line in _lines(text):
        if line.startswith("%%") and "=" in line:
            key, _, value = line[2:].partition("=")
            values[key] = value.strip()
    python3, _, version = values.get("python3", "").partition(" ")
    stack, sep, dists = values.get("ray_stack", "").partition("|")
    return Shell(
        path=values.get("path", ""),
        python3=python3 or None,
        python3_version=version or None,
        ray=values.get("ray") or None,
        ray_version=values.get("ray_version") or None,
        ray_python=values.get("ray_python") or None,
        ray_interpreter=values.get("ray_interp") or None,
        ray_stack=stack.strip() or None,
        ray_dists=parse_dists(dists) if sep else None,
    )


def parse_dists(text: str) -> dict[str, str]:
    """Pure: `name=version name=version ...` (node text: anything) by canonical name."""
    found: dict[str, str] = {}
    for word in text.split():
        name, eq, version = word.partition("=")
        if eq and name and version:
            found[canonicalize_name(name)] = version
    return found


def parse_listening(text: str) -> tuple[Listener, ...]:
    """`ss -Htlnp` lines: STATE RECV-Q SEND-Q LOCAL PEER [users:(("name",pid=N,fd=M))]."""
    found = []
    for line in _lines(text):
        words = line.split()
        if len(words) < 5:
            continue
        local, users = words[3], " ".join(words[5:])
        address, _, port = local.rpartition(":")
        if not port.isdigit():
            continue
        match = _SS_PROCESS.search(users)
        process, pid = (match.group(1), int(match.group(2))) if match else ("", None)
        found.append(Listener(address.strip("[]"), int(port), process, pid))
    return tuple(found)


def _disks(text: str) -> tuple[Disk, ...]:
    disks = []
    for line in _lines(text):
        words = line.split()
        if len(words) >= 5 and words[2].isdigit() and words[4].isdigit():
            disks.append(Disk(words[0], int(words[2]), int(words[4])))
    return tuple(disks)


def _ray_owners(text: str) -> tuple[RayProcess, ...]:
    """`PID PPID TITLE CONTAINER CLUSTER [--flag=value ...]` lines ('-': none)."""
    found = []
    for line in _lines(text):
        words = line.split()
        if len(words) < 5 or not (words[0].isdigit() and words[1].isdigit()):
            continue
        flags = tuple(
            (k.lstrip("-").replace("-", "_"), v)
            for k, _, v in (w.partition("=") for w in words[5:])
        )
        found.append(
            RayProcess(
                pid=int(words[0]),
                ppid=int(words[1]),
                title=words[2],
                container="" if words[3] == "-" else words[3],
                cluster="" if words[4] == "-" else words[4],
                flags=flags,
            )
        )
    return tuple(found)


def _memory(text: str) -> dict[str, int]:
    values = {}
    for line in _lines(text):
        key, _, rest = line.partition(":")
        values[key] = _int(rest.split()[0]) if rest.split() else 0
    return values


def _listener(text: str) -> tuple[int | None, tuple[int, ...]]:
    pid, bound = None, []
    for line in _lines(text):
        words = line.split()
        if words[0] == "pid" and len(words) > 1:
            pid = _int(words[1])
        elif words[0] == "bound" and len(words) > 1:
            bound.append(_int(words[1]))
    return pid, tuple(bound)


def _first_words(text: str) -> tuple[str, ...]:
    """`getent ahosts` lines ('ADDRESS  STREAM NAME'): the distinct addresses, sorted."""
    return tuple(sorted({line.split()[0] for line in _lines(text)}))


def _addresses(text: str) -> tuple[str, ...]:
    """`ip -o addr show` lines: '2: eth0    inet 10.0.0.5/24 brd ...'."""
    found = []
    for line in _lines(text):
        words = line.split()
        if len(words) > 3 and words[2] in ("inet", "inet6"):
            found.append(words[3].split("/")[0])
    return tuple(found)


def _route_source(text: str) -> str | None:
    words = text.split()
    return words[words.index("src") + 1] if "src" in words[:-1] else None


def parse_facts(
    host: str,
    text: str,
    sent_at: float = 0.0,
    received_at: float = 0.0,
    *,
    runtime: RuntimeParser = no_runtime_facts,
) -> NodeFacts:
    """Parse facts.sh's output. `sent_at`/`received_at`: when the command went out and its
    first output came back (time.time()), to bound the node's clock offset; `runtime`: the
    runtime's parser of its own section (`Judges.parse`)."""
    s = split_sections(text)
    user_lines = _lines(s.get("user", ""))
    memory = _memory(s.get("memory", ""))
    shm_words = s.get("shm", "").split()
    clock_text = s.get("clock", "")
    pid, bound = _listener(s.get("listener", ""))
    return NodeFacts(
        host=host,
        clock=float(clock_text) if re.fullmatch(r"\d+(\.\d+)?", clock_text) else None,
        clock_uncertainty=max(0.0, (received_at - sent_at) / 2),
        sent_at=sent_at,
        received_at=received_at,
        user=user_lines[0] if user_lines else "",
        groups=tuple(user_lines[1].split()) if len(user_lines) > 1 else (),
        hostname=s.get("hostname", ""),
        hostname_addresses=_first_words(s.get("hostname_addresses", "")),
        addresses=_addresses(s.get("addresses", "")),
        route_source=_route_source(s.get("route", "")),
        arch=s.get("arch", ""),
        cpus=_int(s.get("cpus", "")),
        mem_total_kb=memory.get("MemTotal", 0),
        mem_available_kb=memory.get("MemAvailable", 0),
        shm_kb=_int(shm_words[1]) if len(shm_words) > 1 else None,
        sudo=s.get("sudo", ""),
        disks=_disks(s.get("disk", "")),
        plain=parse_shell(s.get("shell_plain", "")),
        login=parse_shell(s.get("shell_login", "")),
        ray_python=parse_shell(s.get("ray_python", "")),
        listening=parse_listening(s.get("listening", "")),
        ray_processes=tuple(_lines(s.get("ray_processes", ""))),
        ray_owners=_ray_owners(s.get("ray_owners", "")),
        ray_session=s.get("ray_session", ""),
        rsync=s.get("rsync", ""),
        net_mounts=_net_mounts(s.get("net_mounts", "")),
        listener_pid=pid,
        bound_ports=bound,
        complete="end" in s,
        ray_state=s.get("ray_state"),
        runtime=runtime(s),
        gpu=parse_gpu_facts(s),
    )
