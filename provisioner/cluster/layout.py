"""Where a cluster's things live: container names, node paths, container paths.

One place for the names that `up`, `status`, `down`, `logs` and `render` must agree on.
Paths on a node are relative to the SSH user's home and written for a POSIX shell
(`"$HOME"/...`), so they work for any user without asking the node first.
"""

from __future__ import annotations

import shlex

# Inside the container.
CONTAINER_TOKEN_PATH = "/run/provisioner/auth_token"
CONTAINER_RAY_DIR = "/tmp/ray"
# Jobs write their results here: the node's results directory, bind-mounted, so results
# and checkpoints live on the node's own disk and survive the container.
CONTAINER_RESULTS_DIR = "/provisioner/results"
# The variable that tells a job (and the Ray processes it inherits from) where that is.
RESULTS_ROOT_ENV = "PROVISIONER_RESULTS_ROOT"

# Docker labels put on every container this tool starts.
LABEL_CLUSTER = "provisioner.cluster"
LABEL_ROLE = "provisioner.role"
LABEL_GPUS = "provisioner.gpus"  # the GPUs a container was given (gpu.plan.signature)


def container_name(cluster: str) -> str:
    """The Ray container's name on every node of `cluster` (also `ray up`'s container_name)."""
    return f"ray-{cluster}"


def node_dir(cluster: str) -> str:
    """The cluster's directory on a node, relative to the SSH user's home."""
    return f".provisioner/clusters/{cluster}"


def node_path(cluster: str, *parts: str) -> str:
    """A shell word for a path under the cluster's node directory (expands $HOME)."""
    rel = "/".join((node_dir(cluster), *parts))
    return '"$HOME"/' + shlex.quote(rel)


def node_token_path(cluster: str) -> str:
    """Shell word: the token file on a node (0600, owned by the SSH user)."""
    return node_path(cluster, "auth_token")


def node_ray_dir(cluster: str) -> str:
    """Shell word: the node directory mounted as Ray's /tmp/ray (logs survive the container)."""
    return node_path(cluster, "ray")


def node_results_rel(cluster: str, *parts: str) -> str:
    """The results directory (or a path in it) relative to the SSH user's home (SFTP paths)."""
    return "/".join((node_dir(cluster), "results", *parts))


def node_results_dir(cluster: str, *parts: str) -> str:
    """Shell word: the node directory where jobs write their results (one directory per job)."""
    return node_path(cluster, "results", *parts)
