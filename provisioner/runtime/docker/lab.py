"""The lab's node recipe for the docker runtime: sshd and Docker (recipe/node.Dockerfile),
Docker's root on the node's storage folder, any flavour's image store."""

from __future__ import annotations

from provisioner.runtime.protocol import LabRecipe

LAB = LabRecipe(
    about="nodes with Docker for the pinned image",
    dockerfile="node.Dockerfile",
    docker_stores=True,
    pinned_image=True,
)
