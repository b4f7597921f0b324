"""Ray in the pinned image's container under rootless Podman, as the SSH user.

Docker mode's container, run by Podman: `podman run --network host IMAGE ray start
--block`, named after the cluster and carrying its labels, Ray's temp dir on the node's
disk (logs survive the container), the token (and with TLS the node's TLS folder) a
read-only file mount, a restart policy. No daemon and no docker group: the SSH user's own
Podman and image store. As in docker mode, the container is named after the cluster and
its id (`layout.container_name`) and nothing is removed or run into on a name alone, only
with this cluster's id label: `down` removes this cluster's container of that user only.

The image delivery is `podman/delivery.py`; the doctor's facts and judges `podman/doctor.py`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from provisioner.gpu.facts import GpuFacts
from provisioner.gpu.plan import GpuPlan
from provisioner.image.pin import Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import layout, tls
from provisioner.node.commands import ray_start_args
from provisioner.node.token import read_cluster_id
from provisioner.runtime import containers
from provisioner.runtime.base import Capabilities, Judges, RayState, RenderSection
from provisioner.runtime.docker.gpu import gpu_options, run_gpu_options
from provisioner.runtime.docker.runtime import (
    _STOP,
    CONTAINER_ENV,
    _forget_state,
    run_options,  # docker mode's `ray up` options: the same words for `use_podman`
    shm_size,
    tls_options,
)
from provisioner.runtime.podman.delivery import PodmanDelivery, bare_id, full_id
from provisioner.runtime.podman.doctor import JUDGES, gpu_methods


def _inspect(name: str, template: str) -> str:
    """Shell: `podman container inspect` of the container called `name` with `template`
    (nothing on stdout when there is no such container)."""
    return (
        f"podman container inspect --format {shlex.quote(template)} {shlex.quote(name)} 2>/dev/null"
    )


def _owner(name: str) -> str:
    """Shell: o = the cluster id label of the user's container called `name`: "" when
    there is no such container, "-" when it carries none."""
    label = (
        f'{{{{with index .Config.Labels "{layout.LABEL_CLUSTER_ID}"}}}}{{{{.}}}}'
        "{{else}}-{{end}}"
    )
    return f"o=$({_inspect(name, label)})"


WORDS = containers.Words(
    owner=_owner,
    where="of this user",
    cli="podman",
    remove=lambda word: f"podman rm -f -t 0 {word}",
    exists=lambda word: f"podman container exists {word}",
)


def foreign_container_guard(name: str, cluster_id: str, then: str) -> str:
    """Shell: when the user's container called `name` exists and does not carry this
    cluster's id label (another cluster's, or one without any id: not provably ours), say
    so on stderr and run `then` (`exit 3`: refuse; `:`: go on, leaving it alone). Nothing
    is ever removed or run into on a name alone (as docker mode's guard)."""
    return containers.foreign_guard(WORDS, name, cluster_id, then)


def namesake_guard(cluster: str, cluster_id: str) -> str:
    """Shell: refuse (exit 3, saying so) while a container of another cluster of the same
    name is the user's (its `provisioner.cluster` label is this name, its id another):
    both would share the node folder `~/.provisioner/clusters/CLUSTER`. That container is
    left alone. (Podman 4's `ps` has no `.Label`: the labels are a map.)"""
    label = shlex.quote(f"label={layout.LABEL_CLUSTER}={cluster}")
    fmt = shlex.quote(f'{{{{.Names}}}} {{{{index .Labels "{layout.LABEL_CLUSTER_ID}"}}}}')
    return (
        f"podman ps -a --filter {label} --format {fmt} | "
        f'while read -r n i; do [ "$i" = {shlex.quote(cluster_id)} ] && continue; '
        'echo "the container $n of this user belongs to another cluster of the same name '
        f"(cluster id ${{i:-none}}; this state folder's: {cluster_id}): left alone; rename "
        "this cluster (cluster: in the inventory), or take that one down from its own state "
        'folder" >&2; exit 3; done || exit 3'
    )


def run_command(
    inventory: Inventory,
    node: Node,
    image: str,
    gpus: GpuPlan | None = None,
    cluster_id: str = "",
) -> str:
    """`podman run` for the node's Ray container: docker mode's options, with Podman's
    words (`--network host`, `--pull=never`: the image is the loaded pin, never a
    registry's; `--log-driver k8s-file`: `podman logs` without journald). `cluster_id`
    labels it and names it (`layout.container_name`); it refuses to start (exit 3) over a
    container of that name that is not provably this cluster's, or beside a container of
    another cluster of the same name (`namesake_guard`)."""
    cluster = inventory.cluster
    name = layout.container_name(cluster, cluster_id)
    parts = [
        "podman run -d",
        f"--name {shlex.quote(name)}",
        "--network host",
        "--pull=never",
        "--restart=unless-stopped",
        "--log-driver k8s-file",
        f"--shm-size={shm_size(inventory)}",
        f"-v {layout.node_ray_dir(cluster)}:{layout.CONTAINER_RAY_DIR}",
        # --mount, not -v: a start without the token file fails
        f"--mount type=bind,source={layout.node_token_path(cluster)},"
        f"target={layout.CONTAINER_TOKEN_PATH},readonly",
        f"-v {layout.node_results_dir(cluster)}:{layout.CONTAINER_RESULTS_DIR}",
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in CONTAINER_ENV.items()),
        *tls_options(inventory),
        f"--label {shlex.quote(f'{layout.LABEL_CLUSTER}={cluster}')}",
        f"--label {shlex.quote(f'{layout.LABEL_ROLE}={node.role}')}",
        *(
            [f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}"]
            if cluster_id
            else []
        ),
        *run_gpu_options(gpus),
        shlex.quote(bare_id(image)),
        shlex.join(ray_start_args(inventory, node, gpus=gpus)),
    ]
    prepare = f"mkdir -p {layout.node_ray_dir(cluster)} {layout.node_results_dir(cluster)}"
    guard = (
        f"{foreign_container_guard(name, cluster_id, 'exit 3')}; "
        f"{namesake_guard(cluster, cluster_id)}; "
        if cluster_id
        else ""
    )
    return f"{guard}{prepare} && " + " ".join(parts)


