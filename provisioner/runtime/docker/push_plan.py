"""Deciding what a node needs: pure judgement over the facts one remote call gathers.

A node's Docker holds images, each a list of layer diff IDs. Docker keys a layer by its
chain (the layer and every layer below it), so the node holds the pin's first k layers
when one of its images starts with those same k diff IDs. Only the layers after the
longest such prefix are sent.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from provisioner.errors import RemoteError
from provisioner.image.pin import CLUSTER_TAG, Pin

# docker load first unpacks the whole tar into a temporary directory, then applies it:
# it needs about twice the bytes it receives, plus room to spare.
LOAD_FACTOR = 2
SPARE_BYTES = 1 << 30


def facts_script(tag: str = CLUSTER_TAG) -> str:
    """One round trip: Docker's state, free space under its root, and every image's layers."""
    q = shlex.quote(tag)
    return (
        "if ! command -v docker >/dev/null 2>&1; then echo docker=missing; exit 0; fi\n"
        "if ! err=$(docker info --format '{{.DockerRootDir}}' 2>&1); then\n"
        '  echo docker=down; echo "docker_error=$(echo "$err" | tail -n 1)"; exit 0; fi\n'
        'echo docker=ok; echo "root=$err"\n'
        'echo "free=$(df -PB1 "$err" | awk \'NR==2 {print $4}\')"\n'
        "echo \"engine=$(docker info --format '{{.ServerVersion}} {{.Driver}}' 2>/dev/null)\"\n"
        "if docker info --format '{{range .DriverStatus}}{{index . 1}} {{end}}' 2>/dev/null "
        "| grep -q io.containerd.snapshotter; then echo store=containerd; "
        "else echo store=classic; fi\n"
        f"echo \"tagged=$(docker image inspect --format '{{{{.Id}}}}' {q} 2>/dev/null)\"\n"
        "docker image ls -aq --no-trunc | sort -u | xargs -r docker image inspect "
        "--format 'image {{.Id}} {{range .RootFS.Layers}}{{.}} {{end}}'\n"
    )


@dataclass(frozen=True)
class ImageFacts:
    """What a node's Docker holds, for the push (the doctor's facts are doctor.facts.NodeFacts)."""

    docker: Literal["ok", "missing", "down"]
    docker_error: str = ""
    root: str = ""
    free_bytes: int | None = None
    tagged_id: str = ""
    images: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    engine: str = ""  # "VERSION DRIVER": what the node's docker load reads (compress.node_reads)
    # the image store: "classic" keys an image by its config's digest (the pin's ID),
    # "containerd" (Docker's containerd image store) by its manifest's digest
    store: Literal["classic", "containerd"] = "classic"


def parse_facts(output: str) -> ImageFacts:
    values: dict[str, str] = {}
    images: dict[str, tuple[str, ...]] = {}
    for line in output.splitlines():
        if line.startswith("image "):
            parts = line.split()
            if len(parts) >= 2:
                images[parts[1]] = tuple(parts[2:])
        elif "=" in line:
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    state = values.get("docker", "missing")
    docker: Literal["ok", "missing", "down"] = (
        "ok" if state == "ok" else "down" if state == "down" else "missing"
    )
    free = values.get("free", "")
    return ImageFacts(
        docker=docker,
        docker_error=values.get("docker_error", ""),
        root=values.get("root", ""),
        free_bytes=int(free) if free.isdigit() else None,
        tagged_id=values.get("tagged", ""),
        images=images,
        engine=values.get("engine", ""),
        store="containerd" if values.get("store") == "containerd" else "classic",
    )


@dataclass(frozen=True)
class NodePlan:
    """What to do on one node: nothing, only re-tag, or send layers[first_missing:]."""

    action: Literal["none", "tag", "send"]
    first_missing: int = 0
    layers_to_send: tuple[str, ...] = ()
    need_bytes: int = 0
    engine: str = ""  # the node's "VERSION DRIVER", from its facts
    store: Literal["classic", "containerd"] = "classic"
    # the ID the node's Docker names the pin by: the pin's own, or for the containerd
    # store the digest of the manifest `docker load` makes (savestream.containerd_id)
    image_id: str = ""


def shared_prefix(pin_layers: Sequence[str], images: Mapping[str, Sequence[str]]) -> int:
    """How many of the pin's first layers some image on the node already has, in order."""
    best = 0
    for layers in images.values():
        k = 0
        for mine, theirs in zip(pin_layers, layers, strict=False):
            if mine != theirs:
                break
            k += 1
        best = max(best, k)
    return best


def decide(
    pin: Pin, facts: ImageFacts, host: str, tag: str = CLUSTER_TAG, node_id: str = ""
) -> NodePlan:
    """The plan for one node, or a RemoteError naming what stops the push there.
    `node_id`: the pin's ID in the node's image store when it is not the pin's own (the
    containerd store); the node holds the pin when it holds that ID."""
    if facts.docker == "missing":
        raise RemoteError(
            host,
            "Docker is not installed on the node",
            "install Docker on the node (Debian: `apt-get install -y docker.io`) and add the "
            "login user to the docker group",
            kind="no-docker",
        )
    if facts.docker == "down":
        raise RemoteError(
            host,
            f"Docker does not answer on the node: {facts.docker_error}",
            "start dockerd on the node, and make sure the login user is in the docker group",
            kind="no-docker",
        )
    image_id = node_id or pin.image_id
    if image_id in facts.images:
        action: Literal["none", "tag"] = "none" if facts.tagged_id == image_id else "tag"
        return NodePlan(
            action, len(pin.layers), store=facts.store, image_id=image_id, engine=facts.engine
        )
    k = shared_prefix(pin.layers, facts.images)
    need = pin.bytes_for(k) * LOAD_FACTOR + SPARE_BYTES
    if facts.free_bytes is not None and facts.free_bytes < need:
        raise RemoteError(
            host,
            f"not enough disk for the image: {facts.free_bytes / 1e9:.1f} GB free under "
            f"{facts.root or 'the Docker root'}, loading needs about {need / 1e9:.1f} GB",
            "free space on the node (`docker system prune` removes unused images) and push again",
            kind="no-space",
        )
    return NodePlan("send", k, tuple(pin.layers[k:]), need, facts.engine, facts.store, image_id)


def verify_and_tag_command(image_id: str, tag: str = CLUSTER_TAG, drop: str = "") -> str:
    """Tag the image only once Docker reports it under exactly the pinned ID; then, only
    when it was, remove the image `drop` names (an image ID: what a push loaded ahead of
    the pin, `direct.HeadStart`), whose failure changes nothing."""
    i, t = shlex.quote(image_id), shlex.quote(tag)
    then = f" && {{ docker image rm {shlex.quote(drop)} >/dev/null 2>&1 || true; }}" if drop else ""
    return (
        f'got=$(docker image inspect --format "{{{{.Id}}}}" {i} 2>/dev/null) && '
        f'[ "$got" = {i} ] && docker tag {i} {t} && '
        f'[ "$(docker image inspect --format "{{{{.Id}}}}" {t})" = {i} ]{then}'
    )
