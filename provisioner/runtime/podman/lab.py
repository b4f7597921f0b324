"""The lab's node recipe for the podman runtime: rootless Podman for a login user without
Docker (recipe/podman.Dockerfile), the user's Podman store on the node's storage folder (a
host directory: native overlay needs one that is not itself overlay)."""

from __future__ import annotations

from provisioner.runtime.protocol import LabRecipe

LAB = LabRecipe(
    about="nodes with rootless Podman for the pinned image",
    dockerfile="podman.Dockerfile",
    storage="/home/{user}/.local/share/containers",
    pinned_image=True,
)
