"""One command's cluster: the inventory, its pin read once and its runtime built once,
handed down to every verb the command runs (`cluster_context` builds it; the CLI calls
it once per command).

The verbs never read the pin nor build the runtime themselves: the doctor is given both;
`up` hands the nodes a scheduler gave (or the Ray subnet resolved) to `on`, which keeps
the pin as read and builds the runtime for those nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.errors import InputError
from provisioner.runtime.registry import entry, runtime_for

if TYPE_CHECKING:
    from provisioner.image.pin import Pin
    from provisioner.inventory import Inventory
    from provisioner.runtime.protocol import Runtime


@dataclass
class ClusterContext:
    """What one command works on. `pin_error`: the pin the inventory names could not be
    read (only when the command asked for a lenient read: the doctor reports it)."""

    inventory: Inventory
    pin: Pin | None = None
    pin_error: InputError | None = None
    push: str = "auto"  # how a runtime that delivers the image sends it (protocol.PUSH_MODES)
    built: Runtime | None = field(default=None, repr=False)  # the runtime, once built

    @property
    def runtime(self) -> Runtime:
        """The inventory's runtime with the pin, built on first use (once)."""
        if self.built is None:
            self.built = runtime_for(self.inventory, self.pin, push=self.push)
        return self.built

    def require_pin(self) -> Pin:
        """The pin; an InputError with its fix when the inventory names none."""
        if self.pin_error is not None:
            raise self.pin_error
        if self.pin is None:
            raise no_pin(self.inventory)
        return self.pin

    def on(self, inventory: Inventory) -> ClusterContext:
        """The same command on other nodes (a scheduler's, or the Ray subnet resolved): the
        pin as read here, the runtime built for them."""
        if inventory is self.inventory:
            return self
        return ClusterContext(inventory, self.pin, self.pin_error, self.push)


def no_pin(inventory: Inventory) -> InputError:
    return InputError(
        "the inventory names no image pin (image.lock)",
        "run `provisioner image build`, then set image.lock in the inventory",
        where=str(inventory.path),
    )


def cluster_context(
    inventory: Inventory,
    *,
    push: str = "auto",
    pin_path: Path | None = None,
    lenient_pin: bool = False,
    with_pin: bool = True,
) -> ClusterContext:
    """The context of one command: the pin (`pin_path`, else the inventory's image.lock)
    read once, the inventory's runtime checked by name (an unknown one refused, exit 2) and
    built when first asked for. A pin that cannot be read is an InputError, or with
    `lenient_pin` the context's `pin_error` (the doctor's warning). `with_pin=False`: a
    command whose runtime needs no pin (down, tunnel) reads none."""
    from provisioner.image.pin import read_pin

    entry(inventory)  # an unknown runtime is refused before anything runs
    path = (pin_path or inventory.image_lock) if with_pin else None
    pin: Pin | None = None
    error: InputError | None = None
    if path is not None:
        try:
            pin = read_pin(path)
        except InputError as exc:
            if not lenient_pin:
                raise
            error = exc
    return ClusterContext(inventory, pin, error, push)


__all__ = ["ClusterContext", "cluster_context", "no_pin"]
