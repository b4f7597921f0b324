"""Ray in the pinned image's container: `docker run --net=host IMAGE ray start --block`.

The container is named after the cluster and its id (`layout.container_name`) and carries
its labels; nothing is removed or run into on a name alone, only with this cluster's id
label; Ray's temp dir is the
node directory `~/.provisioner/clusters/CLUSTER/ray`, mounted at /tmp/ray so that logs
survive the container; the token is a read-only file mount named by RAY_AUTH_TOKEN_PATH,
so it never appears on a command line; so is the node's TLS folder (`node.tls`). A
restart policy restarts a crashed Ray.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from provisioner.errors import InputError, RemoteError
from provisioner.gpu.facts import GpuFacts
from provisioner.gpu.plan import GpuPlan
from provisioner.image.pin import CLUSTER_TAG, Pin
from provisioner.inventory import Inventory, Node
from provisioner.node import layout, tls
from provisioner.node.commands import ray_start_args
from provisioner.node.token import read_cluster_id
from provisioner.runtime import containers
from provisioner.runtime.base import (
    Capabilities,
    DeliveryReport,
    Judges,
    RayState,
    RenderSection,
)
from provisioner.runtime.docker.direct import store_ids
from provisioner.runtime.docker.doctor import JUDGES
from provisioner.runtime.docker.gpu import gpu_options, run_gpu_options
from provisioner.runtime.docker.push import PushOptions, push_image

if TYPE_CHECKING:
    from provisioner.console import Reporter
    from provisioner.remote import Pool, Session

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


def shm_size(inventory: Inventory) -> str:
    """The --shm-size value: the inventory's, or computed on the node like Ray's launcher."""
    if inventory.shm_size:
        return shlex.quote(str(inventory.shm_size))
    return f'"{_SHM_FROM_MEMINFO}"'


def _owner(name: str) -> str:
    """Shell: o = the cluster id label of the container called `name`: "" when there is
    no such container, "-" when it carries none."""
    fmt = shlex.quote(
        f'{{{{with index .Config.Labels "{layout.LABEL_CLUSTER_ID}"}}}}{{{{.}}}}'
        "{{else}}-{{end}}"
    )
    return f"o=$(docker inspect --format {fmt} {shlex.quote(name)} 2>/dev/null)"


WORDS = containers.Words(
    owner=_owner,
    where="on this node",
    cli="docker",
    remove=lambda word: f"docker rm -f {word}",
    exists=lambda word: f"docker inspect {word}",
)


def _namesake_verdict(cluster_id: str) -> str:
    """Shell, in a loop over containers of this cluster's name ("$n" its name, "$i" its id
    label, "" when none): refuse (exit 3, saying so) unless it carries this cluster's id:
    both clusters would share the node folder `~/.provisioner/clusters/CLUSTER` (token,
    logs, results) when they are the same SSH user's. That container is left alone."""
    return (
        f'[ "$i" = {shlex.quote(cluster_id)} ] && continue; '
        'echo "the container $n on this node belongs to another cluster of the same name '
        f"(cluster id ${{i:-none}}; this state folder's: {cluster_id}): left alone; rename "
        "this cluster (cluster: in the inventory), or take that one down from its own state "
        'folder" >&2; exit 3'
    )


def start_guard(cluster: str, name: str, cluster_id: str) -> str:
    """Shell, one `docker ps` (where two Docker calls were the start's first 30-70 ms):
    refuse (exit 3, saying so) over a container called `name` that is not provably this
    cluster's (no id label, or another's: `containers.foreign_verdict`), or beside a
    container of another cluster of the same name (`_namesake_verdict`). Nothing is ever
    removed or run into on a name alone."""
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
        f"{_namesake_verdict(cluster_id)}; done || exit 3"
    )


def docker_run_command(
    inventory: Inventory,
    node: Node,
    image: str,
    gpus: GpuPlan | None = None,
    cluster_id: str = "",
) -> str:
    """`docker run` for the node's Ray container (run by a POSIX shell on the node);
    `gpus`: the node's GPUs for Ray and the way its Docker hands them over; `cluster_id`
    labels it and names it (`layout.container_name`); it refuses to start (exit 3) over a
    container of that name that is not provably this cluster's, or beside a container of
    another cluster of the same name (`start_guard`: one `docker ps` for both)."""
    cluster = inventory.cluster
    name = layout.container_name(cluster, cluster_id)
    parts = [
        "docker run -d",
        f"--name {shlex.quote(name)}",
        "--net=host",
        "--restart=unless-stopped",
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
        f"--label {shlex.quote(f'{layout.LABEL_CLUSTER}={cluster}')}",
        f"--label {shlex.quote(f'{layout.LABEL_ROLE}={node.role}')}",
        *(
            [f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}"]
            if cluster_id
            else []
        ),
        *run_gpu_options(gpus),
        shlex.quote(image),
        shlex.join(ray_start_args(inventory, node, gpus=gpus)),
    ]
    prepare = f"mkdir -p {layout.node_ray_dir(cluster)} {layout.node_results_dir(cluster)}"
    guard = f"{start_guard(cluster, name, cluster_id)}; " if cluster_id else ""
    return f"{guard}{prepare} && " + " ".join(parts)


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