def remove_command(cluster: str, cluster_id: str = "") -> str:
    """Remove this cluster's container of the SSH user (at once: `-t 0`), and one an older
    provisioner named `ray-CLUSTER`, each only when it carries this cluster's id label;
    succeeds when there is none. One without that label is not this cluster's: left
    alone, and said so on stderr (`foreign_container_guard`)."""
    return containers.guarded_remove(WORDS, cluster, cluster_id)


def _ours(cluster: str, cluster_id: str, then: str) -> str:
    """Shell: run `then` (with the container's name in "$n") only when this cluster's
    container exists and carries its id label; else fail (exit 1)."""
    return containers.only_ours(WORDS, cluster, cluster_id, then)


def running_test(cluster: str, cluster_id: str = "") -> str:
    return _ours(
        cluster,
        cluster_id,
        '[ "$(podman container inspect --format \'{{.State.Running}}\' "$n" 2>/dev/null)" = true ]',
    )


def exec_python_command(cluster: str, *args: str, cluster_id: str = "") -> str:
    """Run a Python script read from stdin inside this cluster's Ray container."""
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    return f"podman exec -i {name} python - " + shlex.join(args)


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
        _ours(
            cluster,
            cluster_id,
            f'p=$({pid}) && [ "${{p:-0}}" -gt 0 ] && '
            'ns=$(readlink "/proc/$p/ns/pid" 2>/dev/null) && [ -n "$ns" ] && ' + _NS_FDS,
        )
        + " | sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'; exit 0"
    )


def state_command(cluster: str, cluster_id: str = "") -> str:
    """One line of JSON about this cluster's Ray container (or `null`)."""
    template = (
        '{"running": {{json .State.Running}}, "status": {{json .State.Status}}, '
        '"image": {{json .Image}}, "started_at": {{json .State.StartedAt}}, '
        '"restarts": {{json .RestartCount}}, "exit_code": {{json .State.ExitCode}}, '
        '"oom_killed": {{json .State.OOMKilled}}, '
        f'"cluster_id": {{{{json (index .Config.Labels "{layout.LABEL_CLUSTER_ID}")}}}}, '
        f'"gpus": {{{{json (index .Config.Labels "{layout.LABEL_GPUS}")}}}}}}'
    )
    return f"{_inspect(layout.container_name(cluster, cluster_id), template)} || echo null"


