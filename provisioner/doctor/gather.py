"""The remote side of the doctor: three short rounds per node, whatever the number of checks.

Round 1: facts.sh (all facts, the runtime's own section inside it, then a temporary
listener on Ray's ports).
Round 2: probe.sh (TCP connections to the other nodes' listeners).
Round 3: stop the listener (`up` sends it with each node's start instead).
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib import resources

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.gpu_checks import PROBE
from provisioner.checks.ports import Probe, listen_ports, parse_probe_output
from provisioner.inventory import Inventory, Node
from provisioner.remote import GroupResult, Pool, fan_out
from provisioner.remote.commands import script
from provisioner.runtime.protocol import Judges

FACTS_TIMEOUT_S = 60.0
RUNTIME_MARK = b"\n#@runtime-facts\n"  # where facts.sh takes the runtime's own section
STATE_MARK = b"\n#@ray-state\n"  # where it tells the runtime's state command's answer
STATE_START = b"\n#@ray-state-start\n"  # where that command starts, beside the rest
PROBE_CONNECT_S = 3.0
LISTEN_SECONDS = 120  # the listener's own end, should round 3 never come
LISTENER_MARK = "provisioner-doctor-listener"  # the last word of the listener's command line
RUN_MARK = "provisioner-doctor-run-"  # + the run's nonce: the word before LISTENER_MARK
STOP_DEADLINE_S = 2.0  # an interrupted doctor's stop of its listeners: Ctrl-C stays prompt
GPU_PROBE_S = 120.0  # a container start and `import torch` with CUDA


def _script(name: str) -> bytes:
    return resources.files("provisioner.doctor").joinpath(name).read_bytes()


def facts_script(judges: Judges, ray_state: str = "") -> bytes:
    """facts.sh with the runtime's own section in its place (before the disks are told, so
    that it may name its root), and `ray_state` (the runtime's state command, read-only)
    started first, beside everything else (on fd 7, its stdin /dev/null: the script itself
    comes on stdin), its answer told last."""
    text = _script("facts.sh")
    text = text.replace(RUNTIME_MARK, f"\n{judges.facts.strip()}\n".encode())
    start = f"\nexec 7< <({{ {ray_state}\n}} 2>&1 </dev/null)\n" if ray_state else "\n"
    state = "\nsection ray_state\ncat <&7\nexec 7<&-\n" if ray_state else "\n"
    text = text.replace(STATE_START, start.encode())
    return text.replace(STATE_MARK, state.encode())


def _deadline(inventory: Inventory, command_timeout: float) -> float:
    slowest = max(node.ssh.connect_timeout for node in inventory.nodes)
    return slowest * 3 + command_timeout + 5  # TCP, banner, auth; then the command


def gather_facts(
    pool: Pool,
    inventory: Inventory,
    image_ref: str,
    *,
    image_alt: str = "",
    reachability: bool,
    parallelism: int,
    ray_state: str = "",
    judges: Judges,
    nonce: str = "",
) -> GroupResult[NodeFacts]:
    """Round 1 on every node at once. `ray_state`: the runtime's state command, run in the
    same round (section `ray_state`), so that `up` asks no node twice; `judges`: the
    runtime's doctor (its facts section, run in the same round, and its parser: the given
    runtime's, `Runtime.judges`); `image_alt`: the pin's ID in Docker's containerd image
    store, asked where `image_ref` is not found; `nonce` (`new_nonce`): the run's, on the
    command line of each listener it starts (`stop_run_listeners` ends them by it)."""
    own = judges
    text = facts_script(own, ray_state)

    def one(node: Node) -> NodeFacts:
        ports = (
            ",".join(str(p) for p in listen_ports(node, inventory.ports)) if reachability else ""
        )
        args: list[str | int] = [
            inventory.head.ray_address,
            node.ray_address,
            image_ref,
            ports,
            LISTEN_SECONDS,
            inventory.ray_python or "",
            image_alt,
            nonce,
        ]
        result = pool.session(node).run(script("bash", args), timeout=FACTS_TIMEOUT_S, stdin=text)
        return parse_facts(
            node.name,
            result.stdout,
            result.started,
            result.first_byte or result.finished,
            runtime=own.parse,
        )

    return fan_out(
        inventory.nodes,
        one,
        parallelism=parallelism,
        deadline=_deadline(inventory, FACTS_TIMEOUT_S),
    )


def run_gpu_probes(
    pool: Pool, inventory: Inventory, commands: dict[str, str], *, parallelism: int
) -> GroupResult[str]:
    """Run each node's GPU probe (node name -> command); node name -> its stdout."""
    nodes = [node for node in inventory.nodes if node.name in commands]
    stdin = PROBE.encode()

    def one(node: Node) -> str:
        result = pool.session(node).run(commands[node.name], timeout=GPU_PROBE_S, stdin=stdin)
        return result.stdout + ("" if result.ok else result.stderr)

    return fan_out(nodes, one, parallelism=parallelism, deadline=_deadline(inventory, GPU_PROBE_S))


def run_probes(
    pool: Pool, inventory: Inventory, plan: dict[str, list[Probe]], *, parallelism: int
) -> tuple[dict[Probe, str], GroupResult[dict[Probe, str]]]:
    """Round 2: each node tries its probes; probe -> ok|refused|timeout|error|missing."""
    text = _script("probe.sh")
    nodes = [node for node in inventory.nodes if plan.get(node.name)]

    def one(node: Node) -> dict[Probe, str]:
        probes = plan[node.name]
        args: list[str | int] = [str(PROBE_CONNECT_S), *(f"{p.address}:{p.port}" for p in probes)]
        result = pool.session(node).run(
            script("bash", args), timeout=PROBE_CONNECT_S + 20, stdin=text
        )
        return parse_probe_output(node.name, probes, result.stdout)

    group = fan_out(
        nodes, one, parallelism=parallelism, deadline=_deadline(inventory, PROBE_CONNECT_S + 20)
    )
    outcomes: dict[Probe, str] = {}
    for value in group.results.values():
        outcomes.update(value)
    return outcomes, group


def stop_listener_command(pid: int) -> str:
    """End the doctor's listener PID if that process is still it (its command line carries
    LISTENER_MARK; a PID the node has given to another process since is left alone). Exits
    0 either way, so that it may go first in another command (`up`'s start)."""
    proc = f"/proc/{int(pid)}/cmdline"
    return f"{{ grep -qaF {LISTENER_MARK} {proc} && kill {int(pid)}; }} 2>/dev/null; true"


def listeners_of(facts: Mapping[str, NodeFacts]) -> dict[str, int]:
    """Node name -> the PID of its temporary listener, for the nodes that started one."""
    return {name: f.listener_pid for name, f in facts.items() if f.listener_pid}


def stop_listeners(
    pool: Pool, inventory: Inventory, pids: Mapping[str, int], *, parallelism: int = 32
) -> None:
    """Round 3: end the temporary listeners (node name -> PID; they also end by
    themselves)."""
    nodes = [n for n in inventory.nodes if n.name in pids]

    def one(node: Node) -> None:
        pool.session(node).run(stop_listener_command(pids[node.name]), timeout=10)

    fan_out(nodes, one, parallelism=parallelism, deadline=_deadline(inventory, 10))


def new_nonce() -> str:
    """A doctor run's own random name, carried by its listeners' command lines."""
    return secrets.token_hex(8)


def stop_run_listeners_command(nonce: str) -> str:
    """End every process of this user whose command line carries the doctor run's nonce
    (RUN_MARK + nonce) and LISTENER_MARK: the listeners that run started, whatever their
    PIDs (an interrupted run may not have read them). Another run's listener carries
    another nonce and is left alone, and so is this shell (it names the nonce too). Exits
    0 either way."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", nonce):
        raise ValueError(f"not a doctor run's nonce: {nonce!r}")
    run = shlex.quote(RUN_MARK + nonce)
    return (
        f"for f in $(grep -laF -e {run} /proc/[0-9]*/cmdline 2>/dev/null); do "
        'p=${f#/proc/}; p=${p%/cmdline}; [ "$p" = "$$" ] && continue; '
        f'grep -qaF -e {LISTENER_MARK} "$f" 2>/dev/null && kill "$p" 2>/dev/null; '
        "done; true"
    )


def stop_run_listeners(pool: Pool, nonce: str, *, parallelism: int = 32) -> None:
    """Best effort, within STOP_DEADLINE_S: end the listeners of the doctor run `nonce`
    over the connections the pool holds open (none is made: a node that never answered
    started no listener). For a run that did not end its rounds (Ctrl-C): without it,
    each listener holds Ray's ports until LISTEN_SECONDS."""
    sessions = pool.open_sessions()
    command = stop_run_listeners_command(nonce)

    def one(node: Node) -> None:
        sessions[node.name].run(command, timeout=STOP_DEADLINE_S)

    nodes = [node for node in pool.inventory.nodes if node.name in sessions]
    fan_out(nodes, one, parallelism=parallelism, deadline=STOP_DEADLINE_S)


@contextmanager
def listeners_ended_on_error(pool: Pool, nonce: str) -> Iterator[None]:
    """Around a doctor run's rounds: when they end by an error or Ctrl-C (any exception),
    the run's listeners are ended (`stop_run_listeners`) before it goes on up."""
    try:
        yield
    except BaseException:
        stop_run_listeners(pool, nonce)
        raise
