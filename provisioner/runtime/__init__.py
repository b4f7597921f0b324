"""How Ray runs on a node: one module per runtime, each exposing `RUNTIME` (a class that
implements `provisioner.runtime.protocol.Runtime`) and `JUDGES`, listed in `registry.RUNTIMES`.

`docker` runs Ray in the pinned image's container; `podman` in the same image under the SSH
user's rootless Podman; `host` runs it from the node's own Python. Callers ask a runtime's
capabilities (`runtime.caps`), never its name.
"""

from __future__ import annotations

from provisioner.runtime.registry import catalogue, judges, names, runtime_for

__all__ = ["catalogue", "judges", "names", "runtime_for"]
