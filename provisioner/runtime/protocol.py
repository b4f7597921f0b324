"""The protocol every runtime implements: what `up`, `status`, `down`, `logs`, `render`,
the doctor and the probes need from "Ray on a node".

A runtime is built for one cluster (`runtime_for(inventory, pin)`) and answers with pure,
quoted command strings and pure parsers; the verbs in `provisioner.cluster` run them over
SSH. Options a later runtime needs (GPUs, a block of ports) come from the inventory and its
nodes, so the callers never change: `start_command(node)` is all `up` asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from provisioner.checks.facts import RuntimeParser, no_runtime_facts
from provisioner.node.capabilities import Capabilities
from provisioner.node.delivery import DeliveryReport, NodeDelivery

if TYPE_CHECKING:
    from pathlib import Path

    from provisioner.checks.facts import NodeFacts
    from provisioner.checks.findings import Finding
    from provisioner.checks.intent import Plan
    from provisioner.console import Reporter
    from provisioner.gpu.assignment import GpuPlan
    from provisioner.gpu.facts import GpuFacts
    from provisioner.inventory import Inventory, Node
    from provisioner.remote import Pool, Session
    from provisioner.runtime.delivery_options import PushOptions


@dataclass(frozen=True)
class LabRecipe:
    """What the lab (`provisioner.lab`, which asks each runtime for it: the runtime never
    imports the lab) builds for a node of this runtime: `about`, what its nodes have (the
    lab's --runtime help); `dockerfile`, the lab's node recipe (lab/recipe/) its nodes are
    built from; `storage`, where a node's storage folder is mounted in it (its image
    store); `docker_stores`: its nodes run Docker, so a flavour may switch Docker's image
    store; `pinned_image`: Ray runs in the pinned image, so the lab's inventory names the
    pin; `slurm`: a SLURM lab's nodes run Ray this way."""

    about: str
    dockerfile: str
    storage: str = "/var/lib/docker"
    docker_stores: bool = False
    pinned_image: bool = False
    slurm: bool = False


# The states (Docker's and Podman's container states) of a Ray that is present but gone.
ENDED = frozenset({"exited", "dead", "restarting", "removing"})


@dataclass(frozen=True)
class RayState:
    """This cluster's Ray on one node, as its runtime sees it."""

    status: str = "absent"  # absent | running | exited | restarting | created | ...
    runs: str | None = None  # what it runs: the image ID (docker), the interpreter (host)
    started_at: str | None = None
    restarts: int = 0
    exit_code: int | None = None
    oom_killed: bool = False
    gpus: str | None = None  # the GPUs it was given (gpu.assignment.signature); None: not recorded
    # the shared folder it mounts (`storage: {path: DIR}`; "" none); None: not recorded
    storage: str | None = None

    @property
    def running(self) -> bool:
        return self.status == "running"

    @property
    def absent(self) -> bool:
        """Nothing of this cluster's Ray on the node: nothing for its stop to remove."""
        return self.status == "absent"

    @property
    def ended(self) -> bool:
        """Present but stopped for good, or coming back as a fresh Ray: whatever ran in
        it (a job's driver, Ray's job supervisor) is lost."""
        return self.status in ENDED


@dataclass(frozen=True)
class Judges:
    """A runtime's pure doctor judges, applied to the facts of the doctor's one round trip.

    `node`: its checks of one node; `cluster`: across nodes (versions); `own_ray`: whether
    the facts show this cluster's own Ray running on the node (its busy ports and
    processes are then that Ray, not a fault: the one own-Ray waiver); `facts`: the
    runtime's own section of that round trip (bash, run inside the doctor's facts script
    with its helpers); `parse`: its parser (the node's sections -> `NodeFacts.runtime`);
    `label`: its name in findings ("Docker"); `checks`: the checks it adds to the doctor's
    catalogue (id -> what it looks at)."""

    node: Callable[[Node, NodeFacts, Plan], list[Finding]]
    cluster: Callable[[dict[str, NodeFacts], Plan], list[Finding]]
    own_ray: Callable[[NodeFacts, str], bool]
    facts: str = ""
    parse: RuntimeParser = no_runtime_facts
    label: str = ""
    checks: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderSection:
    """What a runtime puts into Ray's cluster.yaml (`provisioner render`)."""

    config: dict[str, Any]  # top-level keys: docker, file_mounts (the token file)
    before_start: tuple[str, ...] = ()  # on every node before `ray start`
    head_before_start: tuple[str, ...] = ()  # on the head, after those
    env: str = ""  # `VAR=value ` words before `ray start`
    start_flags: tuple[str, ...] = ()  # trusted text added to `ray start`
    initialization: tuple[str, ...] = ()  # on every node's host, before anything of Ray


PUSH_MODES = ("auto", "direct", "chain")
"""`up --push`: direct, every node from this machine; chain, this machine sends once into a
chain of the nodes lacking layers, each streaming on what it receives (`image push
--chain`); auto, the chain when two or more nodes lack layers (it then sends less over this
machine's link), else direct. The third shape, the star (`image push --star`: the head sends
to every worker), is not a mode of `up`."""

PUSH_ALIASES = {"relay": "chain"}
"""Deprecated names of a push mode, still accepted with a note: `--push relay` was the
chain."""