def parse_state(stdout: str, cluster_id: str = "") -> RayState:
    """The JSON line of `state_command` (`null`: absent; a container without this
    cluster's id label, another's or none, is not this cluster's: absent too). The image
    ID is given as the pin writes it (`sha256:` and hex)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith(("{", "null"))]
    data = json.loads(lines[-1]) if lines else None
    if not data or not cluster_id or data.get("cluster_id") != cluster_id:
        return RayState()
    image = data.get("image")
    return RayState(
        status=str(data.get("status") or "unknown"),
        runs=full_id(str(image)) if image else None,
        started_at=data.get("started_at"),
        restarts=int(data.get("restarts") or 0),
        exit_code=data.get("exit_code"),
        oom_killed=bool(data.get("oom_killed")),
        gpus=str(data.get("gpus") or ""),
    )


def log_command(cluster: str, lines: int | None = None, cluster_id: str = "") -> str:
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    tail = f" --tail {int(lines)}" if lines is not None else ""
    return f"podman logs --timestamps{tail} {name} 2>&1"


def gpu_probe_command(image: str, gpus: GpuPlan) -> str:
    """The doctor's --gpu-deep round: a container of `image` given the GPUs as `up` gives
    them (CDI) runs the probe script from stdin."""
    words = ["podman run --rm -i --pull=never --network none", *gpu_options(gpus)]
    return " ".join([*words, shlex.quote(bare_id(image)), "python3", "-"])


CAPS = Capabilities(containers=True, needs_image=True)


class PodmanRuntime:
    """Ray in the pinned image, one rootless Podman container per node."""

    name = "podman"
    caps = CAPS
    log_file = "container.log"
    push = "direct"  # every node from this machine (`podman load` of the saved image)
    starting = "starting the {role} container (podman)"
    stopping = "removing the Ray container (podman)"

    def __init__(self, inventory: Inventory, pin: Pin | None) -> None:
        self.inventory = inventory
        self.pin = pin
        self.cluster = inventory.cluster
        self.image_id = pin.image_id if pin else ""
        self.cluster_id = read_cluster_id(inventory)

    def _pin(self) -> Pin:
        return self.delivery()._pin()

    def delivery(self) -> PodmanDelivery:
        return PodmanDelivery(self.inventory, self.pin)

    def state_command(self) -> str:
        return state_command(self.cluster, self.cluster_id)

    def parse_state(self, stdout: str) -> RayState:
        return parse_state(stdout, self.cluster_id)

    def started_state(self) -> RayState:
        return RayState(status="running", runs=self.image_id or None)

    def is_current(self, state: RayState) -> bool | None:
        if self.pin is None or state.runs is None:
            return None
        return state.runs == self.pin.image_id

    def start_command(self, node: Node, gpus: GpuPlan | None = None) -> str:
        return run_command(self.inventory, node, self._pin().image_id, gpus, self.cluster_id)

    def stop_command(self, node: Node) -> str:
        return remove_command(self.cluster, self.cluster_id)

    def gpu_probe_command(self, image: str, gpus: GpuPlan) -> str | None:
        return gpu_probe_command(image, gpus)

    @property
    def judges(self) -> Judges:
        return JUDGES

    @staticmethod
    def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
        return gpu_methods(facts)

    def running_test(self) -> str:
        return running_test(self.cluster, self.cluster_id)

    def python_command(self, *args: str) -> str:
        return exec_python_command(self.cluster, *args, cluster_id=self.cluster_id)

    def sockets_command(self) -> str:
        return sockets_command(self.cluster, self.cluster_id)

    def runtime_log_command(self, lines: int | None = None) -> str:
        return log_command(self.cluster, lines, self.cluster_id)

    def render_section(self, token_path: Path, tls_dir: Path | None = None) -> RenderSection:
        mounts = {layout.CONTAINER_TOKEN_PATH: str(token_path)}
        if tls_dir is not None:
            mounts[tls.CONTAINER_TLS_DIR] = str(tls_dir)
        config = {
            "docker": {
                "image": bare_id(self._pin().image_id),
                "container_name": layout.container_name(self.cluster, self.cluster_id),
                "pull_before_run": False,
                "use_podman": True,
                "run_options": run_options(
                    self.inventory, self.cluster_id, use_tls=tls_dir is not None
                ),
            },
            "file_mounts": mounts,
        }
        return RenderSection(
            config, before_start=(_STOP,), head_before_start=(_forget_state(self.cluster),)
        )


RUNTIME = PodmanRuntime

__all__ = ["JUDGES", "RUNTIME", "PodmanRuntime"]