def remove_container_command(cluster: str, cluster_id: str = "") -> str:
    """Stop and remove this cluster's Ray container (and one an older provisioner named
    `ray-CLUSTER`), each only when it carries this cluster's id label; succeeds when there
    is none. One without that label is not this cluster's: left alone, and said so on
    stderr (`containers.foreign_guard`)."""
    return containers.guarded_remove(WORDS, cluster, cluster_id)


def _ours(cluster: str, cluster_id: str, then: str) -> str:
    """Shell: run `then` (with the container's name in "$n") only when this cluster's
    container exists and carries its id label; else fail (exit 1)."""
    return containers.only_ours(WORDS, cluster, cluster_id, then)


def container_running_test(cluster: str, cluster_id: str = "") -> str:
    return _ours(
        cluster, cluster_id, '[ "$(docker inspect -f \'{{.State.Running}}\' "$n")" = true ]'
    )


def exec_python_command(cluster: str, *args: str, cluster_id: str = "") -> str:
    """Run a Python script read from stdin inside this cluster's Ray container."""
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    return f"docker exec -i {name} python - " + shlex.join(args)


def container_sockets_command(cluster: str, cluster_id: str = "") -> str:
    """Shell: the inode of every socket held by a process inside this cluster's Ray
    container (its PID namespace: nothing outside it is seen), one a line; nothing when
    the container is not running or does not carry this cluster's id label. The
    container shares the node's network namespace (--net=host), so these are the inodes
    the node's /proc/net/tcp lists."""
    listing = "ls -l /proc/[0-9]*/fd/ 2>/dev/null; exit 0"
    return (
        _ours(cluster, cluster_id, f'docker exec "$n" sh -c {shlex.quote(listing)}')
        + " | sed -n 's/.*socket:\\[\\([0-9]*\\)\\]$/\\1/p'; exit 0"
    )


def container_facts_command(cluster: str, cluster_id: str = "") -> str:
    """One line of JSON about the Ray container (or `null`)."""
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    fmt = shlex.quote(
        '{"running": {{json .State.Running}}, "status": {{json .State.Status}}, '
        '"image": {{json .Image}}, "started_at": {{json .State.StartedAt}}, '
        '"restarts": {{json .RestartCount}}, "exit_code": {{json .State.ExitCode}}, '
        '"oom_killed": {{json .State.OOMKilled}}, '
        f'"cluster_id": {{{{json (index .Config.Labels "{layout.LABEL_CLUSTER_ID}")}}}}, '
        f'"gpus": {{{{json (index .Config.Labels "{layout.LABEL_GPUS}")}}}}}}'
    )
    return f"docker inspect --format {fmt} {name} 2>/dev/null || echo null"