class Delivery(Protocol):
    """How a runtime makes every node hold the image Ray runs there: whether a node has it
    (a command and a pure parser), delivering it, verifying it by ID. The doctor's round
    may already have seen nodes holding it (`DoctorReport.holding`): they are `ready`."""

    image_id: str  # the pinned image's ID, as the pin writes it (`sha256:` and hex)

    def has_command(self) -> str:
        """Shell: what the node's image store holds under the pinned ID (one round trip,
        for `holds`; it succeeds when the node holds nothing)."""
        ...

    def holds(self, stdout: str) -> bool:
        """Pure: whether `has_command`'s output shows the pinned image under exactly its ID."""
        ...

    def verify(self, session: Session) -> None:
        """Check on the node of `session` that it holds the pinned image under exactly its
        ID (after a load: one that left another image is a RemoteError naming what the
        node holds)."""
        ...

    def deliver(
        self, pool: Pool, report: Reporter, *, ready: Mapping[str, str] | None = None
    ) -> DeliveryReport:
        """Make every node of the inventory hold the image, each verified by ID; `ready`:
        nodes known to hold it (node name -> the ID the node's image store names it by, as
        the doctor saw it), which are not asked again. One node's failure stops no other:
        it is in the report's `errors`."""
        ...


class Runtime(Protocol):
    """How Ray runs on the nodes of one cluster."""

    name: str  # its name in the registry (shown to users; never branched on outside runtime/)
    caps: Capabilities  # what it does, for the callers that must know
    log_file: str  # the file name its own log gets in `logs`' folder of a node
    inventory: Inventory
    push: str  # how its delivery sends the image: one of PUSH_MODES
    starting: str  # progress line of a start, with {role}: "starting the {role} container"
    stopping: str  # progress line of a stop: "removing the Ray container"
    image_id: str  # the image ID Ray runs in ("": none, Ray runs from the node's own Python)

    def delivery(self, options: PushOptions | None = None) -> Delivery | None:
        """How the nodes get the image Ray runs (docker: the push of the pin; podman:
        `podman load`); None: nothing to deliver (host: the nodes bring their own Ray).
        `up` delivers before any start. `options`: the push `image push` asks for (its
        flags; a shape this runtime's delivery does not have is an InputError); None: the
        way `push` says."""
        ...

    def image_alt_id(self) -> str:
        """The pin's ID in another image store the nodes may name it by, when this machine
        can tell it (docker: the containerd store's, from the pin saved here); "" otherwise.
        The doctor asks the nodes for it beside the pin's own ID."""
        ...

    def state_command(self) -> str:
        """One node's `RayState`, as text for `parse_state` (one round trip)."""
        ...

    def parse_state(self, stdout: str) -> RayState:
        """Pure: the output of `state_command`."""
        ...

    def started_state(self) -> RayState:
        """Pure: the state of a node right after `start_command` succeeded there."""
        ...

    def is_current(self, state: RayState) -> bool | None:
        """Pure: whether the node runs what the cluster pins (None: unknown or not pinned)."""
        ...

    def start_command(self, node: Node, gpus: GpuPlan | None = None) -> str:
        """Start this cluster's Ray on `node`, detached from the SSH session; returns when
        Ray's processes are started (a worker's Ray then waits for the head's by itself).
        `gpus`: the node's GPUs for Ray and how they reach it (`cluster.gpus.plan_gpus`)."""
        ...

    def stop_command(self, node: Node) -> str:
        """Stop this cluster's Ray on `node` and nothing else; succeeds when none runs."""
        ...

    def gpu_probe_command(self, image: str, gpus: GpuPlan) -> str | None:
        """The doctor's --gpu-deep probe: run the probe script from stdin where Ray would
        run on a GPU node of `image`, with `gpus` handed over as `up` does (None: this
        runtime has no such place to check)."""
        ...

    @property
    def judges(self) -> Judges:
        """The doctor's judges of its nodes."""
        ...

    def gpu_methods(self, facts: GpuFacts) -> tuple[str, ...]:
        """Pure: the ways this runtime can hand the node's GPUs to Ray, preferred first
        (none: no way in, which the doctor reports)."""
        ...

    def running_test(self) -> str:
        """A shell condition, true while this cluster's Ray runs on the node."""
        ...

    def python_command(self, *args: str) -> str:
        """Run a Python script read from stdin where Ray runs (with the cluster's token)."""
        ...

    def sockets_command(self) -> str:
        """Shell: the inode of every socket this cluster's own Ray processes hold on the
        node, one a line (none when its Ray does not run there): what proves a listener is
        this cluster's (`cluster.tunnel.check_listener`)."""
        ...

    def runtime_log_command(self, lines: int | None = None) -> str:
        """The runtime's own log of Ray on the node (container log, start output) on
        stdout; its last `lines` when given."""
        ...

    def render_section(self, token_path: Path, tls_dir: Path | None = None) -> RenderSection:
        """How Ray runs, for Ray's own launcher (`ray up`); `token_path`: the local token;
        `tls_dir`: the local TLS files every node gets (`node.tls.render_files`; None: Ray
        runs without TLS)."""
        ...


__all__ = [
    "PUSH_ALIASES",
    "PUSH_MODES",
    "Capabilities",
    "Delivery",
    "DeliveryReport",
    "Judges",
    "LabRecipe",
    "NodeDelivery",
    "RayState",
    "RenderSection",
    "Runtime",
]
