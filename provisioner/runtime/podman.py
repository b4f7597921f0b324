"""Ray in the pinned image's container under rootless Podman, as the SSH user.

Docker mode's container, run by Podman: `podman run --network host IMAGE ray start
--block`, named after the cluster and carrying its labels, Ray's temp dir on the node's
disk (logs survive the container), the token (and with TLS the node's TLS folder) a
read-only file mount, a restart policy. No daemon and no docker group: the SSH user's own
Podman and image store. `down` removes this cluster's container of that user only.

The image delivery is `podman_image.py`; the doctor's facts and judges `podman_doctor.py`.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.errors import InputError
from provisioner.gpu.facts import GpuFacts
from provisioner.gpu.plan import GpuPlan, accelerator_label_env, docker_gpu_options, signature
from provisioner.image.direct import NodePush, PushReport
from provisioner.image.lock import Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import layout
from provisioner.node.commands import ray_start_args
from provisioner.node.token import read_cluster_id
from provisioner.runtime.base import Capabilities, Judges, RayState, RenderSection
from provisioner.runtime.docker import _STOP, CONTAINER_ENV, _forget_state, shm_size, tls_options
from provisioner.runtime.podman_doctor import JUDGES, gpu_methods
from provisioner.runtime.podman_image import bare_id, deliver, full_id

if TYPE_CHECKING:
    from provisioner.console import Reporter
    from provisioner.remote import Pool


def _inspect(cluster: str, template: str) -> str:
    name = shlex.quote(layout.container_name(cluster))
    return f"podman container inspect --format {shlex.quote(template)} {name} 2>/dev/null"


def _id_label(cluster: str) -> str:
    """Shell: the cluster-id label of the container ray-CLUSTER ("": none, or no container)."""
    label = f'{{{{with index .Config.Labels "{layout.LABEL_CLUSTER_ID}"}}}}{{{{.}}}}{{{{end}}}}'
    return f"$({_inspect(cluster, label)})"


def foreign_container_guard(cluster: str, cluster_id: str, then: str) -> str:
    """Shell: when the user's ray-CLUSTER container carries another cluster's id, say so on
    stderr and run `then` (`exit 0`: nothing of ours; `exit 3`: refuse)."""
    name = layout.container_name(cluster)
    return (
        f"l={_id_label(cluster)}; "
        f'if [ -n "$l" ] && [ "$l" != {shlex.quote(cluster_id)} ]; then '
        f'echo "the container {name} of this user belongs to another cluster of the same '
        f"name (cluster id $l; this state folder's: {cluster_id or 'none yet'}): left "
        "alone; rename this cluster (cluster: in the inventory), or take that one down from "
        'its own state folder" >&2; '
        f"{then}; fi"
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
    registry's; `--log-driver k8s-file`: `podman logs` without journald)."""
    cluster = inventory.cluster
    gpu_options = docker_gpu_options(gpus) if gpus else []
    if gpus:
        gpu_options += [
            f"-e {shlex.quote(f'{k}={v}')}" for k, v in accelerator_label_env(gpus).items()
        ]
        gpu_options.append(f"--label {shlex.quote(f'{layout.LABEL_GPUS}={signature(gpus)}')}")
    parts = [
        "podman run -d",
        f"--name {shlex.quote(layout.container_name(cluster))}",
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
        *gpu_options,
        shlex.quote(bare_id(image)),
        shlex.join(ray_start_args(inventory, node, gpus=gpus)),
    ]
    prepare = f"mkdir -p {layout.node_ray_dir(cluster)} {layout.node_results_dir(cluster)}"
    guard = f"{foreign_container_guard(cluster, cluster_id, 'exit 3')}; " if cluster_id else ""
    return f"{guard}{prepare} && " + " ".join(parts)


def remove_command(cluster: str, cluster_id: str = "") -> str:
    """Remove this cluster's container of the SSH user (at once: `-t 0`); succeeds when
    there is none, and leaves another cluster's namesake alone."""
    name = shlex.quote(layout.container_name(cluster))
    guard = foreign_container_guard(cluster, cluster_id, "exit 0")
    return (
        f"{guard}; podman rm -f -t 0 {name} >/dev/null 2>&1; "
        f"! podman container exists {name} >/dev/null 2>&1"
    )


def running_test(cluster: str) -> str:
    return f'[ "$({_inspect(cluster, "{{.State.Running}}")})" = true ]'


