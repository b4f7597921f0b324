"""What the doctor judges against: the inventory's intent and the image pin."""

from __future__ import annotations

from dataclasses import dataclass, field

from provisioner.inventory import Inventory, RayPorts
from provisioner.inventory.models import DEFAULT_RUNTIME
from provisioner.node.capabilities import Capabilities
from provisioner.node.storage import store_ports

CLOCK_WARN_S = 1.0
DISK_ERROR_GIB = 5.0  # the Ray image alone unpacks to about 2.5 GiB
DISK_WARN_GIB = 20.0
TMP_WARN_GIB = 2.0
MEMORY_WARN_GIB = 4.0
SHM_FRACTION = 0.3  # Ray's default object store: 30% of memory


@dataclass(frozen=True)
class PinFacts:
    """What the pinned image is and holds."""

    image_id: str
    python: str
    ray: str
    arch: str = ""  # e.g. amd64, when the pin records it
    cuda: str = ""  # the CUDA version of the image's torch ("": the CPU build, or unknown)
    # a project's pin (`image build --project`): its packages and their versions
    project: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Plan:
    ports: RayPorts
    head: str
    pin: PinFacts | None = None
    shm_size: int | None = None
    object_store_memory: int | None = None
    ray_up: bool = False  # the user will run Ray's own `ray up` with the rendered file
    runtime: str = DEFAULT_RUNTIME  # the runtime's name: which judges the doctor applies
    ray_python: str | None = None  # host mode: the interpreter the inventory names
    control_ray: str = ""  # the Ray version on this machine, which submits the jobs
    # the nodes may be shared (a SLURM allocation with its own port block): another Ray
    # on a node is someone else's, and only a clash on this cluster's ports is a fault
    shared_nodes: bool = False
    cluster: str = ""  # this cluster's name (another cluster's Ray is told apart from it)
    free_base: int | None = None  # a `port_base` free on every node, once the facts are in
    caps: Capabilities = field(kw_only=True)  # what the runtime does (`Runtime.caps`)
    runtime_label: str = field(default="", kw_only=True)  # its display name (`Judges.label`)
    # the head's store's ports (node.storage.store_ports), checked free on the head; none
    # with `storage: {kind: none}`
    storage_ports: dict[str, int] = field(default_factory=dict, kw_only=True)

    @property
    def label(self) -> str:
        """The runtime as the findings name it ("Docker", "Podman"; its name without one)."""
        return self.runtime_label or self.runtime


def plan_for(
    inventory: Inventory,
    pin: PinFacts | None,
    caps: Capabilities,
    *,
    ray_up: bool = False,
    control_ray: str = "",
    label: str = "",
) -> Plan:
    return Plan(
        ports=inventory.ports,
        head=inventory.head.name,
        pin=pin,
        shm_size=inventory.shm_size,
        object_store_memory=inventory.object_store_memory,
        ray_up=ray_up,
        runtime=inventory.runtime,
        ray_python=inventory.ray_python,
        control_ray=control_ray,
        shared_nodes=inventory.slurm is not None,
        cluster=inventory.cluster,
        caps=caps,
        runtime_label=label,
        storage_ports={} if inventory.storage == "none" else store_ports(inventory.ports),
    )
