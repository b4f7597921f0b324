"""The runtimes an inventory may name: an explicit table, one line per runtime.

A new runtime is one new folder of `provisioner.runtime` (its `runtime.py` exposing
`RUNTIME`, a class that implements `runtime.protocol.Runtime`, and `JUDGES`; its `lab.py`
exposing `LAB`, the lab's node recipe) plus its line here. The inventory holds
the name as data (`Inventory.runtime`, and where it is written); this table refuses a name
it does not know, naming that place, whenever a verb builds the runtime.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from provisioner.errors import InventoryError

if TYPE_CHECKING:
    from provisioner.image.pin import Pin
    from provisioner.inventory import Inventory
    from provisioner.runtime.protocol import Judges, LabRecipe, Runtime


@dataclass(frozen=True)
class Entry:
    package: str  # its folder: `runtime.py` (RUNTIME, JUDGES), `lab.py` (LAB), ...
    about: str  # what it does, in a few words (the fix of an unknown name lists these)

    @property
    def module(self) -> str:
        """The module that implements it."""
        return f"{self.package}.runtime"


RUNTIMES: dict[str, Entry] = {
    "docker": Entry("provisioner.runtime.docker", "Ray in the pinned image's container"),
    "host": Entry("provisioner.runtime.host", "Ray from each node's own Python"),
    "podman": Entry("provisioner.runtime.podman", "Ray in the pinned image, rootless Podman"),
}


def names() -> tuple[str, ...]:
    """Every runtime an inventory may name, sorted."""
    return tuple(sorted(RUNTIMES))


def entry(inventory: Inventory) -> Entry:
    """The registry's line for the inventory's runtime; an unknown name is the inventory's
    error, at the place it is written."""
    found = RUNTIMES.get(inventory.runtime)
    if found is None:
        raise InventoryError(
            f"{inventory.runtime_field}: expected {' | '.join(names())}, got {inventory.runtime!r}",
            "; ".join(f"{name}: {e.about}" for name, e in sorted(RUNTIMES.items())),
            where=inventory.runtime_where or str(inventory.path),
        )
    return found


def runtime_for(inventory: Inventory, pin: Pin | None = None, *, push: str = "auto") -> Runtime:
    """The runtime the inventory names (`runtime:`), for this cluster; `push`: how a runtime
    that delivers the image sends the pin (see protocol.PUSH_MODES)."""
    module = importlib.import_module(entry(inventory).module)
    runtime: Runtime = module.RUNTIME(inventory, pin)
    if push != "auto":
        runtime.push = push
    return runtime


def judges(name: str) -> Judges:
    """The doctor's judges of the runtime called `name`."""
    found = RUNTIMES[name]
    judges_: Judges = importlib.import_module(found.module).JUDGES
    return judges_


def catalogue() -> dict[str, str]:
    """Every check the doctor may report (id -> what it looks at): the shared ones
    (`checks.findings.SHARED_CHECKS`), then each runtime's own (`Judges.checks`)."""
    from provisioner.checks.findings import SHARED_CHECKS

    found = dict(SHARED_CHECKS)
    for name in names():
        found.update(judges(name).checks)
    return found


def lab_recipe(name: str) -> LabRecipe:
    """The lab's node recipe of the runtime called `name` (its folder's `lab.py`)."""
    recipe: LabRecipe = importlib.import_module(f"{RUNTIMES[name].package}.lab").LAB
    return recipe
