"""Pure builders of the commands that start Ray on a node: `ray start` and `docker run`.

Every value from an inventory is quoted before it reaches a shell. The token is passed
by path only (`RAY_AUTH_TOKEN_PATH`), so it never shows in `ps` or in these strings.
`render` reuses the same `ray start` flags so that `ray up` and `up` build alike.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping

from provisioner.cluster import layout
from provisioner.inventory import Inventory, Node

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


def _port_flags(inventory: Inventory, *, head: bool) -> list[str]:
    p = inventory.ports
    flags = [
        f"--node-manager-port={p.node_manager}",
        f"--object-manager-port={p.object_manager}",
        f"--runtime-env-agent-port={p.runtime_env_agent}",
        f"--dashboard-agent-grpc-port={p.dashboard_agent_grpc}",
        f"--dashboard-agent-listen-port={p.dashboard_agent_http}",
        f"--metrics-export-port={p.metrics_export}",
        f"--min-worker-port={p.min_worker}",
        f"--max-worker-port={p.max_worker}",
    ]
    if head:
        flags = [
            f"--port={p.gcs}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={p.dashboard}",
            f"--ray-client-server-port={p.client}",
            *flags,
        ]
    return flags


def _node_flags(inventory: Inventory, node: Node) -> list[str]:
    flags: list[str] = []
    if node.resources:
        flags.append("--resources=" + json.dumps(dict(node.resources), sort_keys=True))
    if node.labels:
        flags.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(node.labels.items())))
    if inventory.object_store_memory:
        flags.append(f"--object-store-memory={int(inventory.object_store_memory)}")
    return flags


def head_address(inventory: Inventory) -> str:
    """The GCS address workers and clients connect to: HEAD_IP:GCS_PORT."""
    return f"{inventory.head.address}:{inventory.ports.gcs}"


def ray_start_args(inventory: Inventory, node: Node, *, block: bool = True) -> list[str]:
    """The arguments of `ray start` for `node` (unquoted)."""
    is_head = node.role == "head"
    args = ["ray", "start"]
    args += ["--head"] if is_head else [f"--address={head_address(inventory)}"]
    args.append(f"--node-ip-address={node.address}")
    args += _port_flags(inventory, head=is_head)
    args += _node_flags(inventory, node)
    args.append("--disable-usage-stats")
    if block:
        args.append("--block")
    return args


def shm_size(inventory: Inventory) -> str:
    """The --shm-size value: the inventory's, or computed on the node like Ray's launcher."""
    if inventory.shm_size:
        return shlex.quote(str(inventory.shm_size))
    return f'"{_SHM_FROM_MEMINFO}"'


def docker_run_command(inventory: Inventory, node: Node, image: str) -> str:
    """`docker run` for the node's Ray container (run by a POSIX shell on the node)."""
    cluster = inventory.cluster
    parts = [
        "docker run -d",
        f"--name {shlex.quote(layout.container_name(cluster))}",
        "--net=host",
        "--restart=unless-stopped",
        f"--shm-size={shm_size(inventory)}",
        f"-v {layout.node_ray_dir(cluster)}:{layout.CONTAINER_RAY_DIR}",
        f"-v {layout.node_token_path(cluster)}:{layout.CONTAINER_TOKEN_PATH}:ro",
        f"-v {layout.node_results_dir(cluster)}:{layout.CONTAINER_RESULTS_DIR}",
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in CONTAINER_ENV.items()),
        f"--label {shlex.quote(f'{layout.LABEL_CLUSTER}={cluster}')}",
        f"--label {shlex.quote(f'{layout.LABEL_ROLE}={node.role}')}",
        shlex.quote(image),
        shlex.join(ray_start_args(inventory, node)),
    ]
    prepare = f"mkdir -p {layout.node_ray_dir(cluster)} {layout.node_results_dir(cluster)}"
    return f"{prepare} && " + " ".join(parts)


def remove_container_command(cluster: str) -> str:
    """Stop and remove the node's Ray container; succeeds when there is none."""
    name = shlex.quote(layout.container_name(cluster))
    return f"docker rm -f {name} >/dev/null 2>&1; ! docker inspect {name} >/dev/null 2>&1"


def wait_for_port_command(cluster: str, host: str, port: int, timeout: float) -> str:
    """Poll HOST:PORT from the node every 0.1 s until it accepts a connection (exit 0);
    exit 3 as soon as the cluster's container is not running, 1 after `timeout` seconds."""
    name = shlex.quote(layout.container_name(cluster))
    probe = shlex.quote(f"exec 3<>/dev/tcp/{host}/{port}")
    tries = max(1, int(timeout * 10))
    return (
        f"for i in $(seq {tries}); do "
        f"timeout 1 bash -c {probe} 2>/dev/null && exit 0; "
        f"if [ $((i % 10)) = 0 ] && [ \"$(docker inspect -f '{{{{.State.Running}}}}' {name} "
        '2>/dev/null)" != true ]; then exit 3; fi; '
        "sleep 0.1; done; exit 1"
    )


def exec_python_command(cluster: str, *args: str) -> str:
    """Run a Python script read from stdin inside the node's Ray container."""
    name = shlex.quote(layout.container_name(cluster))
    return f"docker exec -i {name} python - " + shlex.join(args)


def container_facts_command(cluster: str) -> str:
    """One line of JSON about the Ray container (or `null`), plus the node's memory/CPU count."""
    name = shlex.quote(layout.container_name(cluster))
    fmt = shlex.quote(
        '{"running": {{json .State.Running}}, "status": {{json .State.Status}}, '
        '"image": {{json .Image}}, "started_at": {{json .State.StartedAt}}, '
        '"restarts": {{json .RestartCount}}, "exit_code": {{json .State.ExitCode}}, '
        '"oom_killed": {{json .State.OOMKilled}}}'
    )
    return f"docker inspect --format {fmt} {name} 2>/dev/null || echo null"


def ports_in_use_command(ports: list[int]) -> str:
    """List which of `ports` have a listening TCP socket on the node (one per line)."""
    pattern = "|".join(str(p) for p in sorted(set(ports)))
    return (
        "ss -Htln 2>/dev/null | awk '{print $4}' | sed 's/.*://' "
        f"| grep -Ex {shlex.quote(pattern)} | sort -un || true"
    )
