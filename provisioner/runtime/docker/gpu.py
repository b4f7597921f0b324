"""The container runtimes' GPU hand-over: the `run` options that give a container the
plan's GPUs (Docker's --gpus, the nvidia runtime, or CDI; Podman uses CDI's), and the
docker runtime's GPU check: the node's Docker can hand its GPUs to a container (the NVIDIA
Container Toolkit). Pure; the check on the facts of the doctor's one round trip."""

from __future__ import annotations

import shlex

from provisioner.checks.findings import Finding, error, ok
from provisioner.checks.gpu_checks import concerned, evidence
from provisioner.gpu.assignment import GpuPlan, accelerator_label_env, signature
from provisioner.gpu.facts import GPU_KIND, HOOK, GpuFacts
from provisioner.inventory import Node
from provisioner.node import layout

TOOLKIT_GUIDE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
)
CONFIGURE = "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"
WAYS = {
    "gpus": "Docker's --gpus (device requests by UUID)",
    "runtime": "the nvidia runtime (NVIDIA_VISIBLE_DEVICES)",
    "cdi": "CDI (--device nvidia.com/gpu=...)",
}


def gpu_methods(g: GpuFacts) -> tuple[str, ...]:
    """The ways this node's Docker can hand GPUs to a container, preferred first:
    `gpus` (Docker's --gpus device requests: the toolkit's hook), `runtime` (the
    `nvidia` runtime with NVIDIA_VISIBLE_DEVICES), `cdi` (`--device nvidia.com/gpu=...`,
    where Docker reads CDI specs)."""
    found = []
    if HOOK in g.tools:
        found.append("gpus")
    if g.nvidia_runtime:
        found.append("runtime")
    if g.cdi_gpus and g.cdi_dirs:
        found.append("cdi")
    return tuple(found)


def gpu_options(plan: GpuPlan) -> list[str]:
    """`docker run` (or `podman run`) options that hand the plan's GPUs to the container
    (quoted words), by the plan's method: "gpus", "runtime" or "cdi"."""
    devices = ",".join(plan.uuids)
    if plan.method == "gpus":
        # Docker reads --gpus as CSV: a list of devices is one quoted field
        field = '"device=' + devices + '"'
        return [f"--gpus {shlex.quote(field)}"]
    if plan.method == "runtime":
        return [
            "--runtime=nvidia",
            f"-e NVIDIA_VISIBLE_DEVICES={shlex.quote(devices)}",
            "-e NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ]
    if plan.method == "cdi":
        return [f"--device {shlex.quote(f'{GPU_KIND}={name}')}" for name in plan.cdi_names]
    return []


def run_gpu_options(plan: GpuPlan | None) -> list[str]:
    """The Ray container's GPU options: the plan's GPUs (`gpu_options`), the accelerator
    type's label for Ray, and the plan's signature as the container label
    `provisioner.gpus` (`RayState.gpus`: `up` restarts a node whose GPUs changed); none
    without a plan."""
    if plan is None:
        return []
    return [
        *gpu_options(plan),
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in accelerator_label_env(plan).items()),
        f"--label {shlex.quote(f'{layout.LABEL_GPUS}={signature(plan)}')}",
    ]


def toolkit_evidence(g: GpuFacts) -> str:
    """The driver's evidence, then what Docker has for GPUs: the toolkit's programs, the
    runtimes Docker knows, the CDI specs."""
    tools = ", ".join(f"{k} ({v})" for k, v in g.tools.items()) or "none"
    version = f" {g.toolkit_version}" if g.toolkit_version else ""
    specs = ", ".join(f"{s.path} ({s.kind or s.error})" for s in g.cdi) or "none"
    return "\n".join(
        [
            evidence(g),
            f"container toolkit: {tools}{version}",
            f"Docker's runtimes: {', '.join(sorted(g.runtimes)) or 'unknown'}",
            f"CDI specs: {specs}",
        ]
    )


def check_toolkit(node: Node, g: GpuFacts) -> list[Finding]:
    """The node's Docker can hand its GPUs to a container (nothing on a node without GPUs
    that asks for none)."""
    if not concerned(node, g) or not (g.gpus or g.gpu_files):
        return []
    methods = gpu_methods(g)
    version = f" (toolkit {g.toolkit_version})" if g.toolkit_version else ""
    if methods:
        return [
            ok("gpu.toolkit", node.name, f"containers get GPUs through {WAYS[methods[0]]}{version}")
        ]
    if g.toolkit:
        message = (
            "the NVIDIA Container Toolkit is installed but Docker does not use it: a container "
            "gets no GPU"
        )
        fix = f"register it with Docker: {CONFIGURE}"
    else:
        message = (
            "GPUs but no NVIDIA Container Toolkit: a container gets no GPU (`docker run --gpus` "
            'fails with: could not select device driver "" with capabilities: [[gpu]])'
        )
        fix = f"install nvidia-container-toolkit ({TOOLKIT_GUIDE}), then {CONFIGURE}"
    return [error("gpu.toolkit", node.name, message, toolkit_evidence(g), fix)]
