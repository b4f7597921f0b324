"""The docker runtime's image delivery: the push of the pin (`push.py`, the way `push`
says: runtime.protocol.PUSH_MODES), which sends each node only the layers it lacks, verifies
the ID and only then moves the cluster tag; and the checks that a node holds it.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING

from provisioner.errors import InputError, RemoteError
from provisioner.image.pin import CLUSTER_TAG, Pin
from provisioner.inventory import Inventory
from provisioner.runtime.docker.push import PushOptions, push_image
from provisioner.runtime.protocol import DeliveryReport

if TYPE_CHECKING:
    from provisioner.console import Reporter
    from provisioner.remote import Pool, Session


def push_options(mode: str) -> PushOptions:
    """The push `up --push MODE` makes (runtime.protocol.PUSH_MODES)."""
    if mode == "direct":
        return PushOptions()
    return PushOptions(chain=True, chain_from=1 if mode == "chain" else 2)


def has_image_command(image_id: str) -> str:
    """Prints the ID the node's Docker holds the image `image_id` under ("": not held)."""
    i = shlex.quote(image_id)
    return f"docker image inspect --format '{{{{.Id}}}}' {i} 2>/dev/null || true"


def tag_holds_pin_command(pin: Pin) -> str:
    """Shell on a node: fails, saying so, unless the cluster tag names an image of exactly
    the pin's layers (their diff IDs, which Docker's classic and containerd image stores
    both report, where the image's own ID differs between them)."""
    layers = "{{range .RootFS.Layers}}{{.}} {{end}}"
    got = f"docker image inspect --format {shlex.quote(layers)} {shlex.quote(CLUSTER_TAG)}"
    want = shlex.quote("".join(f"{d} " for d in pin.layers))
    why = shlex.quote(
        f"{CLUSTER_TAG} on this node is not the pinned image {pin.short_id()}: "
        "run `provisioner image push -i INVENTORY` first"
    )
    return f'test "$({got} 2>/dev/null)" = {want} || {{ echo {why} >&2; exit 1; }}'


def holds_image(stdout: str, image_id: str) -> bool:
    """Pure: `has_image_command`'s output names exactly `image_id`."""
    return bool(image_id) and stdout.strip() == image_id


class DockerDelivery:
    """The docker runtime's delivery: the push of the pin (`docker.push`, the way `push`
    says: runtime.protocol.PUSH_MODES), which sends each node only the layers it lacks,
    verifies the ID and only then moves the cluster tag."""

    def __init__(
        self,
        inventory: Inventory,
        pin: Pin | None,
        push: str = "auto",
        *,
        node_ids: dict[str, str] | None = None,
        options: PushOptions | None = None,
    ) -> None:
        self.inventory = inventory
        self.pin = pin
        self.push = push
        self.options = options  # `image push`'s flags; None: the push `push` says
        self.image_id = pin.image_id if pin else ""
        # node -> the pin's ID in its image store (Docker's containerd image store: its
        # manifest's digest), as `deliver` found them (the doctor's round, or a push where
        # it differs); shared with the runtime that made this delivery, which runs the
        # image by that ID there
        self.node_ids: dict[str, str] = {} if node_ids is None else node_ids

    def has_command(self) -> str:
        return has_image_command(self.image_id)

    def holds(self, stdout: str) -> bool:
        return any(holds_image(stdout, i) for i in {self.image_id, *self.node_ids.values()})

    def verify(self, session: Session) -> None:
        got = session.run(self.has_command(), timeout=60).stdout.strip()
        if not self.holds(got):
            short = self.image_id.removeprefix("sha256:")[:12]
            raise RemoteError(
                session.host,
                f"the node's Docker does not hold the pinned image {short} "
                f"(it holds: {got or 'no such image'})",
                "run `provisioner up` again; it pushes the image again",
                kind="load-failed",
            )

    def deliver(
        self, pool: Pool, report: Reporter, *, ready: Mapping[str, str] | None = None
    ) -> DeliveryReport:
        if self.pin is None:
            raise InputError(
                "the inventory names no image pin (image.lock), and the docker runtime runs Ray "
                "in the pinned image",
                "run `provisioner image build`, then set image.lock in the inventory "
                "(or `runtime: host` to run Ray from the nodes' own Python)",
                where=str(self.inventory.path),
            )
        opts = self.options or push_options(self.push)
        shape = "image push" if self.options else f"push: {self.push}"
        report(f"image: making every node hold {self.pin.short_id()} ({shape})")
        ready = ready or {}
        # the ID each node the doctor saw holding the pin has it by: its start runs that,
        # with no image lookup first (`DockerRuntime.start_command`)
        self.node_ids.update(ready)
        pushed = push_image(self.inventory, pool, report, pin=self.pin, opts=opts, held=ready)
        self.node_ids.update(
            (name, n.image_id)
            for name, n in pushed.nodes.items()
            if n.image_id and n.image_id != self.pin.image_id
        )
        return pushed
