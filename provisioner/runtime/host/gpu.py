"""How the host runtime hands a node's GPUs to Ray: no container, so Ray's own processes
get them in their environment (the GPU plan's method "host")."""

from __future__ import annotations

from provisioner.gpu.assignment import GpuPlan, accelerator_label_env


def gpu_env(plan: GpuPlan) -> dict[str, str]:
    """The plan's GPUs for Ray's own processes (the method "host"): the CUDA devices they
    may see (UUIDs: no ordering doubt) and the accelerator type's label."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(plan.uuids), **accelerator_label_env(plan)}
