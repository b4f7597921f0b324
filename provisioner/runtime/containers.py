"""What the two container runtimes share: Ray in the pinned image's container, one per
node, run by Docker (`runtime/docker/`) or by the SSH user's rootless Podman
(`runtime/podman/`). Podman is Docker's container with its own binary and a few
differences, all said in its `Words`; the commands and the runtime class are written once.

The container is named after the cluster and its id (`layout.container_name`) and carries
its labels; nothing is removed or run into on a name alone, only with this cluster's id
label (the owner lookup by that label, the guard that leaves anyone else's container
alone, saying so, the guarded removal, and "run this only on ours"). Ray's temp dir is the
node directory `~/.provisioner/clusters/CLUSTER/ray`, mounted at /tmp/ray so that logs
survive the container; the token is a read-only file mount named by RAY_AUTH_TOKEN_PATH, so
it never appears on a command line; so is the node's TLS folder (`node.tls`). A restart
policy restarts a crashed Ray.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from provisioner.gpu.assignment import GpuPlan
from provisioner.inventory import Inventory, Node
from provisioner.node import layout, tls
from provisioner.node.commands import ray_start_args
from provisioner.node.token import read_cluster_id
from provisioner.runtime.protocol import Capabilities, Judges, RayState, RenderSection

if TYPE_CHECKING:
    from provisioner.image.pin import Pin

# Ray in a container of the pinned image on each node.
CAPS = Capabilities(containers=True, needs_image=True)

# Ray's own launcher sizes /dev/shm to 30% of available memory plus 10%, capped at 200 GB.
_SHM_FROM_MEMINFO = (
    "$(awk '/MemAvailable/ {s=$2*1024*0.3*1.1; if (s>200e9) s=200e9; printf \"%d\", s}'"
    " /proc/meminfo)"
)

CONTAINER_ENV: Mapping[str, str] = {
    "RAY_AUTH_MODE": "token",
    "RAY_AUTH_TOKEN_PATH": layout.CONTAINER_TOKEN_PATH,
    "RAY_USAGE_STATS_ENABLED": "0",
    layout.RESULTS_ROOT_ENV: layout.CONTAINER_RESULTS_DIR,
}

# Runs in the container before `ray start`: the container holds this cluster's Ray only.
STOP = "ray stop --force >/dev/null 2>&1 || true"


def _same(image: str) -> str:
    return image


@dataclass(frozen=True)
class Words:
    """A container runtime's words. `cli`: its command; `inspect`: how it inspects a
    container (`CLI inspect --format TEMPLATE NAME`); `where`: how a message places the
    container ("on this node", "of this user"); `remove` / `exists`: the commands that
    remove a container and tell whether it is still there (the container's quoted name
    follows); `run`: the `run` options after the name (network, pull, restart, logs);
    `probe`: the doctor's GPU probe's options; `gpus(plan)` / `probe_gpus(plan)`: how it
    hands a node's GPUs to Ray's container and to the probe's; `start_guard(cluster, name,
    cluster_id)`:
    shell refusing (exit 3) to start over a container that is not provably this
    cluster's; `image(id)`: the image ID as its `run` takes it; `runs(id)`: the ID its
    `inspect` tells, as the pin writes it."""

    cli: str
    inspect: str
    where: str
    remove: str
    exists: str
    run: tuple[str, ...]
    probe: tuple[str, ...]
    gpus: Callable[[GpuPlan | None], list[str]]
    probe_gpus: Callable[[GpuPlan], list[str]]
    start_guard: Callable[[str, str, str], str]
    image: Callable[[str], str] = _same
    runs: Callable[[str], str] = _same


def _id(cluster_id: str) -> str:
    return shlex.quote(cluster_id or "none")


def inspect(words: Words, name: str, template: str) -> str:
    """Shell: inspect the container called `name` with `template` (nothing on stdout when
    there is no such container)."""
    return f"{words.inspect} --format {shlex.quote(template)} {shlex.quote(name)} 2>/dev/null"


def owner(words: Words, name: str) -> str:
    """Shell: o = the cluster id label of the container called `name`: "" when there is
    no such container, "-" when it carries none."""
    label = (
        f'{{{{with index .Config.Labels "{layout.LABEL_CLUSTER_ID}"}}}}{{{{.}}}}'
        "{{else}}-{{end}}"
    )
    return f"o=$({inspect(words, name, label)})"


def foreign_guard(words: Words, name: str, cluster_id: str, then: str) -> str:
    """Shell: when a container called `name` exists and does not carry this cluster's id
    label (another cluster's, or one without any id: not provably ours), say so on stderr
    and run `then` (`exit 3`: refuse; `:`: go on, leaving it alone). Nothing is ever
    removed or run into on a name alone."""
    return f"{owner(words, name)}; {foreign_verdict(words, name, cluster_id, then)}"


def foreign_verdict(words: Words, name: str, cluster_id: str, then: str) -> str:
    """Shell: `foreign_guard` once "$o" holds the container's id label ("": no such
    container, "-": it carries none), however it was read."""
    return (
        f'if [ -n "$o" ] && [ "$o" != {_id(cluster_id)} ]; then '
        'if [ "$o" = - ]; then w="carries no cluster id"; '
        'else w="belongs to another cluster (cluster id $o)"; fi; '
        f"echo \"the container {name} {words.where} $w, not this state folder's "
        f"(cluster id {cluster_id or 'none yet'}): left alone; if it is yours from another "
        "state folder, take it down from there, else remove it "
        f'({words.cli} rm -f {name})" >&2; '
        f"{then}; fi"
    )


def namesake_verdict(words: Words, cluster_id: str) -> str:
    """Shell, in a loop over containers of this cluster's name ("$n" its name, "$i" its id
    label, "" when none): refuse (exit 3, saying so) unless it carries this cluster's id:
    both clusters would share the node folder `~/.provisioner/clusters/CLUSTER` (token,
    logs, results) when they are the same SSH user's. That container is left alone."""
    return (
        f'[ "$i" = {shlex.quote(cluster_id)} ] && continue; '
        f'echo "the container $n {words.where} belongs to another cluster of the same name '
        f"(cluster id ${{i:-none}}; this state folder's: {cluster_id}): left alone; rename "
        "this cluster (cluster: in the inventory), or take that one down from its own state "
        'folder" >&2; exit 3'
    )


def guarded_remove(words: Words, cluster: str, cluster_id: str) -> str:
    """Shell: remove this cluster's container (and one an older provisioner named
    `ray-CLUSTER`), each only when it carries this cluster's id label; succeeds when there
    is none. One without that label is left alone, and said so (`foreign_guard`)."""
    names = dict.fromkeys(
        (layout.container_name(cluster, cluster_id), layout.container_name(cluster))
    )
    steps = []
    for name in names:
        word = shlex.quote(name)
        steps.append(
            f"{foreign_guard(words, name, cluster_id, ':')}; "
            f'if [ -n "$o" ] && [ "$o" = {_id(cluster_id)} ]; then '
            f"{words.remove} {word} >/dev/null 2>&1; {words.exists} {word} >/dev/null 2>&1 && "
            f'{{ echo "the container {name} could not be removed" >&2; exit 1; }}; fi'
        )
    return "; ".join(steps) + "; exit 0"


def only_ours(words: Words, cluster: str, cluster_id: str, then: str) -> str:
    """Shell: run `then` (with the container's name in "$n") only when this cluster's
    container exists and carries its id label; else fail (exit 1)."""
    name = layout.container_name(cluster, cluster_id)
    return (
        f"n={shlex.quote(name)}; {owner(words, name)}; "
        f'[ -n "$o" ] && [ "$o" = {_id(cluster_id)} ] && {then}'
    )


def tls_options(inventory: Inventory) -> list[str]:
    """With TLS on: the node's TLS folder mounted read-only (with --mount, so a start
    without it fails, as for the token) and the variables that make Ray use it."""
    if not inventory.tls:
        return []
    source = layout.node_tls_dir(inventory.cluster)
    return [
        f"--mount type=bind,source={source},target={tls.CONTAINER_TLS_DIR},readonly",
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in tls.ray_env(tls.CONTAINER_TLS_DIR).items()),
    ]


def storage_options(inventory: Inventory) -> list[str]:
    """`storage: {path: DIR}`: the folder every node mounts, at the same path in the
    container (Tune's storage there is the same on every node; the doctor proves it),
    labelled with it (`RayState.storage`: `up` restarts a Ray whose folder changed)."""
    if inventory.storage != "path":
        return []
    path = shlex.quote(inventory.storage_path)
    label = shlex.quote(f"{layout.LABEL_STORAGE}={inventory.storage_path}")
    return [f"--mount type=bind,source={path},target={path}", f"--label {label}"]


def shm_size(inventory: Inventory) -> str:
    """The --shm-size value: the inventory's, or computed on the node like Ray's launcher."""
    if inventory.shm_size:
        return shlex.quote(str(inventory.shm_size))
    return f'"{_SHM_FROM_MEMINFO}"'


def run_command(
    words: Words,
    inventory: Inventory,
    node: Node,
    image: str,
    gpus: GpuPlan | None = None,
    cluster_id: str = "",
) -> str:
    """`CLI run` for the node's Ray container (run by a POSIX shell on the node);
    `gpus`: the node's GPUs for Ray, handed over in the runtime's words; `cluster_id` labels it
    and names it (`layout.container_name`); it refuses to start (exit 3) over a container
    of that name that is not provably this cluster's, or beside a container of another
    cluster of the same name (`words.start_guard`).

    A run refused because a container of that name exists that carries this cluster's id
    removes it and runs once more (`replace_ours`): `up` starts a node it saw without this
    cluster's container, and an `up` interrupted a moment before can still be creating one
    there (its `run` outlives the connection; seen: "Conflict. The container name ... is
    already in use" on the next `up`)."""
    cluster = inventory.cluster
    name = layout.container_name(cluster, cluster_id)
    parts = [
        f"{words.cli} run -d",
        f"--name {shlex.quote(name)}",
        *words.run,
        f"--shm-size={shm_size(inventory)}",
        f"-v {layout.node_ray_dir(cluster)}:{layout.CONTAINER_RAY_DIR}",
        # --mount, not -v: a start without the token file fails (-v would make a directory
        # there), so a container restarted by its policy after the node left the cluster
        # (and its token was removed) cannot join it
        f"--mount type=bind,source={layout.node_token_path(cluster)},"
        f"target={layout.CONTAINER_TOKEN_PATH},readonly",
        f"-v {layout.node_results_dir(cluster)}:{layout.CONTAINER_RESULTS_DIR}",
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in CONTAINER_ENV.items()),
        *tls_options(inventory),
        *storage_options(inventory),
        f"--label {shlex.quote(f'{layout.LABEL_CLUSTER}={cluster}')}",
        f"--label {shlex.quote(f'{layout.LABEL_ROLE}={node.role}')}",
        *(
            [f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}"]
            if cluster_id
            else []
        ),
        *words.gpus(gpus),
        shlex.quote(words.image(image)),
        shlex.join(ray_start_args(inventory, node, gpus=gpus)),
    ]
    prepare = f"mkdir -p {layout.node_ray_dir(cluster)} {layout.node_results_dir(cluster)}"
    run = " ".join(parts)
    if not cluster_id:
        return f"{prepare} && {run}"
    guard = words.start_guard(cluster, name, cluster_id)
    again = replace_ours(words, name, cluster_id, RUN_RAY)
    return f"{guard}; {prepare} && {RUN_RAY}() {{ {run}; }} && {{ {RUN_RAY} || {again}; }}"


RUN_RAY = "run_ray"  # run_command's shell function: the `run`, written once, tried twice


def replace_ours(words: Words, name: str, cluster_id: str, run: str) -> str:
    """Shell, after `run` failed ("$?" its status): when a container called `name` exists
    carrying this cluster's id, remove it and `run` again; else exit with that status."""
    return (
        f'{{ rc=$?; {owner(words, name)}; if [ "$o" = {_id(cluster_id)} ]; then '
        f"{words.remove} {shlex.quote(name)} >/dev/null 2>&1; {run}; else exit $rc; fi; }}"
    )


def remove_command(words: Words, cluster: str, cluster_id: str = "") -> str:
    """Stop and remove this cluster's Ray container (and one an older provisioner named
    `ray-CLUSTER`), each only when it carries this cluster's id label; succeeds when there
    is none. One without that label is not this cluster's: left alone, and said so on
    stderr (`foreign_guard`)."""
    return guarded_remove(words, cluster, cluster_id)


def running_test(words: Words, cluster: str, cluster_id: str = "") -> str:
    """Shell: true while this cluster's container runs."""
    running = f"{words.inspect} --format '{{{{.State.Running}}}}' \"$n\" 2>/dev/null"
    return only_ours(words, cluster, cluster_id, f'[ "$({running})" = true ]')


def exec_python_command(words: Words, cluster: str, *args: str, cluster_id: str = "") -> str:
    """Run a Python script read from stdin inside this cluster's Ray container."""
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    return f"{words.cli} exec -i {name} python - " + shlex.join(args)


def state_command(words: Words, cluster: str, cluster_id: str = "") -> str:
    """One line of JSON about this cluster's Ray container (or `null`)."""
    template = (
        '{"running": {{json .State.Running}}, "status": {{json .State.Status}}, '
        '"image": {{json .Image}}, "started_at": {{json .State.StartedAt}}, '
        '"restarts": {{json .RestartCount}}, "exit_code": {{json .State.ExitCode}}, '
        '"oom_killed": {{json .State.OOMKilled}}, '
        f'"cluster_id": {{{{json (index .Config.Labels "{layout.LABEL_CLUSTER_ID}")}}}}, '
        f'"gpus": {{{{json (index .Config.Labels "{layout.LABEL_GPUS}")}}}}, '
        f'"storage": {{{{json (index .Config.Labels "{layout.LABEL_STORAGE}")}}}}}}'
    )
    return f"{inspect(words, layout.container_name(cluster, cluster_id), template)} || echo null"


def parse_state(words: Words, stdout: str, cluster_id: str = "") -> RayState:
    """The JSON line of `state_command` (`null`: absent; a container without this
    cluster's id label, another's or none, is not this cluster's: absent too). The image
    ID is given as the pin writes it (`words.runs`)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip().startswith(("{", "null"))]
    data = json.loads(lines[-1]) if lines else None
    if not data or not cluster_id or data.get("cluster_id") != cluster_id:
        return RayState()
    image = data.get("image")
    return RayState(
        status=str(data.get("status") or "unknown"),
        runs=words.runs(str(image)) if image else None,
        started_at=data.get("started_at"),
        restarts=int(data.get("restarts") or 0),
        exit_code=data.get("exit_code"),
        oom_killed=bool(data.get("oom_killed")),
        gpus=str(data.get("gpus") or ""),
        storage=str(data.get("storage") or ""),
    )


def log_command(words: Words, cluster: str, lines: int | None = None, cluster_id: str = "") -> str:
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    tail = f" --tail {int(lines)}" if lines is not None else ""
    return f"{words.cli} logs --timestamps{tail} {name} 2>&1"


def gpu_probe_command(words: Words, image: str, gpus: GpuPlan) -> str:
    """The doctor's --gpu-deep round: a container of `image`, given the node's GPUs as `up`
    gives them, runs the probe script read from stdin (doctor.gpu_checks.PROBE)."""
    words_ = [f"{words.cli} run --rm -i", *words.probe, *words.probe_gpus(gpus)]
    return " ".join([*words_, shlex.quote(words.image(image)), "python3", "-"])


def forget_state(cluster: str) -> str:
    """Remove the local provider's state file on the head before `ray start`.

    /tmp/ray is on the node's disk (logs survive the container), so the state the last
    head's autoscaler wrote would survive `ray down` and name workers "running" that are
    not: a new head starts from a fresh state, as it would in a fresh container.
    """
    names = " ".join(
        shlex.quote(f"{layout.CONTAINER_RAY_DIR}/cluster-{cluster}.{ext}")
        for ext in ("state", "lock")
    )
    return f"rm -f {names}"


def run_options(inventory: Inventory, cluster_id: str = "", *, use_tls: bool = False) -> list[str]:
    """`docker run` options for `ray up` (Ray's `use_podman` takes the same): host
    networking is Ray's own; these add shm, token, logs, the cluster's id label, and with
    `use_tls` the variables that make Ray use the TLS files the launcher mounts at
    `tls.CONTAINER_TLS_DIR`."""
    env = {**CONTAINER_ENV, **(tls.ray_env(tls.CONTAINER_TLS_DIR) if use_tls else {})}
    options = [f"-e {k}={shlex.quote(v)}" for k, v in env.items()]
    if cluster_id:
        options.append(f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}")
    options.append(f"-v {layout.node_ray_dir(inventory.cluster)}:{layout.CONTAINER_RAY_DIR}")
    if inventory.shm_size:
        options.append(f"--shm-size={int(inventory.shm_size)}")
    return options


class ContainerRuntime:
    """Ray in the pinned image, one container per node: what Docker and Podman share. A
    subclass says its `words` and `judges_`, and its own `delivery`, `start_command`,
    `sockets_command`, `is_current`, `gpu_methods` and `render_image`."""

    name: ClassVar[str]
    words: ClassVar[Words]
    judges_: ClassVar[Judges]
    caps = CAPS
    log_file = "container.log"
    push = "direct"
    starting = "starting the {role} container"
    stopping = "removing the Ray container"

    def __init__(self, inventory: Inventory, pin: Pin | None) -> None:
        self.inventory = inventory
        self.pin = pin
        self.cluster = inventory.cluster
        self.image_id = pin.image_id if pin else ""
        self.cluster_id = read_cluster_id(inventory)  # "" before the first `up`

    def state_command(self) -> str:
        return state_command(self.words, self.cluster, self.cluster_id)

    def parse_state(self, stdout: str) -> RayState:
        return parse_state(self.words, stdout, self.cluster_id)

    def stop_command(self, node: Node) -> str:
        return remove_command(self.words, self.cluster, self.cluster_id)

    def gpu_probe_command(self, image: str, gpus: GpuPlan) -> str | None:
        return gpu_probe_command(self.words, image, gpus)

    @property
    def judges(self) -> Judges:
        return self.judges_

    def running_test(self) -> str:
        return running_test(self.words, self.cluster, self.cluster_id)

    def python_command(self, *args: str) -> str:
        return exec_python_command(self.words, self.cluster, *args, cluster_id=self.cluster_id)

    def runtime_log_command(self, lines: int | None = None) -> str:
        return log_command(self.words, self.cluster, lines, self.cluster_id)

    def render_image(self) -> tuple[str, tuple[str, ...], dict[str, Any]]:
        """For `ray up`: the image Ray's launcher names for every node, the commands that
        check it on each node first, and this runtime's own keys of the `docker` section."""
        return self.words.image(self.image_id), (), {}

    def render_section(self, token_path: Path, tls_dir: Path | None = None) -> RenderSection:
        image, initialization, own = self.render_image()
        mounts = {layout.CONTAINER_TOKEN_PATH: str(token_path)}
        if tls_dir is not None:
            mounts[tls.CONTAINER_TLS_DIR] = str(tls_dir)
        config = {
            "docker": {
                "image": image,
                "container_name": layout.container_name(self.cluster, self.cluster_id),
                "pull_before_run": False,
                **own,
                "run_options": run_options(
                    self.inventory, self.cluster_id, use_tls=tls_dir is not None
                ),
            },
            "file_mounts": mounts,
        }
        # Inside the container: a stale Ray there never holds a port; the launcher's state
        # on the node's disk (/tmp/ray is mounted) is this cluster's own.
        return RenderSection(
            config,
            before_start=(STOP,),
            head_before_start=(forget_state(self.cluster),),
            initialization=initialization,
        )
