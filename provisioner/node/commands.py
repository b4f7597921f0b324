"""Pure builders of what every runtime shares: `ray start`'s flags, the head's address,
waiting for a port, the ports in use. How Ray runs on a node (a container, the node's own
Python) is the runtime's (`provisioner.runtime`).

Every value from an inventory is quoted before it reaches a shell. The token is passed
by path only (`RAY_AUTH_TOKEN_PATH`), so it never shows in `ps` or in these strings.
`render` reuses the same `ray start` flags so that `ray up` and `up` build alike.
"""

from __future__ import annotations

import json
import shlex

from provisioner.gpu.assignment import ACCELERATOR_RESOURCE, GpuPlan
from provisioner.inventory import Inventory, Node


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


def _node_flags(inventory: Inventory, node: Node, gpus: GpuPlan | None) -> list[str]:
    flags: list[str] = []
    # Ray refuses GPU among --resources: GPUs are --num-gpus, with the accelerator type as
    # the resource Ray itself adds for a GPU it detects
    resources = {k: v for k, v in node.resources.items() if k != "GPU"}
    if gpus is not None:
        flags.append(f"--num-gpus={gpus.count}")
        if gpus.accelerator_type:
            resources[f"{ACCELERATOR_RESOURCE}{gpus.accelerator_type}"] = 1
    elif "GPU" in node.resources:
        flags.append(f"--num-gpus={int(node.resources['GPU'])}")
    elif node.gpus == ():  # `gpus: none`: Ray on the host would count the node's own
        flags.append("--num-gpus=0")
    if resources:
        flags.append("--resources=" + json.dumps(resources, sort_keys=True))
    if node.labels:
        flags.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(node.labels.items())))
    if inventory.object_store_memory:
        flags.append(f"--object-store-memory={int(inventory.object_store_memory)}")
    return flags


def head_address(inventory: Inventory) -> str:
    """The GCS address workers and clients connect to: HEAD_IP:GCS_PORT, on the head's Ray
    address (`ray: {address}`; default its SSH address)."""
    return f"{inventory.head.ray_address}:{inventory.ports.gcs}"


def ray_start_args(
    inventory: Inventory, node: Node, *, block: bool = True, gpus: GpuPlan | None = None
) -> list[str]:
    """The arguments of `ray start` for `node` (unquoted); `gpus`: what Ray gets of the
    node's GPUs (gpu/assignment.py)."""
    is_head = node.role == "head"
    args = ["ray", "start"]
    args += ["--head"] if is_head else [f"--address={head_address(inventory)}"]
    args.append(f"--node-ip-address={node.ray_address}")
    args += _port_flags(inventory, head=is_head)
    args += _node_flags(inventory, node, gpus)
    args.append("--disable-usage-stats")
    if block:
        args.append("--block")
    return args


def wait_for_port_command(host: str, port: int, timeout: float, running_test: str) -> str:
    """Poll HOST:PORT from the node every 0.1 s until it accepts a connection (exit 0);
    exit 3 as soon as `running_test` (the runtime's: is this cluster's Ray still running
    here?) fails, 1 after `timeout` seconds."""
    # HOST and PORT reach the probe's bash as its arguments, never as its script's text: no
    # value of them is read as code by either shell
    probe = shlex.quote('exec 3<>"/dev/tcp/$1/$2"')
    target = f"{shlex.quote(host)} {int(port)}"
    tries = max(1, int(timeout * 10))
    return (
        f"for i in $(seq {tries}); do "
        f"timeout 1 bash -c {probe} probe {target} 2>/dev/null && exit 0; "
        f"if [ $((i % 10)) = 0 ] && ! {{ {running_test}; }}; then exit 3; fi; "
        "sleep 0.1; done; exit 1"
    )


def ports_in_use_command(ports: list[int]) -> str:
    """List which of `ports` have a listening TCP socket on the node (one per line)."""
    pattern = "|".join(str(p) for p in sorted(set(ports)))
    return (
        "ss -Htln 2>/dev/null | awk '{print $4}' | sed 's/.*://' "
        f"| grep -Ex {shlex.quote(pattern)} | sort -un || true"
    )
