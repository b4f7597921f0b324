"""The docker runtime's GPU check: the node's Docker can hand its GPUs to a container
(the NVIDIA Container Toolkit: Docker's --gpus, the nvidia runtime, or CDI). Pure, on the
facts of the doctor's one round trip."""

from __future__ import annotations

from provisioner.checks.findings import Finding, error, ok
from provisioner.checks.gpu_checks import concerned, evidence
from provisioner.gpu.facts import GpuFacts
from provisioner.inventory import Node

TOOLKIT_GUIDE = (
    "https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
)
CONFIGURE = "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"
WAYS = {
    "gpus": "Docker's --gpus (device requests by UUID)",
    "runtime": "the nvidia runtime (NVIDIA_VISIBLE_DEVICES)",
    "cdi": "CDI (--device nvidia.com/gpu=...)",
}


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
    methods = g.methods()
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
