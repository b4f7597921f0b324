"""Render a cluster.yaml for Ray's cluster launcher (local provider) from an inventory.

The file starts Ray with the same ports and flags as `provisioner up`, runs it the way the
runtime says (the pinned image without pulling; or the nodes' own Ray, stopping only this
cluster's Ray, never with `ray stop`), turns token authentication on, and is checked with
the installed Ray's own `prepare_config` and `validate_config` before anyone writes it.
The token itself is not in the file: only the local path of the token file, which
Ray's launcher copies (mode 0600 kept) to every node as a file mount. With TLS on (the
default, as for `up`), so are the TLS files: the cluster CA's certificate and one
certificate naming every node (`node.tls.render_files`), since the launcher gives every
node the same files; Ray then runs TLS with the cluster's CA, as under `up`.
"""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path
from typing import Any

import yaml

from provisioner.errors import InputError
from provisioner.inventory import Inventory, Node
from provisioner.node import commands, layout
from provisioner.runtime.context import ClusterContext
from provisioner.runtime.protocol import Runtime

HEADER = """\
# Ray cluster launcher config rendered by `provisioner render` from {inventory}.
# Use: ray up -y {name}   (and `ray down -y {name}`); the image must be on every node
# (`provisioner image push`). The token file below is copied to every node, mode 0600;
# so are the TLS files when TLS is on (one certificate naming every node's address).
# Ray 2.60: after a first `ray down`, /tmp/ray/cluster-{cluster}.state on the machine running
# `ray` marks the workers as torn down for good, so later `ray down`s skip them; remove that
# file before `ray up`, or use `provisioner down -i INVENTORY` (it stops every node).
"""

# Ray 2.60's `ray up` turns on autoscaler v2 for the head. With the local provider, v2 never
# records the head as a running node, counts it against max_workers and then logs "Adding 1
# node(s) of type local.cluster.node" every 5 s without starting the last worker (seen on
# the lab). The head's `ray start` runs with v1, which records the head (and is what the
# local provider was written for); v1 needs no variable on the machine running `ray up`.
_AUTOSCALER_V1 = "RAY_enable_autoscaler_v2=0"


def _start(inventory: Inventory, node: Node, *, extra: list[str]) -> str:
    args = commands.ray_start_args(inventory, node, block=False)
    if node.role == "worker":
        # One command serves every worker: the node's own address is detected by Ray.
        args = [a for a in args if not a.startswith("--node-ip-address=")]
    # `extra` is trusted text (it may hold a ~ for the shell to expand).
    return " ".join([shlex.join(args), *extra])


def _worker_template(inventory: Inventory) -> Node | None:
    """A worker whose resources and labels every worker shares (one shared start command)."""
    if not inventory.workers:
        return None
    first = inventory.workers[0]
    for w in inventory.workers[1:]:
        if w.resources != first.resources or w.labels != first.labels:
            raise InputError(
                "workers differ in resources or labels; Ray's local provider starts every "
                "worker with one command",
                "give all workers the same resources/labels, or use `provisioner up`",
                where=str(inventory.path),
            )
    return first


