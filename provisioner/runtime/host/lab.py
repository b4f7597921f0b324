"""The lab's node recipe for the host runtime: Ray in a virtualenv on the login shell's PATH
(recipe/host.Dockerfile, from images/' lock and wheelhouse); a SLURM lab's nodes run Ray
this way."""

from __future__ import annotations

from provisioner.runtime.protocol import LabRecipe

LAB = LabRecipe(
    about="nodes with Ray in a virtualenv",
    dockerfile="host.Dockerfile",
    docker_stores=True,  # built on the docker runtime's node: Docker is there too
    slurm=True,
)