def parse_container_facts(stdout: str, cluster_id: str = "") -> RayState:
    """Parse the one JSON line of `container_facts_command` (`null`: absent; a container
    without this cluster's id label, another's or none, is not this cluster's: absent
    too)."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    data = json.loads(lines[-1]) if lines else None
    if not data or not cluster_id or data.get("cluster_id") != cluster_id:
        return RayState()
    return RayState(
        status=str(data.get("status") or "unknown"),
        runs=data.get("image"),
        started_at=data.get("started_at"),
        restarts=int(data.get("restarts") or 0),
        exit_code=data.get("exit_code"),
        oom_killed=bool(data.get("oom_killed")),
        gpus=str(data.get("gpus") or ""),
    )


def container_log_command(cluster: str, lines: int | None = None, cluster_id: str = "") -> str:
    name = shlex.quote(layout.container_name(cluster, cluster_id))
    tail = f" --tail {int(lines)}" if lines is not None else ""
    return f"docker logs --timestamps{tail} {name} 2>&1"


# Runs in the container before `ray start`: the container holds this cluster's Ray only.
_STOP = "ray stop --force >/dev/null 2>&1 || true"


def _forget_state(cluster: str) -> str:
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
    """`docker run` options for `ray up`: host networking is Ray's own; these add shm,
    token, logs, the cluster's id label, and with `use_tls` the variables that make Ray
    use the TLS files the launcher mounts at `tls.CONTAINER_TLS_DIR`."""
    env = {**CONTAINER_ENV, **(tls.ray_env(tls.CONTAINER_TLS_DIR) if use_tls else {})}
    options = [f"-e {k}={shlex.quote(v)}" for k, v in env.items()]
    if cluster_id:
        options.append(f"--label {shlex.quote(f'{layout.LABEL_CLUSTER_ID}={cluster_id}')}")
    options.append(f"-v {layout.node_ray_dir(inventory.cluster)}:{layout.CONTAINER_RAY_DIR}")
    if inventory.shm_size:
        options.append(f"--shm-size={int(inventory.shm_size)}")
    return options


def push_options(mode: str) -> PushOptions:
    """The push `up --push MODE` makes (runtime.base.PUSH_MODES)."""
    if mode == "direct":
        return PushOptions()
    return PushOptions(forward=True, chain_from=1 if mode == "chain" else 2)


def gpu_probe_command(image: str, gpus: GpuPlan) -> str:
    """The doctor's --gpu-deep round: a container of `image`, given the node's GPUs as `up`
    gives them, runs the probe script read from stdin (doctor.gpu_checks.PROBE)."""
    words = ["docker run --rm -i --net=none", *gpu_options(gpus), shlex.quote(image)]
    return " ".join([*words, "python3", "-"])


def has_image_command(image_id: str) -> str:
    """Prints the ID the node's Docker holds the image `image_id` under ("": not held)."""
    i = shlex.quote(image_id)
    return f"docker image inspect --format '{{{{.Id}}}}' {i} 2>/dev/null || true"


def tag_holds_pin_command(pin: Pin) -> str:
    """Shell on a node: fails, saying so, unless the cluster tag names an image of exactly
    the pin's layers (their diff IDs, which Docker's classic and containerd image stores
    both report, where the image's own ID differs between them)."""
    layers = "{{range .RootFS.Layers}}{{.}} {{end}}"
    got = f"docker image inspect --format {shlex.quote(layers)} {shlex.quote(CLUSTER_TAG)}"
    want = shlex.quote("".join(f"{d} " for d in pin.layers))
    why = shlex.quote(
        f"{CLUSTER_TAG} on this node is not the pinned image {pin.short_id()}: "
        "run `provisioner image push -i INVENTORY` first"
    )
    return f'test "$({got} 2>/dev/null)" = {want} || {{ echo {why} >&2; exit 1; }}'


def holds_image(stdout: str, image_id: str) -> bool:
    """Pure: `has_image_command`'s output names exactly `image_id`."""
    return bool(image_id) and stdout.strip() == image_id


class DockerDelivery:
    """The docker runtime's delivery: the push of the pin (`docker.push`, the way `push`
    says: runtime.base.PUSH_MODES), which sends each node only the layers it lacks,
    verifies the ID and only then moves the cluster tag."""

    def __init__(
        self,
        inventory: Inventory,
        pin: Pin | None,
        push: str = "auto",
        *,
        node_ids: dict[str, str] | None = None,
    ) -> None:
        self.inventory = inventory
        self.pin = pin
        self.push = push
        self.image_id = pin.image_id if pin else ""
        # node -> the pin's ID in its image store (Docker's containerd image store: its
        # manifest's digest), as `deliver` found them (the doctor's round, or a push where
        # it differs); shared with the runtime that made this delivery, which runs the
        # image by that ID there
        self.node_ids: dict[str, str] = {} if node_ids is None else node_ids

    def has_command(self) -> str:
        return has_image_command(self.image_id)

    def holds(self, stdout: str) -> bool:
        return any(holds_image(stdout, i) for i in {self.image_id, *self.node_ids.values()})

    def verify(self, session: Session) -> None:
        got = session.run(self.has_command(), timeout=60).stdout.strip()
        if not self.holds(got):
            short = self.image_id.removeprefix("sha256:")[:12]
            raise RemoteError(
                session.host,
                f"the node's Docker does not hold the pinned image {short} "
                f"(it holds: {got or 'no such image'})",
                "run `provisioner up` again; it pushes the image again",
                kind="load-failed",
            )

    def deliver(
        self, pool: Pool, report: Reporter, *, ready: Mapping[str, str] | None = None
    ) -> DeliveryReport:
        if self.pin is None:
            raise InputError(
                "the inventory names no image pin (image.lock), and the docker runtime runs Ray "
                "in the pinned image",
                "run `provisioner image build`, then set image.lock in the inventory "
                "(or `runtime: host` to run Ray from the nodes' own Python)",
                where=str(self.inventory.path),
            )
        report(f"image: making every node hold {self.pin.short_id()} (push: {self.push})")
        ready = ready or {}
        # the ID each node the doctor saw holding the pin has it by: its start runs that,
        # with no image lookup first (`DockerRuntime.start_command`)
        self.node_ids.update(ready)
        pushed = push_image(
            self.inventory, pool, report, pin=self.pin, opts=push_options(self.push), held=ready
        )
        self.node_ids.update(
            (name, n.image_id)
            for name, n in pushed.nodes.items()
            if n.image_id and n.image_id != self.pin.image_id
        )
        return pushed