def build_config(
    inventory: Inventory, token_path: Path, runtime: Runtime, tls_dir: Path | None = None
) -> dict[str, Any]:
    """The cluster.yaml document (before Ray's defaults are merged in); `tls_dir`: the
    local TLS files every node gets (None: Ray runs without TLS)."""
    head = inventory.head
    key = head.ssh.key
    if key is None:
        raise InputError(
            "the inventory names no SSH key; Ray's launcher needs one",
            "set ssh.key in the inventory",
            where=str(inventory.path),
        )
    routed = [n.name for n in inventory.nodes if n.ssh.hops or n.ssh.proxy_command]
    if routed:
        raise InputError(
            f"{', '.join(routed)}: reached through a jump host or ProxyCommand, which Ray's"
            " cluster.yaml (local provider) cannot say",
            "use `provisioner up`, which goes through them, or reach these nodes directly",
            where=str(inventory.path),
        )
    if inventory.ray_subnet is not None:
        raise InputError(
            f"ray.subnet {inventory.ray_subnet}: each node's Ray address is asked of the node,"
            " which Ray's cluster.yaml (local provider: one address per node, for SSH and Ray)"
            " cannot say",
            "use `provisioner up`, which tells Ray each node's own address",
            where=inventory.ray_subnet_where or str(inventory.path),
        )
    apart = [n.name for n in inventory.nodes if n.data_address]
    if apart:
        raise InputError(
            f"{', '.join(apart)}: Ray's address apart from the SSH address (`ray: {{address}}`),"
            " which Ray's cluster.yaml (local provider: one address per node, for SSH and Ray)"
            " cannot say",
            "use `provisioner up`, which tells Ray each node's own address",
            where=str(inventory.path),
        )
    worker = _worker_template(inventory)
    n = len(inventory.workers)
    section = runtime.render_section(
        Path(token_path).resolve(), Path(tls_dir).resolve() if tls_dir else None
    )
    flags = list(section.start_flags)
    head_start = _start(
        inventory, head, extra=["--autoscaling-config=~/ray_bootstrap_config.yaml", *flags]
    )
    return {
        "cluster_name": inventory.cluster,
        "min_workers": n,
        "max_workers": n,
        "upscaling_speed": float(max(n, 1)),
        "idle_timeout_minutes": 5,
        "provider": {
            "type": "local",
            "head_ip": head.address,
            "worker_ips": [w.address for w in inventory.workers],
        },
        "auth": {"ssh_user": head.ssh.user, "ssh_private_key": str(Path(key).resolve())},
        **section.config,
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        # As the SSH user, before Docker would create the mounted directory as root.
        "initialization_commands": [
            f"mkdir -p {layout.node_ray_dir(inventory.cluster)}",
            *section.initialization,
        ],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            *section.before_start,
            *section.head_before_start,
            f"{section.env}{_AUTOSCALER_V1} {head_start}",
        ],
        "worker_start_ray_commands": [
            *section.before_start,
            f"{section.env}{_start(inventory, worker, extra=flags)}",
        ]
        if worker
        else [],
    }


def validate(config: dict[str, Any], *, where: str) -> dict[str, Any]:
    """Check `config` with the installed Ray's own code; return the prepared config."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    sink = io.StringIO()  # Ray's cli_logger prints; the library must not.
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            prepared: dict[str, Any] = prepare_config(config)
            validate_config(prepared)
    except (Exception, SystemExit) as exc:
        detail = str(exc) or sink.getvalue().strip() or type(exc).__name__
        raise InputError(
            f"Ray rejects the rendered cluster config: {detail}",
            "check the inventory's addresses, ssh user/key and ports",
            where=where,
        ) from exc
    return prepared


def render(
    inventory: Inventory, token_path: Path, runtime: Runtime, tls_dir: Path | None = None
) -> str:
    """The validated cluster.yaml text."""
    config = build_config(inventory, token_path, runtime, tls_dir)
    validate(config, where=str(inventory.path))
    body = yaml.safe_dump(config, sort_keys=False, default_flow_style=False, width=1000)
    header = HEADER.format(inventory=inventory.path, name="cluster.yaml", cluster=inventory.cluster)
    return header + body


def render_cluster(cluster: ClusterContext) -> str:
    """`render`: the cluster's token and id made (kept when they exist), its TLS files
    when the inventory asks for TLS, then the cluster.yaml of its runtime (the command's
    context: the pin as it read it)."""
    from provisioner.inventory.loader import require_nodes
    from provisioner.node import tls, token

    inventory = cluster.inventory
    require_nodes(inventory)
    path = token.ensure_token(inventory)
    token.ensure_cluster_id(inventory)  # before the runtime is built: it names the cluster
    tls_dir = tls.render_files(inventory) if inventory.tls else None
    return render(inventory, path, cluster.runtime, tls_dir)
