"""Ray in the pinned image's container: `docker run --net=host IMAGE ray start --block`.

The container and its commands are the container runtimes' (`runtime.containers`), here in
Docker's words (`WORDS`); what is Docker's own: one `docker ps` guards a start
(`start_guard`), the pin's ID differs between Docker's image stores (`with_image_fallback`,
`DockerRuntime.node_ids`), `ray up` names the pin by the cluster tag, and the delivery is
the push (`delivery.py`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from functools import partial
from typing import Any

from provisioner.gpu.assignment import GpuPlan
from provisioner.gpu.facts import GpuFacts
from provisioner.image.pin import CLUSTER_TAG, Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import layout
from provisioner.runtime import containers
from provisioner.runtime.containers import (
    CAPS,
    CONTAINER_ENV,
    ContainerRuntime,
    run_options,
    shm_size,
    tls_options,
)
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.delivery import DockerDelivery, tag_holds_pin_command
from provisioner.runtime.docker.direct import store_ids
from provisioner.runtime.docker.doctor import JUDGES
from provisioner.runtime.docker.gpu import gpu_methods, gpu_options, run_gpu_options
from provisioner.runtime.protocol import RayState


def start_guard(cluster: str, name: str, cluster_id: str) -> str:
    """Shell, one `docker ps` (where two Docker calls were the start's first 30-70 ms):
    refuse (exit 3, saying so) over a container called `name` that is not provably this
    cluster's (no id label, or another's: `containers.foreign_verdict`), or beside a
    container of another cluster of the same name (`containers.namesake_verdict`).
    Nothing is ever removed or run into on a name alone."""
    fmt = shlex.quote(
        "{{.Names}}"
        + "".join(
            f' {{{{with .Label "{label}"}}}}{{{{.}}}}{{{{else}}}}-{{{{end}}}}'
            for label in (layout.LABEL_CLUSTER, layout.LABEL_CLUSTER_ID)
        )
    )
    mine = containers.foreign_verdict(WORDS, name, cluster_id, "exit 3")
    return (
        f"docker ps -a --format {fmt} | while read -r n c i; do "
        f'if [ "$n" = {shlex.quote(name)} ]; then o=$i; {mine}; fi; '
        f'[ "$c" = {shlex.quote(cluster)} ] || continue; [ "$i" = - ] && i=; '
        f"{containers.namesake_verdict(WORDS, cluster_id)}; done || exit 3"
    )


WORDS = containers.Words(
    cli="docker",
    inspect="docker inspect",
    where="on this node",
    remove="docker rm -f",
    exists="docker inspect",
    run=("--net=host", "--restart=unless-stopped"),
    probe=("--net=none",),
    gpus=run_gpu_options,
    probe_gpus=gpu_options,
    start_guard=start_guard,
)

# The container runtimes' commands in Docker's words.
docker_run_command = partial(containers.run_command, WORDS)
remove_container_command = partial(containers.remove_command, WORDS)
container_running_test = partial(containers.running_test, WORDS)
exec_python_command = partial(containers.exec_python_command, WORDS)
container_facts_command = partial(containers.state_command, WORDS)
parse_container_facts = partial(containers.parse_state, WORDS)
container_log_command = partial(containers.log_command, WORDS)
gpu_probe_command = partial(containers.gpu_probe_command, WORDS)


def with_image_fallback(command: str, image: str, alternatives: Sequence[str]) -> str:
    """`command` (a docker_run_command of `image`) run by the first of `image` and
    `alternatives` the node's Docker holds: the pin's ID differs between image stores (the
    containerd store names it by its manifest's digest), and which store a node has is
    known only there."""
    if not alternatives:
        return command
    word = f" {shlex.quote(image)} "
    if word not in command:
        raise ValueError(f"{image} is not a word of the command")
    pick = f"img={shlex.quote(image)}"
    for other in alternatives:
        pick += f'; docker image inspect "$img" >/dev/null 2>&1 || img={shlex.quote(other)}'
    return pick + "; " + command.replace(word, ' "$img" ', 1)


def container_sockets_command(cluster: str, cluster_id: str = "") -> str:
    """Shell: the inode of every socket held by a process inside this cluster's Ray
    container (its PID namespace: nothing outside it is seen), one a line; nothing when
    the container is not running or does not carry this cluster's id label. The
    container shares the node's network namespace (--net=host), so these are the inodes
    the node's /proc/net/tcp lists."""
    listing = f'docker exec "$n" sh -c {shlex.quote("ls -l /proc/[0-9]*/fd/ 2>/dev/null; exit 0")}'
    return (
        containers.only_ours(WORDS, cluster, cluster_id, listing)
        + " | sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'; exit 0"
    )


class DockerRuntime(ContainerRuntime):
    """Ray in the pinned image, one container per node."""

    name = "docker"
    words = WORDS
    judges_ = JUDGES
    push = "auto"

    def __init__(self, inventory: Inventory, pin: Pin | None, *, image: str | None = None) -> None:
        super().__init__(inventory, pin)
        # what `docker run` names: the pinned ID, else the cluster tag a push leaves
        self.image = image or (pin.image_id if pin else CLUSTER_TAG)
        # the pin's ID in each node's image store (Docker's containerd image store names
        # it by its manifest's digest), as its delivery found it: the doctor's round saw
        # it there, or a push told it where it differs
        self.node_ids: dict[str, str] = {}
        self._store_ids: frozenset[str] | None = None

    def delivery(self, options: PushOptions | None = None) -> DockerDelivery:
        # the push tells the pin's ID on nodes whose image store names it otherwise
        return DockerDelivery(
            self.inventory, self.pin, self.push, node_ids=self.node_ids, options=options
        )

    def image_alt_id(self) -> str:
        """The pin's ID in Docker's containerd image store (its manifest's digest), when
        this machine can tell it: the pin saved here, as a push to such a node leaves it."""
        if self.pin is None:
            return ""
        if self._store_ids is None:
            self._store_ids = store_ids(self.pin)
        return next(iter(sorted(self._store_ids - {self.pin.image_id})), "")

    def started_state(self) -> RayState:
        return RayState(status="running", runs=self.image)

    def is_current(self, state: RayState) -> bool | None:
        if self.pin is None or state.runs is None:
            return None
        if state.runs == self.pin.image_id or state.runs in self.node_ids.values():
            return True
        if self._store_ids is None:  # the pin's ID in the containerd image store, if saved here
            self._store_ids = store_ids(self.pin)
        return state.runs in self._store_ids

    def start_command(self, node: Node, gpus: GpuPlan | None = None) -> str:
        image = self.image  # an image the caller named runs as named; the pin by its node's ID
        if self.pin is None or image != self.pin.image_id:
            return docker_run_command(self.inventory, node, image, gpus, self.cluster_id)
        if node.name in self.node_ids:  # the push, or the doctor's round, told this node's ID
            image = self.node_ids[node.name]
            return docker_run_command(self.inventory, node, image, gpus, self.cluster_id)
        # not pushed now (the doctor saw the pin there): whichever ID its image store has
        if self._store_ids is None:
            self._store_ids = store_ids(self.pin)
        others = sorted(self._store_ids - {image})
        command = docker_run_command(self.inventory, node, image, gpus, self.cluster_id)
        return with_image_fallback(command, image, others)

    @staticmethod
    def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
        return gpu_methods(facts)  # the ways this node's Docker hands GPUs to a container

    def sockets_command(self) -> str:
        return container_sockets_command(self.cluster, self.cluster_id)

    def render_image(self) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        # Ray's launcher names one image for every node, and Docker's containerd image
        # store does not know the pin by its ID (it names it by its manifest's digest): the
        # pinned image goes by the cluster tag a push leaves, checked on each node first.
        if self.pin is not None and self.image == self.pin.image_id:
            return CLUSTER_TAG, (tag_holds_pin_command(self.pin),), {}
        return self.image, (), {}


RUNTIME = DockerRuntime

__all__ = [
    "CAPS",
    "CONTAINER_ENV",
    "JUDGES",
    "RUNTIME",
    "DockerRuntime",
    "run_options",
    "shm_size",
    "tls_options",
]