def exec_python_command(cluster: str, *args: str) -> str:
    name = shlex.quote(layout.container_name(cluster))
    return f"podman exec -i {name} python - " + shlex.join(args)


def state_command(cluster: str) -> str:
    """One line of JSON about the Ray container (or `null`)."""
    template = (
        '{"running": {{json .State.Running}}, "status": {{json .State.Status}}, '
        '"image": {{json .Image}}, "started_at": {{json .State.StartedAt}}, '
        '"restarts": {{json .RestartCount}}, "exit_code": {{json .State.ExitCode}}, '
        '"oom_killed": {{json .State.OOMKilled}}, '
        f'"cluster_id": {{{{json (index .Config.Labels "{layout.LABEL_CLUSTER_ID}")}}}}, '
        f'"gpus": {{{{json (index .Config.Labels "{layout.LABEL_GPUS}")}}}}}}'
    )
    return f"{_inspect(cluster, template)} || echo null"


def parse_state(stdout: str, cluster_id: str = "") -> RayState:
    """The JSON line of `state_command` (`null`: absent; another cluster's id: absent too).
    The image ID is given as the pin writes it (`sha256:` and hex)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith(("{", "null"))]
    data = json.loads(lines[-1]) if lines else None
    if not data:
        return RayState()
    if data.get("cluster_id") and data.get("cluster_id") != cluster_id:
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


def log_command(cluster: str, lines: int | None = None) -> str:
    name = shlex.quote(layout.container_name(cluster))
    tail = f" --tail {int(lines)}" if lines is not None else ""
    return f"podman logs --timestamps{tail} {name} 2>&1"


def gpu_probe_command(image: str, gpus: GpuPlan) -> str:
    """The doctor's --gpu-deep round: a container of `image` given the GPUs as `up` gives
    them (CDI) runs the probe script from stdin."""
    words = ["podman run --rm -i --pull=never --network none", *docker_gpu_options(gpus)]
    return " ".join([*words, shlex.quote(bare_id(image)), "python3", "-"])


def run_options(inventory: Inventory, cluster_id: str = "") -> list[str]:
    """`podman run` options for Ray's launcher (`ray up`, `docker.use_podman`)."""
    options = [f"-e {k}={shlex.quote(v)}" for k, v in CONTAINER_ENV.items()]
    if cluster_id:
        options.append(f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}")
    options.append(f"-v {layout.node_ray_dir(inventory.cluster)}:{layout.CONTAINER_RAY_DIR}")
    if inventory.shm_size:
        options.append(f"--shm-size={int(inventory.shm_size)}")
    return options


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
        if self.pin is None:
            raise InputError(
                "the inventory names no image pin (image.lock), and the podman runtime runs "
                "Ray in the pinned image",
                "run `provisioner image build`, then set image.lock in the inventory",
                where=str(self.inventory.path),
            )
        return self.pin

    def prepare(
        self, pool: Pool, report: Reporter, *, ready: frozenset[str] = frozenset()
    ) -> PushReport | None:
        pin = self._pin()
        report(f"image: making every node's Podman hold {pin.short_id()} (podman load)")
        out = deliver(pool, [n for n in self.inventory.nodes if n.name not in ready], pin, report)
        for name in ready:
            out.nodes[name] = NodePush(name, "none", len(pin.layers), via="doctor")
        return out

    def state_command(self) -> str:
        return state_command(self.cluster)

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
        return running_test(self.cluster)

    def python_command(self, *args: str) -> str:
        return exec_python_command(self.cluster, *args)

    def runtime_log_command(self, lines: int | None = None) -> str:
        return log_command(self.cluster, lines)

    def render_section(self, token_path: Path) -> RenderSection:
        config = {
            "docker": {
                "image": bare_id(self._pin().image_id),
                "container_name": layout.container_name(self.cluster),
                "pull_before_run": False,
                "use_podman": True,
                "run_options": run_options(self.inventory, self.cluster_id),
            },
            "file_mounts": {layout.CONTAINER_TOKEN_PATH: str(token_path)},
        }
        return RenderSection(
            config, before_start=(_STOP,), head_before_start=(_forget_state(self.cluster),)
        )


RUNTIME = PodmanRuntime

__all__ = ["JUDGES", "RUNTIME", "PodmanRuntime"]
