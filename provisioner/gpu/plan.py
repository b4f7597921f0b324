"""Which GPUs of a node Ray gets, and the way in: pure, and the same for every runtime.

The inventory says which GPUs (`gpus:` indices or UUIDs, or `resources: {GPU: n}`, or
nothing: all the node has); the node's facts (the doctor's round) say which it has; the
runtime says which ways it can hand them to Ray (`Runtime.gpu_methods`). `plan_gpus` joins
them into a `GpuPlan`, whose method is data (gpus, runtime, cdi or host) that the
runtime turns into its own words (`runtime.docker_gpu.gpu_options`, `runtime.host.gpu_env`);
`ray start` gets `--num-gpus` and the accelerator type either way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from provisioner.gpu.facts import GpuFacts, select
from provisioner.inventory import Node

# Ray's own resource and label for a node's accelerator type (ray._common.utils,
# ray._raylet.RAY_NODE_ACCELERATOR_TYPE_KEY); a label under ray.io/ is reserved for Ray,
# which takes it from RAY_OVERRIDE_LABELS (as its own autoscaler sets labels).
ACCELERATOR_RESOURCE = "accelerator_type:"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
LABELS_ENV = "RAY_OVERRIDE_LABELS"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class GpuPlan:
    """What Ray on one node gets: GPUs (by UUID), the way in, the accelerator type."""

    method: str  # gpus | runtime | cdi (docker), host (CUDA_VISIBLE_DEVICES)
    uuids: tuple[str, ...]
    indices: tuple[int, ...]
    accelerator_type: str | None = None
    cdi_names: tuple[str, ...] = ()  # the CDI device names (UUID where the spec lists it)

    @property
    def count(self) -> int:
        return len(self.uuids)


def accelerator_type(name: str) -> str | None:
    """Ray's accelerator type for an NVIDIA GPU name, by Ray's own rule where Ray is
    installed here (`A100`, `T4`, `H200`, `GeForce-RTX-4090`)."""
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager
    except ImportError:  # pragma: no cover - Ray is a dependency of this package
        return None
    found = NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(name)  # type: ignore[no-untyped-call]
    return str(found) if found else None


# The runtime's ways of handing a node's GPUs to Ray, preferred first (`Runtime.gpu_methods`).
Methods = Callable[[GpuFacts], tuple[str, ...]]


def plan_gpus(node: Node, facts: GpuFacts, methods: Methods) -> GpuPlan | None:
    """Pure but for Ray's name rule: the GPUs Ray gets on `node` and the way in, the
    first of the runtime's `methods` for these facts.

    None: no GPU for Ray here (none there, none asked for, or no way in, which the doctor
    reports as gpu.toolkit)."""
    chosen = select(node, facts.gpus).chosen if facts.driver_ok else ()
    if not chosen:
        return None
    ways = methods(facts)
    if not ways:
        return None
    method = ways[0]
    cdi = set(facts.cdi_gpus)
    names = tuple(g.uuid if g.uuid in cdi else str(g.index) for g in chosen)
    return GpuPlan(
        method=method,
        uuids=tuple(g.uuid for g in chosen),
        indices=tuple(g.index for g in chosen),
        accelerator_type=accelerator_type(chosen[0].name),
        cdi_names=names,
    )


def plans_for(
    nodes: Sequence[Node], facts: Mapping[str, GpuFacts], methods: Methods
) -> dict[str, GpuPlan]:
    """Every node's plan, for the nodes that get GPUs."""
    plans = {}
    for node in nodes:
        if node.name in facts:
            plan = plan_gpus(node, facts[node.name], methods)
            if plan is not None:
                plans[node.name] = plan
    return plans


def signature(plan: GpuPlan | None) -> str:
    """What a node's Ray was given, as a container label records it ("": no GPU), so that
    `up` restarts a node whose GPUs changed (a driver installed since, another subset)."""
    return f"{plan.method}:{','.join(plan.uuids)}" if plan else ""


def accelerator_label_env(plan: GpuPlan) -> dict[str, str]:
    """The environment that gives Ray the node's accelerator-type label (none when the
    type is not a valid label value)."""
    kind = plan.accelerator_type
    if not kind or not _LABEL_VALUE.fullmatch(kind):
        return {}
    return {LABELS_ENV: json.dumps({ACCELERATOR_LABEL: kind})}
