"""How the jobs verbs reach a cluster: Ray's Jobs API (through the SSH tunnel, with the
token) and the head node itself over the same SSH connection (for results).

A `Target` says where the cluster is; `Target.link()` opens one connection (a `Link`)
and closes it; followers open a new one when the old one broke.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.errors import InputError
from provisioner.inventory import Inventory
from provisioner.jobs.client import connect, ray_client_quiet
from provisioner.remote import Pool
from provisioner.remote.session import Session
from provisioner.runtime.context import ClusterContext, cluster_context

if TYPE_CHECKING:
    from provisioner.runtime.protocol import Runtime


@dataclass
class Link:
    """One open connection: the Jobs API client and, with an inventory, the head's SSH."""

    url: str
    client: Any
    pool: Pool | None
    inventory: Inventory | None

    def head(self) -> Session:
        if self.pool is None or self.inventory is None:
            raise InputError(
                "results come home over SSH from the head, and no inventory was given",
                "add -i INVENTORY",
            )
        return self.pool.session(self.inventory.head)


@dataclass
class Target:
    """Where a cluster is: an inventory (tunnel + token + SSH), or a dashboard URL and token."""

    inventory: Inventory | None = None
    address: str | None = None
    token_path: Path | None = None
    # the command's context (the CLI's, built once); None: built here on first need
    context: ClusterContext | None = None

    @property
    def runtime(self) -> Runtime:
        """The inventory's runtime, from the command's context (built once)."""
        if self.inventory is None:
            raise InputError("no inventory given", "add -i INVENTORY")
        if self.context is None:
            self.context = cluster_context(self.inventory, with_pin=False)
        return self.context.runtime

    @property
    def cluster(self) -> str:
        return self.inventory.cluster if self.inventory else ""

    @property
    def node_count(self) -> int | None:
        """The inventory's nodes (None: a cluster named by its address only, or a SLURM
        inventory whose allocation is not read here)."""
        inv = self.inventory
        return len(inv.nodes) if inv is not None and inv.allocated else None

    @contextmanager
    def link(self) -> Iterator[Link]:
        from provisioner.cluster.tunnel import check_local_listener, tunnel

        with ExitStack() as stack:
            stack.enter_context(ray_client_quiet())
            pool = stack.enter_context(Pool(self.inventory)) if self.inventory else None
            if self.address is not None:
                url = self.address
                check_local_listener(url)  # the tunnel checks the head's listener itself
            else:
                assert self.inventory is not None, "a Target needs an inventory or an address"
                url = stack.enter_context(tunnel(self.inventory, runtime=self.runtime, pool=pool))
            yield Link(url, connect(url, self.token_path), pool, self.inventory)

    @contextmanager
    def ssh(self) -> Iterator[Session]:
        """Only the head's SSH (when the Jobs API is gone, results still come home)."""
        if self.inventory is None:
            raise InputError("no inventory given", "add -i INVENTORY")
        with Pool(self.inventory) as pool:
            yield pool.session(self.inventory.head)


def target_for(inventory: Path | None, address: str | None, token_file: Path | None) -> Target:
    """Where the cluster is: the inventory (tunnel, token, SSH to the head), or an address."""
    from provisioner.inventory import load_cluster
    from provisioner.node import token

    inv = load_cluster(inventory) if inventory is not None else None
    if address is not None:
        if token_file is None and inv is None:
            raise InputError(
                "--address needs the cluster's token",
                "add --token-file PATH, or -i INVENTORY to use the inventory's token",
            )
    elif inv is None:
        raise InputError("no inventory given", "add -i INVENTORY (or set PROVISIONER_INVENTORY)")
    path = token_file or (token.local_token_path(inv) if inv is not None else None)
    return Target(inventory=inv, address=address, token_path=path)
