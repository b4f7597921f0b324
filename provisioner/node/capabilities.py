"""What a runtime does, for the callers that must know: they ask these, never a runtime's
name (`runtime.caps`, and the doctor's `Plan.caps`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a way of running Ray on a node does.

    `containers`: Ray runs in a container of its own on each node (`status` speaks of "its
    container"; the container's /dev/shm is sized by `ray.shm_size`, so the node's own is
    not Ray's). `needs_image`: Ray runs the pinned image (`up` delivers it; the doctor
    judges the pin's CUDA against the driver and `--gpu-deep` runs the image; the image
    engine's storage is Ray's disk)."""

    containers: bool
    needs_image: bool
