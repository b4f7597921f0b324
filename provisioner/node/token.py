"""The cluster's authentication token: generated locally, 0600, given to Ray by path.

The token never appears on a command line, in cluster.yaml, in logs or in --json output:
it travels to nodes on the stdin of an SSH command and reaches Ray through
`RAY_AUTH_TOKEN_PATH`, a file mounted read-only into the container.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import stat
from pathlib import Path

from provisioner.errors import InputError
from provisioner.inventory import Inventory
from provisioner.local import private_dir
from provisioner.node import layout

TOKEN_FILE = "auth_token"
CLUSTER_ID_FILE = "cluster_id"  # this state folder's cluster, told apart from namesakes
NEXT_FILE = "auth_token.next"  # a rotation under way: the token the nodes are being given


def local_token_path(inventory: Inventory) -> Path:
    """Where this machine keeps the cluster's token (inside the inventory's state dir)."""
    return Path(inventory.state_dir) / TOKEN_FILE


def ensure_token(inventory: Inventory) -> Path:
    """Return the token file's path, creating a new random token (mode 0600) if there is none."""
    path = local_token_path(inventory)
    private_dir(path.parent)
    if path.exists():
        check_token_file(path)
        return path
    _write_new(path)
    return path


def _write_new(path: Path) -> None:
    """A new random token at `path`, atomically (a temporary file, mode 0600, renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    tmp.replace(path)


def ensure_cluster_id(inventory: Inventory) -> str:
    """This cluster's id (16 hex digits, made once, kept in its state folder): what marks
    its container and its Ray processes on a node, so that a cluster of the same name
    from another state folder or another user is never taken for it."""
    path = Path(inventory.state_dir) / CLUSTER_ID_FILE
    found = read_cluster_id(inventory)
    if found:
        return found
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(8) + "\n")
    tmp.replace(path)
    return read_cluster_id(inventory)


def read_cluster_id(inventory: Inventory) -> str:
    """The cluster's id, or "" when this state folder has none yet (before the first
    `up`, or made by an older provisioner); anything but 16 hex digits counts as none."""
    try:
        text = (Path(inventory.state_dir) / CLUSTER_ID_FILE).read_text().strip()
    except OSError:
        return ""
    return text if re.fullmatch(r"[0-9a-f]{16}", text) else ""


def ray_container(inventory: Inventory) -> str:
    """The name of this cluster's Ray container on its nodes (docker runtime), from this
    state folder's cluster id: the one place callers with an inventory get it."""
    return layout.container_name(inventory.cluster, read_cluster_id(inventory))


def next_token_path(inventory: Inventory) -> Path:
    """Where a rotation keeps the new token until every node has been restarted with it."""
    return Path(inventory.state_dir) / NEXT_FILE


def rotation_unfinished(inventory: Inventory) -> bool:
    """A rotation began (its new token exists) but did not finish: the next `up` finishes it."""
    return next_token_path(inventory).exists()


def begin_rotation(inventory: Inventory) -> Path:
    """The new token's file: made now (random, 0600), or kept from an unfinished rotation,
    so that nodes given it before a failure keep the same one."""
    path = next_token_path(inventory)
    private_dir(path.parent)
    if path.exists():
        check_token_file(path)
    else:
        _write_new(path)
    return path


def finish_rotation(inventory: Inventory) -> None:
    """The new token becomes the cluster's (every node was restarted with it)."""
    next_token_path(inventory).replace(local_token_path(inventory))


def fingerprint(path: Path) -> str:
    """A short digest that tells two tokens apart without revealing either (kept in the
    cluster's local record, which node may still hold which token)."""
    digest = hashlib.sha256(read_token_file(path).encode()).hexdigest()
    return f"sha256:{digest[:16]}"


def check_token_file(path: Path) -> None:
    """Refuse a token file that others can read or that is empty."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InputError(
            f"the token file {path} has mode {mode:o}; others can read it",
            f"chmod 600 {path}",
        )
    if not path.read_text().strip():
        raise InputError(f"the token file {path} is empty", f"remove {path}; `up` makes a new one")


def read_token(inventory: Inventory) -> str:
    """The token's value (for HTTP clients that need it in a header)."""
    path = local_token_path(inventory)
    if not path.exists():
        raise InputError(
            f"no token for cluster {inventory.cluster!r} at {path}",
            "run `provisioner up` first; it creates the token",
        )
    return read_token_file(path)


def read_token_file(path: Path) -> str:
    """The one way to read a token file: present, private (0600) and not empty."""
    try:
        check_token_file(path)
        return path.read_text().strip()
    except OSError as exc:
        raise InputError(
            f"cannot read the cluster's token file {path}: {exc.strerror}",
            "run `provisioner up` first (it creates the token), or pass --token-file",
        ) from exc


def install_command(cluster: str) -> str:
    """Shell command writing stdin to the node's token file with mode 0600. Empty stdin (the
    connection closed before the token came: Ctrl-C, a broken link) changes nothing."""
    target = layout.node_token_path(cluster)
    directory = layout.node_path(cluster)
    return (
        f"umask 077 && mkdir -p {directory} && cat > {target}.new && test -s {target}.new && "
        f"chmod 600 {target}.new && mv -f {target}.new {target}"
    )
