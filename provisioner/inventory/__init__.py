"""The inventory: which machines, how to reach them, and Ray's settings for them."""

from provisioner.inventory.loader import load_cluster, load_inventory
from provisioner.inventory.models import (
    PORT_BLOCK,
    Hop,
    HostKeyPolicy,
    Inventory,
    Node,
    RayPorts,
    Role,
    SSHSettings,
)

__all__ = [
    "PORT_BLOCK",
    "Hop",
    "HostKeyPolicy",
    "Inventory",
    "Node",
    "RayPorts",
    "Role",
    "SSHSettings",
    "load_cluster",
    "load_inventory",
]
