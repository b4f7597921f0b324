"""Which GPUs of a node Ray gets, and the way in: pure, and the same for every runtime.

The inventory says which GPUs (`gpus:` indices or UUIDs, or `resources: {GPU: n}`, or
nothing: all the node has); the node's facts (the doctor's round) say which it has; the
runtime says which ways it can hand them to Ray (`Runtime.gpu_methods`). `plan_gpus` joins
them into a `GpuPlan`, whose method is data (gpus, runtime, cdi or host) that the
runtime turns into its own words (`runtime.docker.gpu.gpu_options`, `runtime.host.runtime.gpu_env`);
`ray start` gets `--num-gpus` and the accelerator type either way.

A GPU goes to Ray only where the image's torch can use it (`usable`): Ray's GPU resource is
a promise to every task and learner that asks for one, so a node whose pinned image has
the CPU build of torch, or a driver older than the image's CUDA needs, gives Ray none of
its GPUs (`ray start --num-gpus=0`) and `up` says why (`Withheld`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from provisioner.gpu.facts import GpuFacts, select
from provisioner.inventory import Node

# Ray's own resource and label for a node's accelerator type (ray._common.utils,
# ray._raylet.RAY_NODE_ACCELERATOR_TYPE_KEY); a label under ray.io/ is reserved for Ray,
# which takes it from RAY_OVERRIDE_LABELS (as its own autoscaler sets labels).
ACCELERATOR_RESOURCE = "accelerator_type:"
ACCELERATOR_LABEL = "ray.io/accelerator-type"
LABELS_ENV = "RAY_OVERRIDE_LABELS"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")

# NVIDIA's CUDA Toolkit release notes, table "CUDA Toolkit and Minimum Required Driver
# Version for CUDA Minor Version Compatibility" (Linux x86_64): the oldest driver that runs
# any CUDA release of that major version. The CUDA wheels of PyTorch carry their own CUDA
# runtime and rely on exactly this compatibility.
MINIMUM_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
CPU_IMAGE_FIX = (
    "build the CUDA image (provisioner image build --cuda) and point the inventory's "
    "image.lock at its pin"
)


def version(text: str) -> tuple[int, ...]:
    """ "525.60.13" -> (525, 60, 13); up to the first part that is not a number."""
    parts = []
    for word in text.split("."):
        if not word.isdigit():
            break
        parts.append(int(word))
    return tuple(parts)


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


@dataclass(frozen=True)
class Withheld:
    """A node's GPUs that Ray does not get: the image's torch cannot use them."""

    count: int
    why: str
    fix: str


def usable(image_cuda: str | None, driver: str) -> tuple[str, str] | None:
    """Pure: why the image's torch cannot use GPUs under `driver`, and the fix; None when
    it can, or when no image says (`image_cuda` None: Ray runs the node's own Python).
    `image_cuda` "": the pin names no CUDA (the CPU build, as the doctor's gpu.cuda
    reads it)."""
    if image_cuda is None:
        return None
    if not image_cuda:
        return "the pinned image's torch is the CPU build (no CUDA)", CPU_IMAGE_FIX
    major = version(image_cuda)[:1]
    need = MINIMUM_DRIVER.get(major[0]) if major else None
    if need is not None and version(driver) < version(need):
        return (
            f"NVIDIA driver {driver} is too old for the image's CUDA {image_cuda} (it needs "
            f"{need} or newer)",
            f"upgrade the driver to {need} or newer (or build the image with a CUDA that "
            "this driver runs)",
        )
    return None


def withhold(
    plans: Mapping[str, GpuPlan], facts: Mapping[str, GpuFacts], image_cuda: str | None
) -> tuple[dict[str, GpuPlan], dict[str, Withheld]]:
    """Pure: the plans whose GPUs the image's torch can use, and the nodes whose GPUs Ray
    does not get, with why and the fix."""
    kept: dict[str, GpuPlan] = {}
    withheld: dict[str, Withheld] = {}
    for name, plan in plans.items():
        g = facts.get(name)
        reason = usable(image_cuda, g.driver_version if g else "")
        if reason is None:
            kept[name] = plan
        else:
            withheld[name] = Withheld(plan.count, *reason)
    return kept, withheld


def without_gpus(node: Node) -> Node:
    """`node` as Ray starts on it when it gets none of its GPUs: `--num-gpus=0`, whatever
    the inventory's `gpus:` or `resources.GPU` asked."""
    resources = {k: v for k, v in node.resources.items() if k != "GPU"}
    return replace(node, gpus=(), resources=resources)


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
