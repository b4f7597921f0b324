"""How Ray runs on a node: one module per runtime, each exposing `RUNTIME` (a class that
implements `provisioner.runtime.base.Runtime`).

`docker` runs Ray in the pinned image's container; `host` runs it from the node's own
Python. A new runtime is one new module here (plus its tests): `names()` finds it, the
inventory accepts `runtime: NAME`, and `runtime_for` builds it. This file imports no
runtime and nothing of the inventory, so the inventory can ask for the names.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from provisioner.image.lock import Pin
    from provisioner.inventory import Inventory
    from provisioner.runtime.base import Judges, Runtime

_NOT_RUNTIMES = frozenset({"base", "shell", "docker_gpu"})  # helpers of a runtime


def names() -> tuple[str, ...]:
    """Every runtime an inventory may name, sorted."""
    return tuple(
        sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_RUNTIMES)
    )


def runtime_for(inventory: Inventory, pin: Pin | None = None, *, push: str = "auto") -> Runtime:
    """The runtime the inventory names (`runtime:`), for this cluster; `push`: how the
    docker runtime sends the pin (see PUSH_MODES)."""
    module = importlib.import_module(f"{__name__}.{inventory.runtime}")
    runtime: Runtime = module.RUNTIME(inventory, pin)
    if push != "auto":
        runtime.push = push
    return runtime


def judges(name: str) -> Judges:
    """The doctor's judges of the runtime called `name`."""
    found: Judges = importlib.import_module(f"{__name__}.{name}").JUDGES
    return found
