"""How Podman hands a node's GPUs to Ray's container: through CDI only (its specs in
/etc/cdi or /var/run/cdi; `--device nvidia.com/gpu=...`, the options `docker/gpu.py`
writes for the CDI way), and the doctor's check that a node with GPUs has such a spec."""

from __future__ import annotations

from provisioner.checks.findings import Finding, error, ok
from provisioner.checks.gpu_checks import concerned, evidence
from provisioner.gpu.facts import GpuFacts
from provisioner.inventory import Node

WAYS = "CDI (--device nvidia.com/gpu=...)"
CDI_GENERATE = "sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"


def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
    """Podman hands GPUs over through CDI only (its specs in /etc/cdi or /var/run/cdi)."""
    return ("cdi",) if facts.cdi_gpus else ()


def check_cdi(node: Node, g: GpuFacts) -> list[Finding]:
    """A node with GPUs has a CDI spec for them: Podman's way to hand them to a container."""
    if not concerned(node, g) or not (g.gpus or g.gpu_files):
        return []
    if g.cdi_gpus:
        return [ok("gpu.toolkit", node.name, f"containers get GPUs through {WAYS}")]
    specs = ", ".join(f"{s.path} ({s.kind or s.error})" for s in g.cdi) or "none"
    return [
        error(
            "gpu.toolkit",
            node.name,
            "GPUs but no CDI spec for them: a Podman container gets no GPU",
            f"{evidence(g)}\nCDI specs: {specs}",
            f"install nvidia-container-toolkit, then {CDI_GENERATE}",
        )
    ]
