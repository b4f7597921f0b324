"""Ray in the pinned image's container under rootless Podman, as the SSH user.

Docker mode's container (`runtime.containers`), run by Podman in its own words (`WORDS`):
`podman run --network host IMAGE ray start --block`, `--pull=never` (the image is the
loaded pin, never a registry's), `--log-driver k8s-file` (`podman logs` without journald).
No daemon and no docker group: the SSH user's own Podman and image store. As in docker
mode, nothing is removed or run into on a name alone, only with this cluster's id label:
`down` removes this cluster's container of that user only.

The image delivery is `delivery.py`; the doctor's facts and judges `doctor.py`; the GPUs
reach the container by CDI (`gpu.py`).
"""

from __future__ import annotations

import shlex
from functools import partial
from typing import Any

from provisioner.errors import InputError
from provisioner.gpu.assignment import GpuPlan
from provisioner.gpu.facts import GpuFacts
from provisioner.image.pin import Pin
from provisioner.inventory import Node
from provisioner.node import layout
from provisioner.runtime import containers
from provisioner.runtime.containers import CAPS, ContainerRuntime
from provisioner.runtime.delivery_options import PushOptions
from provisioner.runtime.docker.gpu import gpu_options, run_gpu_options
from provisioner.runtime.podman.delivery import LoadOptions, PodmanDelivery, bare_id, full_id
from provisioner.runtime.podman.doctor import JUDGES
from provisioner.runtime.podman.gpu import gpu_methods
from provisioner.runtime.protocol import RayState


def namesake_guard(cluster: str, cluster_id: str) -> str:
    """Shell: refuse (exit 3, saying so) while a container of another cluster of the same
    name is the user's (its `provisioner.cluster` label is this name, its id another):
    both would share the node folder `~/.provisioner/clusters/CLUSTER`. That container is
    left alone. (Podman 4's `ps` has no `.Label`: the labels are a map.)"""
    label = shlex.quote(f"label={layout.LABEL_CLUSTER}={cluster}")
    fmt = shlex.quote(f'{{{{.Names}}}} {{{{index .Labels "{layout.LABEL_CLUSTER_ID}"}}}}')
    return (
        f"podman ps -a --filter {label} --format {fmt} | "
        f"while read -r n i; do {containers.namesake_verdict(WORDS, cluster_id)}; done || exit 3"
    )


def start_guard(cluster: str, name: str, cluster_id: str) -> str:
    """Shell: refuse (exit 3) over the user's container called `name` that is not provably
    this cluster's, or beside a container of another cluster of the same name."""
    return (
        f"{containers.foreign_guard(WORDS, name, cluster_id, 'exit 3')}; "
        f"{namesake_guard(cluster, cluster_id)}"
    )


WORDS = containers.Words(
    cli="podman",
    inspect="podman container inspect",
    where="of this user",
    remove="podman rm -f -t 0",
    exists="podman container exists",
    run=("--network host", "--pull=never", "--restart=unless-stopped", "--log-driver k8s-file"),
    probe=("--pull=never", "--network none"),
    gpus=run_gpu_options,
    probe_gpus=gpu_options,
    start_guard=start_guard,
    image=bare_id,
    runs=full_id,
)

# The container runtimes' commands in Podman's words.
run_command = partial(containers.run_command, WORDS)
remove_command = partial(containers.remove_command, WORDS)
running_test = partial(containers.running_test, WORDS)
exec_python_command = partial(containers.exec_python_command, WORDS)
state_command = partial(containers.state_command, WORDS)
parse_state = partial(containers.parse_state, WORDS)
log_command = partial(containers.log_command, WORDS)
gpu_probe_command = partial(containers.gpu_probe_command, WORDS)


# The fd listings of every process in the PID namespace named by "$ns", read from the
# node's own /proc (one `ls` for the namespaces, one for the fds: no shell loop).
_NS_FDS = (
    "ls -l /proc/[0-9]*/ns/pid 2>/dev/null | "
    'awk -v ns="$ns" \'$NF == ns {split($(NF-2), p, "/"); print "/proc/" p[3] "/fd/"}\' | '
    "xargs -r ls -l 2>/dev/null"
)


def sockets_command(cluster: str, cluster_id: str = "") -> str:
    """Shell: the inode of every socket held by a process inside this cluster's Ray
    container, one a line; nothing when the container is not running or does not carry
    this cluster's id label. Rootless Podman's container processes are the SSH user's
    (its root is that uid), so the node's /proc shows them to this user without entering
    the container: those whose PID namespace is the container's (its first process,
    `.State.Pid`; the container has a PID namespace of its own, holding nothing else).
    Another process of the same user, outside the container, is not among them. The
    container shares the node's network namespace (--network host), so these are the
    inodes the node's /proc/net/tcp lists."""
    pid = "podman container inspect --format '{{.State.Pid}}' \"$n\" 2>/dev/null"
    return (
        containers.only_ours(
            WORDS,
            cluster,
            cluster_id,
            f'p=$({pid}) && [ "${{p:-0}}" -gt 0 ] && '
            'ns=$(readlink "/proc/$p/ns/pid" 2>/dev/null) && [ -n "$ns" ] && ' + _NS_FDS,
        )
        + " | sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'; exit 0"
    )


class PodmanRuntime(ContainerRuntime):
    """Ray in the pinned image, one rootless Podman container per node."""

    name = "podman"
    words = WORDS
    judges_ = JUDGES
    push = "direct"  # every node from this machine (`podman load` of the saved image)
    starting = "starting the {role} container (podman)"
    stopping = "removing the Ray container (podman)"

    def _pin(self) -> Pin:
        return self.delivery()._pin()

    def delivery(self, options: PushOptions | None = None) -> PodmanDelivery:
        if options is not None and (options.star or options.chain):
            raise InputError(
                "the podman runtime loads the image from this machine into each node's "
                "Podman: it has no star or chain",
                "drop --star/--chain",
                where="--star/--chain",
            )
        load = LoadOptions() if options is None else LoadOptions(compress=options.compress)
        return PodmanDelivery(self.inventory, self.pin, load)

    def image_alt_id(self) -> str:
        return ""  # Podman names the pin by its own ID (bare)

    def started_state(self) -> RayState:
        return RayState(status="running", runs=self.image_id or None)

    def is_current(self, state: RayState) -> bool | None:
        if self.pin is None or state.runs is None:
            return None
        return state.runs == self.pin.image_id

    def start_command(self, node: Node, gpus: GpuPlan | None = None) -> str:
        return run_command(self.inventory, node, self._pin().image_id, gpus, self.cluster_id)

    @staticmethod
    def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
        return gpu_methods(facts)

    def sockets_command(self) -> str:
        return sockets_command(self.cluster, self.cluster_id)

    def render_image(self) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        return bare_id(self._pin().image_id), (), {"use_podman": True}


RUNTIME = PodmanRuntime

__all__ = ["CAPS", "JUDGES", "RUNTIME", "PodmanRuntime"]
