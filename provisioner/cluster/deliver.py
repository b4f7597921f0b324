"""`image push`: the pin delivered to every node by the inventory's runtime, as `up`
delivers it (docker: the push of `runtime/docker/`, in the shape the flags ask for; podman: `podman
load` from this machine), each node verified by ID."""

from __future__ import annotations

from typing import TYPE_CHECKING

from provisioner.console import Reporter, quiet
from provisioner.errors import InputError
from provisioner.node.delivery import DeliveryReport
from provisioner.runtime.context import ClusterContext

if TYPE_CHECKING:
    from provisioner.runtime.delivery_options import PushOptions


def deliver_pin(
    cluster: ClusterContext, report: Reporter = quiet, *, options: PushOptions | None = None
) -> DeliveryReport:
    """Make every node of the context's inventory hold its pin, through the runtime's
    delivery; `options`: `image push`'s flags (a shape the runtime's delivery lacks is an
    InputError). A runtime with nothing to deliver (host) is an InputError."""
    from provisioner.remote import Pool

    cluster.require_pin()
    runtime = cluster.runtime
    delivery = runtime.delivery(options)
    if delivery is None:
        raise InputError(
            f"the {runtime.name} runtime runs Ray from each node's own Python: there is no "
            "image to push",
            "nothing to do; `provisioner up` checks the nodes' Python and Ray",
            where=str(cluster.inventory.path),
        )
    with Pool(cluster.inventory) as pool:
        return delivery.deliver(pool, report)


__all__ = ["deliver_pin"]
