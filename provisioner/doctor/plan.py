"""What the doctor judges against: the inventory's intent and the image pin."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.inventory import Inventory, RayPorts

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


@dataclass(frozen=True)
class Plan:
    ports: RayPorts
    head: str
    pin: PinFacts | None = None
    shm_size: int | None = None
    object_store_memory: int | None = None
    ray_up: bool = False  # the user will run Ray's own `ray up` with the rendered file

    @property
    def host_mode(self) -> bool:
        """Without a pin, Ray would come from the nodes' own PATH."""
        return self.pin is None


def plan_for(inventory: Inventory, pin: PinFacts | None, *, ray_up: bool = False) -> Plan:
    return Plan(
        ports=inventory.ports,
        head=inventory.head.name,
        pin=pin,
        shm_size=inventory.shm_size,
        object_store_memory=inventory.object_store_memory,
        ray_up=ray_up,
    )
