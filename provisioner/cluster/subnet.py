"""The cluster-wide `ray: {subnet: CIDR}`: each node's Ray address is its own address in that
network. Only the node knows its interfaces, so it is asked (one round trip per node,
`ip -o addr`); the pure parse and pick are apart. Every verb that needs Ray addresses (the
doctor, up, status, down) calls `resolve_ray_subnet` once it holds the nodes."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import replace

from provisioner.console import Reporter, quiet
from provisioner.errors import CommandFailed, InventoryError
from provisioner.inventory import Inventory, Node
from provisioner.inventory.address import checked_address
from provisioner.remote import Pool, fan_out

# every address of every interface, one a line ("2: eth1    inet 10.10.0.3/24 brd ..."); a
# node without iproute2: `hostname -I`'s list
ADDRESSES_COMMAND = "ip -o addr show 2>/dev/null || hostname -I"
_INET = re.compile(r"\binet6?\s+([0-9A-Fa-f:.]+)(?:/\d+)?")


def parse_addresses(stdout: str) -> list[str]:
    """The addresses `ip -o addr show` lists, in its order (IPv4 and IPv6); without an
    `inet` line, the words of `hostname -I` that are addresses."""
    matches = [m.group(1) for m in map(_INET.search, stdout.splitlines()) if m is not None]
    found: list[str] = []
    for word in matches if matches else stdout.split():
        try:  # the one address check: a scope id only of an interface's name
            found.append(str(ipaddress.ip_address(checked_address(word))))
        except ValueError:
            continue
    return found


def pick(node: str, subnet: str, addresses: list[str], where: str = "") -> str:
    """The node's first address inside `subnet`; none there is an InventoryError naming
    the node, the subnet and the addresses the node has."""
    network = ipaddress.ip_network(subnet, strict=False)
    for address in addresses:
        ip = ipaddress.ip_address(address)
        if ip.version == network.version and ip in network:
            return address
    raise InventoryError(
        f"{node}: no address in ray.subnet {subnet}; it has {', '.join(addresses) or 'none'}",
        f"connect {node} to {subnet}, correct ray.subnet, or give {node} its own "
        "`ray: {address}` on the network that carries Ray's traffic",
        where=where,
    )


def with_ray_addresses(inventory: Inventory, found: Mapping[str, str]) -> Inventory:
    """The inventory whose nodes named in `found` carry that Ray address (none when it is the
    SSH address), the subnet resolved (so a second call changes nothing)."""

    def one(node: Node) -> Node:
        address = found.get(node.name)
        if address is None or node.data_address is not None:
            return node
        return replace(node, data_address=None if address == node.address else address)

    return replace(
        inventory,
        head=one(inventory.head),
        workers=tuple(one(w) for w in inventory.workers),
        ray_subnet=None,
    )


def resolve_ray_subnet(inventory: Inventory, pool: Pool, report: Reporter = quiet) -> Inventory:
    """The inventory with each node's Ray address in `ray.subnet` (a node's own
    `ray: {address}` wins); unchanged without a subnet. A node not reached keeps its SSH
    address (the verb then names it as it names any node it cannot reach); a node reached
    that could not list its addresses is that error."""
    if inventory.ray_subnet is None or not inventory.allocated:
        return inventory
    subnet = inventory.ray_subnet
    asked = [n for n in inventory.nodes if n.data_address is None]
    report(f"asking {len(asked)} node(s) for their address in {subnet}")
    group = fan_out(
        asked,
        lambda n: pool.session(n).run(ADDRESSES_COMMAND, timeout=15).check().stdout,
        deadline=30,
    )
    for error in group.errors.values():
        if isinstance(error, CommandFailed):  # reached, but the node could not say
            raise error
    found = {
        name: pick(name, subnet, parse_addresses(stdout), inventory.ray_subnet_where)
        for name, stdout in group.results.items()
    }
    return with_ray_addresses(inventory, found)
