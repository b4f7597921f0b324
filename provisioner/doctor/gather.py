"""The remote side of the doctor: three short rounds per node, whatever the number of checks.

Round 1: facts.sh (all facts, the runtime's own section inside it, then a temporary
listener on Ray's ports).
Round 2: probe.sh (TCP connections to the other nodes' listeners).
Round 3: stop the listener (`up` sends it with each node's start instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.gpu_checks import PROBE
from provisioner.checks.ports import Probe, listen_ports, parse_probe_output
from provisioner.inventory import Inventory, Node
from provisioner.remote import GroupResult, Pool, fan_out
from provisioner.remote.commands import script
from provisioner.runtime.base import Judges

FACTS_TIMEOUT_S = 60.0
RUNTIME_MARK = b"\n#@runtime-facts\n"  # where facts.sh takes the runtime's own section
STATE_MARK = b"\n#@ray-state\n"  # where it tells the runtime's state command's answer
STATE_START = b"\n#@ray-state-start\n"  # where that command starts, beside the rest
PROBE_CONNECT_S = 3.0
LISTEN_SECONDS = 120  # the listener's own end, should round 3 never come
LISTENER_MARK = "provisioner-doctor-listener"  # the last word of the listener's command line
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
) -> GroupResult[NodeFacts]:
    """Round 1 on every node at once. `ray_state`: the runtime's state command, run in the
    same round (section `ray_state`), so that `up` asks no node twice; `judges`: the
    runtime's doctor (its facts section, run in the same round, and its parser: the given
    runtime's, `Runtime.judges`); `image_alt`: the pin's ID in Docker's containerd image
    store, asked where `image_ref` is not found."""
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