# Ray in a container of the pinned image on each node.
CAPS = Capabilities(containers=True, needs_image=True)


class DockerRuntime:
    """Ray in the pinned image, one container per node."""

    name = "docker"
    caps = CAPS
    log_file = "container.log"
    push = "auto"
    starting = "starting the {role} container"
    stopping = "removing the Ray container"

    def __init__(self, inventory: Inventory, pin: Pin | None, *, image: str | None = None) -> None:
        self.inventory = inventory
        self.pin = pin
        self.cluster = inventory.cluster
        # what `docker run` names: the pinned ID, else the cluster tag a push leaves
        self.image = image or (pin.image_id if pin else CLUSTER_TAG)
        self.image_id = pin.image_id if pin else ""
        # the pin's ID in each node's image store (Docker's containerd image store names
        # it by its manifest's digest), as its delivery found it: the doctor's round saw
        # it there, or a push told it where it differs
        self.node_ids: dict[str, str] = {}
        self._store_ids: frozenset[str] | None = None
        self.cluster_id = read_cluster_id(inventory)  # "" before the first `up`

    def delivery(self) -> DockerDelivery:
        # the push tells the pin's ID on nodes whose image store names it otherwise
        return DockerDelivery(self.inventory, self.pin, self.push, node_ids=self.node_ids)

    def state_command(self) -> str:
        return container_facts_command(self.cluster, self.cluster_id)

    def parse_state(self, stdout: str) -> RayState:
        return parse_container_facts(stdout, self.cluster_id)

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

    def gpu_probe_command(self, image: str, gpus: GpuPlan) -> str | None:
        return gpu_probe_command(image, gpus)

    @property
    def judges(self) -> Judges:
        return JUDGES

    @staticmethod
    def gpu_methods(facts: GpuFacts) -> tuple[str, ...]:
        return facts.methods()  # the ways this node's Docker hands GPUs to a container

    def stop_command(self, node: Node) -> str:
        return remove_container_command(self.cluster, self.cluster_id)

    def running_test(self) -> str:
        return container_running_test(self.cluster, self.cluster_id)

    def python_command(self, *args: str) -> str:
        return exec_python_command(self.cluster, *args, cluster_id=self.cluster_id)

    def sockets_command(self) -> str:
        return container_sockets_command(self.cluster, self.cluster_id)

    def runtime_log_command(self, lines: int | None = None) -> str:
        return container_log_command(self.cluster, lines, self.cluster_id)

    def render_section(self, token_path: Path, tls_dir: Path | None = None) -> RenderSection:
        # Ray's launcher names one image for every node, and Docker's containerd image
        # store does not know the pin by its ID (it names it by its manifest's digest): the
        # pinned image goes by the cluster tag a push leaves, checked on each node first.
        image, initialization = self.image, tuple[str, ...]()
        if self.pin is not None and self.image == self.pin.image_id:
            image, initialization = CLUSTER_TAG, (tag_holds_pin_command(self.pin),)
        mounts = {layout.CONTAINER_TOKEN_PATH: str(token_path)}
        if tls_dir is not None:
            mounts[tls.CONTAINER_TLS_DIR] = str(tls_dir)
        config = {
            "docker": {
                "image": image,
                "container_name": layout.container_name(self.cluster, self.cluster_id),
                "pull_before_run": False,
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
            before_start=(_STOP,),
            head_before_start=(_forget_state(self.cluster),),
            initialization=initialization,
        )


RUNTIME = DockerRuntime
