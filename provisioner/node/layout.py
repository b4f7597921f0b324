"""Where a cluster's things live: container names, node paths, container paths.

One place for the names that `up`, `status`, `down`, `logs` and `render` must agree on.
Paths on a node are relative to the SSH user's home and written for a POSIX shell
(`"$HOME"/...`), so they work for any user without asking the node first.
"""

from __future__ import annotations

import hashlib
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
LABEL_GPUS = "provisioner.gpus"  # the GPUs a container was given (gpu.assignment.signature)
LABEL_STORAGE = "provisioner.storage"  # the shared folder it mounts (`storage: {path: DIR}`)
# The cluster's id (node.token.ensure_cluster_id): which state folder's cluster it is,
# so that a namesake of another user or state folder is never taken for this one.
LABEL_CLUSTER_ID = "provisioner.cluster-id"


ID_IN_NAME = 8  # hex digits of the cluster id in its container's name


def container_name(cluster: str, cluster_id: str = "") -> str:
    """The Ray container's name on every node of `cluster` (also `ray up`'s
    container_name): `ray-CLUSTER-ID`, with the first 8 hex digits of this state folder's
    cluster id, so that a cluster of the same name from another state folder or another
    user never has the same one. Without an id: `ray-CLUSTER`, the name an older
    provisioner gave (only ever removed when it carries this cluster's id label)."""
    return f"ray-{cluster}-{cluster_id[:ID_IN_NAME]}" if cluster_id else f"ray-{cluster}"


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


def node_tls_dir(cluster: str) -> str:
    """Shell word: the node's TLS folder (the cluster CA's certificate, the node's own
    certificate and key; 0700, files 0600)."""
    return node_path(cluster, "tls")


def node_ray_dir(cluster: str) -> str:
    """Shell word: the node directory mounted as Ray's /tmp/ray (logs survive the container)."""
    return node_path(cluster, "ray")


# Ray binds AF_UNIX sockets under TEMP_DIR/session_<date>_<time>_<usec>_<pid>/sockets/,
# e.g. `dash_PlatformEventsHead` (75 bytes from the temp dir on, with a 7-digit PID),
# and such a path may not exceed 107 bytes: a temp dir under a
# home directory is too long for it (the dashboard then fails to start). Ray is given a
# short name in /tmp instead, a link to the node directory (logs stay on the node's disk).
SHORT_RAY_PREFIX = "/tmp/prov-"
SHORT_NAME_MAX = 20


def short_name(cluster: str) -> str:
    """The cluster's name as its short temp dir carries it: the name itself, or for a
    name over 20 bytes its first 11 and a hash."""
    if len(cluster) <= SHORT_NAME_MAX:
        return cluster
    digest = hashlib.sha256(cluster.encode()).hexdigest()[:8]
    return f"{cluster[: SHORT_NAME_MAX - 9]}-{digest}"


def is_named(seen: str, cluster: str) -> bool:
    """Is `seen` (a name read on a node: a label, a temp dir) this cluster's?"""
    return bool(seen) and seen in (cluster, short_name(cluster))


def node_short_ray_dir(cluster: str) -> str:
    """Ray's `--temp-dir` where Ray runs on the node itself: /tmp/prov-CLUSTER, at most
    30 bytes (see `short_name`), so that every socket path under it stays within the
    limit; it names the cluster, for people and for `ps`."""
    return SHORT_RAY_PREFIX + short_name(cluster)


def link_short_ray_dir_command(cluster: str) -> str:
    """Make `node_short_ray_dir` a link to `node_ray_dir` (creating that), refusing when the
    name is another user's (/tmp is shared: a link someone else made would hand them this
    cluster's sockets) or not a link. The link is made under a fresh name and renamed
    into place (`mv -T`: rename(2), which /tmp's sticky bit refuses over another user's
    name and which never follows a directory made there meanwhile), then checked: ours,
    a link, to this cluster's directory. /tmp's sticky bit keeps it ours afterwards."""
    short = shlex.quote(node_short_ray_dir(cluster))
    refuse = (
        'echo "$t exists and is not a link of this user (a cluster of the same name of '
        'another user, or something left behind): remove it or rename the cluster" >&2; '
        "exit 2"
    )
    return (
        f"mkdir -p {node_ray_dir(cluster)} && t={short} && d={node_ray_dir(cluster)} && "
        'if [ -e "$t" ] || [ -L "$t" ]; then '
        f'[ -L "$t" ] && [ "$(stat -c %u "$t")" = "$(id -u)" ] || {{ {refuse}; }}; fi && '
        'n=$(mktemp -u "$t.XXXXXXXX") && ln -s "$d" "$n" && '
        f'{{ mv -T "$n" "$t" 2>/dev/null || {{ rm -f "$n"; {refuse}; }}; }} && '
        '[ -L "$t" ] && [ "$(stat -c %u "$t")" = "$(id -u)" ] && [ "$(readlink "$t")" = "$d" ] '
        f"|| {{ {refuse}; }}"
    )


def node_results_rel(cluster: str, *parts: str) -> str:
    """The results directory (or a path in it) relative to the SSH user's home (SFTP paths)."""
    return "/".join((node_dir(cluster), "results", *parts))


def node_results_dir(cluster: str, *parts: str) -> str:
    """Shell word: the node directory where jobs write their results (one directory per job)."""
    return node_path(cluster, "results", *parts)
