"""Checks of the NVIDIA GPU stack: driver, the inventory's GPUs, the image's CUDA, the
models across the cluster, and (opt-in) a GPU seen inside the image. How a runtime hands
GPUs over (the docker runtime: the container toolkit) is that runtime's own check.

A node without any sign of a GPU and without GPUs in its inventory entry gets no finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import Plan
from provisioner.gpu.assignment import CPU_IMAGE_FIX, MINIMUM_DRIVER, version
from provisioner.gpu.facts import GpuFacts, select
from provisioner.inventory import Node

DRIVER_FIX = (
    "install the NVIDIA driver and check that `nvidia-smi` lists the GPUs; a driver installed "
    "after boot needs its kernel module loaded (sudo modprobe nvidia) or a reboot"
)


def evidence(g: GpuFacts) -> str:
    """What the facts say of the node's driver and devices (a runtime's GPU checks add how
    it hands GPUs over)."""
    lines = []
    if g.smi:
        lines.append(f"nvidia-smi: exit {g.smi_rc}, {len(g.gpus)} GPU(s)")
        if g.smi_said:
            lines.append(g.smi_said.splitlines()[0][:200])
    else:
        lines.append("nvidia-smi: not on the PATH")
    lines.append(f"kernel module: {g.module or 'not loaded (/proc/driver/nvidia/version absent)'}")
    lines.append(f"device files: {' '.join(g.devices) or 'none'}")
    return "\n".join(lines)


def asked(node: Node) -> int | None:
    """GPUs the inventory gives Ray on `node` (None: not said)."""
    if node.gpus is not None:
        return len(node.gpus)
    count = node.resources.get("GPU")
    return None if count is None else int(count)


def concerned(node: Node, g: GpuFacts) -> bool:
    """Whether the GPU checks speak of this node: it shows a GPU, or its inventory asks for
    GPUs."""
    return g.present or bool(asked(node))


def check_driver(node: Node, g: GpuFacts) -> list[Finding]:
    if g.driver_ok:
        names = ", ".join(f"{x.index}: {x.name} ({x.memory_mib} MiB)" for x in g.gpus)
        return [ok("gpu.driver", node.name, f"NVIDIA driver {g.driver_version}; GPUs {names}")]
    toolkit = " The NVIDIA Container Toolkit is installed, but" if g.toolkit else ""
    if g.smi:
        said = (g.smi_said.splitlines() or ["it lists no GPU"])[0]
        message = f"{toolkit} nvidia-smi fails: {said}".strip()
    else:
        message = (
            f"{toolkit} there is no working NVIDIA driver: nvidia-smi is not installed".strip()
        )
    return [
        error("gpu.driver", node.name, message[0].upper() + message[1:], evidence(g), DRIVER_FIX)
    ]


def check_count(node: Node, g: GpuFacts) -> list[Finding]:
    """The inventory's GPUs against the node's."""
    want = asked(node)
    have = len(g.gpus) if g.driver_ok else 0
    listing = ", ".join(f"{x.index} {x.uuid}" for x in g.gpus) or "none"
    seen = f"nvidia-smi: {listing}"
    if want is None:
        return [ok("gpu.count", node.name, f"Ray gets all {have} GPU(s)")] if have else []
    sel = select(node, g.gpus if g.driver_ok else ())
    if sel.missing:
        return [
            error(
                "gpu.count",
                node.name,
                f"the inventory names GPU(s) {', '.join(sel.missing)}, which this node does "
                "not have",
                seen,
                "name GPUs as `nvidia-smi -L` lists them (index or UUID) in gpus: [...]",
            )
        ]
    if want > have:
        return [
            error(
                "gpu.count",
                node.name,
                f"the inventory gives Ray {want} GPU(s), the node has {have}: Ray would "
                "schedule work on GPUs that are not there",
                seen,
                f"set the node's GPUs to what it has ({have}), or leave gpus and resources.GPU "
                "out (then Ray gets every GPU the node has)",
            )
        ]
    chosen = ", ".join(str(x.index) for x in sel.chosen) or "none"
    if want < have and node.gpus is None:
        return [
            warning(
                "gpu.count",
                node.name,
                f"the inventory gives Ray {want} of the node's {have} GPUs (indices {chosen})",
                seen,
                "name the GPUs to use with gpus: [index or UUID, ...], or give it all "
                f"(resources.GPU: {have})",
            )
        ]
    return [ok("gpu.count", node.name, f"Ray gets {want} of {have} GPU(s): {chosen}")]


def check_cuda(node: Node, g: GpuFacts, plan: Plan) -> list[Finding]:
    """The driver against the pinned image's CUDA (docker mode, when the pin is known)."""
    if plan.pin is None or not plan.caps.needs_image or not g.driver_ok:
        return []
    cuda = plan.pin.cuda
    if not cuda:
        return [
            warning(
                "gpu.cuda",
                node.name,
                "the pinned image's torch is CPU-only: it cannot use this node's GPUs, so "
                "`up` gives Ray none of them (learners train on CPU)",
                f"image {plan.pin.image_id[:19]}: torch without CUDA",
                CPU_IMAGE_FIX,
            )
        ]
    major = version(cuda)[:1]
    need = MINIMUM_DRIVER.get(major[0]) if major else None
    driver = g.driver_version
    if need is None:
        return [
            warning(
                "gpu.cuda",
                node.name,
                f"the image's CUDA {cuda} is not in provisioner's driver table",
                f"driver {driver}",
                "check NVIDIA's CUDA release notes for the driver it needs",
            )
        ]
    if version(driver) < version(need):
        return [
            error(
                "gpu.cuda",
                node.name,
                f"NVIDIA driver {driver} is too old for the image's CUDA {cuda} (it needs "
                f"{need} or newer): torch would find no usable GPU, so `up` gives Ray none",
                f"nvidia-smi driver_version: {driver}; image: CUDA {cuda}",
                f"upgrade the driver to {need} or newer (or build the image with a CUDA "
                "that this driver runs)",
            )
        ]
    return [ok("gpu.cuda", node.name, f"driver {driver} runs the image's CUDA {cuda}")]


def check_gpus(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    """Every single-node GPU check (pure); nothing on a node with no GPU and none asked."""
    g = f.gpu
    if not concerned(node, g):
        return []
    return check_driver(node, g) + check_count(node, g) + check_cuda(node, g, plan)


def check_models(facts: dict[str, NodeFacts]) -> list[Finding]:
    """Across the cluster: one GPU model everywhere (a warning otherwise)."""
    models: dict[str, list[str]] = {}
    for host, f in facts.items():
        for name in sorted({g.name for g in f.gpu.gpus}):
            models.setdefault(name, []).append(host)
    if len(models) < 2:
        return []
    seen = "; ".join(f"{name}: {', '.join(hosts)}" for name, hosts in sorted(models.items()))
    return [
        warning(
            "gpu.models",
            "cluster",
            f"mixed GPU models across the cluster ({', '.join(sorted(models))}): Ray counts GPUs, "
            "not models, so a learner may land on the slower or smaller one",
            seen,
            "keep one GPU model per cluster, or ask for one with accelerator_type "
            "(@ray.remote(accelerator_type=...)): up gives Ray each node's type",
        )
    ]


# --- the opt-in deep check: a GPU visible inside a container of the pinned image ----------

# Runs in the image: what nvidia-smi (mounted by the toolkit) and torch see. One JSON line.
PROBE = """
import json, subprocess
out = {"smi": None, "torch_cuda": None, "torch_devices": 0, "names": []}
try:
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    out["smi"] = (p.stdout + p.stderr).strip()[:2000]
except Exception as exc:
    out["smi"] = "nvidia-smi: %s" % exc
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        out["torch_devices"] = torch.cuda.device_count()
        out["names"] = [torch.cuda.get_device_name(i) for i in range(out["torch_devices"])]
except Exception as exc:
    out["torch_error"] = str(exc)[:500]
print("PROVISIONER-GPU " + json.dumps(out))
"""


@dataclass(frozen=True)
class InsideView:
    """What a container of the pinned image saw of its GPUs."""

    listed: tuple[str, ...] = ()  # `nvidia-smi -L` lines inside ("GPU 0: ... (UUID: ...)")
    smi_said: str = ""
    torch_cuda: str | None = None
    torch_devices: int = 0
    ran: bool = False
    said: str = ""  # the command's own output when it printed no answer


def parse_inside(stdout: str) -> InsideView:
    for line in reversed(stdout.splitlines()):
        if line.startswith("PROVISIONER-GPU "):
            data = json.loads(line[len("PROVISIONER-GPU ") :])
            smi = str(data.get("smi") or "")
            listed = tuple(x for x in smi.splitlines() if x.startswith("GPU "))
            return InsideView(
                listed=listed,
                smi_said="" if listed else smi,
                torch_cuda=data.get("torch_cuda"),
                torch_devices=int(data.get("torch_devices") or 0),
                ran=True,
            )
    return InsideView(said=stdout.strip()[-500:])


def check_inside(node: Node, expected: int, view: InsideView) -> list[Finding]:
    """The deep check's verdict on one node that should give Ray `expected` GPUs."""
    if not view.ran:
        return [
            error(
                "gpu.container",
                node.name,
                "a container of the pinned image with the node's GPU options did not run",
                view.said,
                "run `provisioner doctor` without --gpu-deep for the cause (gpu.toolkit, "
                "image.present), then try again",
            )
        ]
    seen = len(view.listed)
    torch_note = (
        f"; torch (CUDA {view.torch_cuda}) sees {view.torch_devices}"
        if view.torch_cuda
        else "; torch is the CPU build"
    )
    if seen < expected:
        return [
            error(
                "gpu.container",
                node.name,
                f"inside a container of the pinned image {seen} of {expected} GPU(s) are "
                f"visible{torch_note}",
                view.smi_said or "\n".join(view.listed),
                "the container toolkit did not hand the GPUs over: check `docker run --rm "
                "--gpus all IMAGE nvidia-smi` on the node, and gpu.toolkit / gpu.driver",
            )
        ]
    if view.torch_cuda and view.torch_devices < expected:
        return [
            error(
                "gpu.container",
                node.name,
                f"nvidia-smi sees {seen} GPU(s) in the container but torch (CUDA "
                f"{view.torch_cuda}) sees {view.torch_devices}",
                "\n".join(view.listed),
                "the driver is likely too old for the image's CUDA (see gpu.cuda): upgrade it",
            )
        ]
    return [
        ok("gpu.container", node.name, f"{seen} GPU(s) visible in the pinned image{torch_note}")
    ]
