"""Field tables and the validators every inventory format shares.

Values that end up in shell commands (names, addresses, users) are checked against
strict patterns here, so hostile values never reach a node; builders still quote.
"""

from __future__ import annotations

import contextlib
import difflib
import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import InventoryError
from provisioner.inventory.address import SCOPE_TEXT, checked_address
from provisioner.inventory.models import PORT_BASE_MAX, PORT_BASE_MIN, PORT_BLOCK, RayPorts

# Each pattern is checked whole (fullmatch): `re.match` with `$` accepts a trailing newline.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,62}")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?")
_CLUSTER = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# Ray's node label syntax (Kubernetes'): a name of 63 characters at most, alphanumeric at
# both ends, `-_.` between; a key may have a DNS-style prefix and `/`. Ray splits
# `--labels=k=v,k=v` on `,` and `=`, so a value holding them would reach it as other labels.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_VALUE = re.compile(rf"(?:{_LABEL})?")
_LABEL_KEY = re.compile(rf"(?:(?=[^/]{{1,253}}/)(?:{_LABEL})(?:\.(?:{_LABEL}))*/)?{_LABEL}")
RAY_LABEL_PREFIX = "ray.io/"  # reserved for Ray's own labels
_PYTHON = re.compile(r"/[A-Za-z0-9_./+-]{1,255}")
_STORAGE_PATH = re.compile(r"/[A-Za-z0-9_.+-][A-Za-z0-9_./+-]{0,254}")
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*", re.IGNORECASE)

# One table per settings schema: name -> what it holds (used for errors and docs).
TOP_FIELDS = {
    "cluster": "the cluster's name ([a-z0-9-])",
    "ssh": "SSH defaults for every node",
    "head": "the head node: an address or {name, address, ...}",
    "workers": "a list of worker nodes: addresses or {name, address, ...}",
    "image": "the image pin: {lock: PATH}",
    "ray": "Ray settings: {port_base, ports, shm_size, object_store_memory, python, tls}",
    "runtime": "how Ray runs on the nodes: a runtime's name (default docker: the pinned image)",
    "scheduler": "instead of head and workers: {type: slurm, login, partition, nodes, time, ...}",
    "price_per_node_hour": "what one node-hour costs you (a number): a job's cost in summary.json",
    "storage": "Tune's storage every node shares: {kind: head} (default: an S3 store the head "
    "serves), {path: DIR} (a filesystem every node mounts at DIR) or {kind: none} (Ray's own)",
}
STORAGE_KINDS = ("head", "none")
SSH_FIELDS = {
    "user": "login user",
    "key": "private key file (relative to the inventory)",
    "port": "SSH port (1-65535)",
    "known_hosts": "known_hosts file(s) checked besides ~/.ssh/known_hosts",
    "host_key_policy": "strict | accept-new",
    "jump": "jump host as user@host:port",
    "connect_timeout": "seconds to wait for a connection",
}
NODE_FIELDS = {
    "name": "the node's name",
    "address": "IP address or DNS name",
    "user": "login user (overrides ssh.user)",
    "port": "SSH port (overrides ssh.port)",
    "key": "private key file (overrides ssh.key)",
    "jump": "jump host (overrides ssh.jump)",
    "resources": "Ray resources: {NAME: number}",
    "labels": "Ray labels: {NAME: text}",
    "gpus": "NVIDIA GPUs for Ray: all (default) | none | [index or UUID, ...]",
    "ray": "Ray settings of this node: {address}",
}
NODE_RAY_FIELDS = {
    "address": "the address Ray uses on this node, on the network that carries Ray's traffic "
    "(--node-ip-address, the head's address workers join; default: the SSH address)",
}
IMAGE_FIELDS = {"lock": "the image lock file written by `provisioner image build`"}
RAY_FIELDS = {
    "port_base": f"first port of this cluster's block of {PORT_BLOCK} (every Ray port from it; "
    "default: Ray's usual ports)",
    "ports": "Ray's ports: {gcs, dashboard, client, ...} (each overrides its block's)",
    "shm_size": "size of /dev/shm for the Ray container (bytes or 8GiB)",
    "object_store_memory": "object store size (bytes or 4GiB)",
    "python": "host runtime: the interpreter Ray runs with (absolute path; default: a login "
    "shell's `ray`)",
    "tls": "TLS on Ray's channels between nodes, with a CA of the cluster's own (true, the "
    "default | false)",
    "subnet": "the network that carries Ray's traffic, as a CIDR: each node's Ray address is "
    "its own address inside it, asked of the node (a node's `ray: {address}` wins)",
}


@dataclass(frozen=True)
class Where:
    """A place in an inventory file."""

    path: Path
    line: int = 0

    def __str__(self) -> str:
        return f"{self.path}:{self.line}" if self.line else str(self.path)

    def at(self, line: int) -> Where:
        return Where(self.path, line)

    def error(self, field: str, message: str, fix: str) -> InventoryError:
        return InventoryError(f"{field}: {message}", fix, where=str(self))


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The valid key closest to a typo, if any is close."""
    matches = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None


def check_keys(
    mapping: Mapping[Any, Any], table: Mapping[str, str], where: Where, prefix: str
) -> None:
    """Refuse keys not in `table`, suggesting the closest valid one."""
    for key in mapping:
        if key in table:
            continue
        line = mapping.line_of(key) if hasattr(mapping, "line_of") else where.line
        field = f"{prefix}{key}"
        guess = closest(str(key), table)
        valid = ", ".join(table)
        fix = f"did you mean '{prefix}{guess}'?" if guess else f"valid keys here: {valid}"
        raise where.at(line).error(field, f"unknown key (expected one of: {valid})", fix)


def check_name(value: Any, where: Where, field: str) -> str:
    if isinstance(value, str) and ":" in value:  # an IPv6 address used as a host's name
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(value)
            return check_address(value, where, field)  # its scope id checked too
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise where.error(
            field,
            "expected a name of letters, digits, '.', '_' or '-' (not starting with '-'),"
            f" got {value!r}",
            "use a plain host name such as gpu-01",
        )
    return value


def check_address(value: Any, where: Where, field: str) -> str:
    """An IP address (in its usual form) or a DNS name: `address.checked_address`, the one
    check every address gets (an IPv6 scope id only as an interface's name or number)."""
    try:
        return checked_address(value)
    except ValueError:
        pass
    scoped = isinstance(value, str) and "%" in value
    raise where.error(
        field,
        f"expected an IP address or DNS name, got {value!r}"
        + (f" ({SCOPE_TEXT})" if scoped else ""),
        "write an address such as 10.0.0.5 or a name such as gpu-01.lab.example"
        + (", or a link-local address with its interface, e.g. fe80::1%eth0" if scoped else ""),
    )


def check_ray_address(value: Any, where: Where, field: str) -> str | None:
    """A node's Ray address (`ray: {address}`): an IP address, as Ray's --node-ip-address
    takes (None: absent, the SSH address then)."""
    if value is None:
        return None
    try:
        return str(ipaddress.ip_address(checked_address(str(value))))
    except ValueError:
        raise where.error(
            field,
            f"expected the IP address Ray uses on this node, got {value!r}",
            "write the node's address on the network that carries Ray's traffic, e.g. "
            "192.0.2.15 (`ip -o addr` on the node lists them)",
        ) from None


def check_ray_subnet(value: Any, where: Where, field: str) -> str | None:
    """The cluster-wide `ray: {subnet}`: a network as a CIDR, e.g. 10.10.0.0/24 (None:
    absent)."""
    if value is None:
        return None
    try:
        return str(ipaddress.ip_network(str(value), strict=False))
    except ValueError:
        raise where.error(
            field,
            f"expected the network that carries Ray's traffic as a CIDR, got {value!r}",
            "write it as ADDRESS/PREFIX, e.g. 10.10.0.0/24 (`ip -o addr` on a node lists "
            "its networks)",
        ) from None


def check_user(value: Any, where: Where, field: str) -> str:
    if not isinstance(value, str) or not _USER.fullmatch(value):
        raise where.error(
            field,
            f"expected a login name (letters, digits, '.', '_', '-'), got {value!r}",
            "write the user name you log in with, e.g. ubuntu",
        )
    return value


def check_cluster(value: Any, where: Where, field: str) -> str:
    if not isinstance(value, str) or not _CLUSTER.fullmatch(value):
        raise where.error(
            field,
            f"expected lowercase letters, digits and '-', got {value!r}",
            "name the cluster like my-cluster",
        )
    return value


def check_port(value: Any, where: Where, field: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise where.error(field, f"expected a port number 1-65535, got {value!r}", "use e.g. 22")
    return value


def check_port_base(value: Any, where: Where, field: str) -> RayPorts:
    """`ray.port_base`: the cluster's ports, from the block starting there (None: Ray's
    usual ports)."""
    if value is None:
        return RayPorts()
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not PORT_BASE_MIN <= value <= PORT_BASE_MAX
    ):
        raise where.error(
            field,
            f"expected the first port of a block of {PORT_BLOCK} ports, "
            f"{PORT_BASE_MIN}-{PORT_BASE_MAX}, got {value!r}",
            "use e.g. 20000 (and 21000, 22000, ... for the other clusters on these nodes)",
        )
    return RayPorts.from_base(value)


def check_number(value: Any, where: Where, field: str, *, zero_ok: bool = False) -> float:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    bad = isinstance(value, bool) or not isinstance(value, int | float)
    if bad or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        expected = "a number, 0 or more" if zero_ok else "a positive number"
        raise where.error(field, f"expected {expected}, got {value!r}", "use e.g. 10")
    return float(value)


def check_price(value: Any, where: Where, field: str) -> float | None:
    """A price per node-hour (absent: None, no cost is reckoned)."""
    return None if value is None else check_number(value, where, field, zero_ok=True)


def check_jump(value: Any, where: Where, field: str) -> str | None:
    """ProxyJump: [user@]host[:port] or ssh://[user@]host[:port], several joined by commas."""
    if value is None:
        return None
    text = str(value)
    for spec in text.split(","):
        spec = spec.strip().removeprefix("ssh://").rstrip("/")
        user, _, rest = spec.rpartition("@")
        if rest.startswith("["):
            host, _, tail = rest[1:].partition("]")
            port = tail.removeprefix(":")
        else:
            host, _, port = rest.partition(":")
        if user:
            check_user(user, where, field)
        check_address(host, where, field)
        if port:
            check_port(port, where, field)
    return text


_RUNTIME_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def check_runtime(value: Any, where: Where, field: str) -> tuple[str, str]:
    """A runtime's name, as data, and where the inventory writes it (`FILE:LINE`):
    the inventory checks its form; provisioner.runtime.registry refuses a name it does not
    know, naming that place, before any verb runs."""
    if not isinstance(value, str) or not _RUNTIME_NAME.fullmatch(value):
        raise where.error(
            field,
            f"expected a runtime's name, got {value!r}",
            "name how Ray runs on the nodes, e.g. docker (the pinned image) or host "
            "(each node's own Python)",
        )
    return value, str(where)


def check_python(value: Any, where: Where, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _PYTHON.fullmatch(value):
        raise where.error(
            field,
            f"expected an absolute path to a Python interpreter, got {value!r}",
            "e.g. /opt/venv/bin/python (letters, digits, / . _ + - only)",
        )
    return value


def check_flag(value: Any, where: Where, field: str, *, default: bool) -> bool:
    """A yes/no setting: true or false (absent: `default`)."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise where.error(field, f"expected true or false, got {value!r}", f"{field}: true")
    return value


def check_storage(value: Any, where: Where, field: str) -> tuple[str, str]:
    """`storage: {kind: head|none}` or `{path: DIR}`: the storage jobs get, as (kind, DIR)
    (absent: the head's store)."""
    if value is None:
        return "head", ""
    example = (
        f"write `{field}: {{kind: none}}` (Ray's own storage), `{field}: {{path: DIR}}` (a "
        "folder every node mounts), or leave it out (the head's store)"
    )
    if not isinstance(value, dict) or set(value) - {"kind", "path"} or len(value) > 1:
        raise where.error(
            field, f"expected {{kind: head|none}} or {{path: DIR}}, got {value!r}", example
        )
    if "path" in value:
        path = str(value["path"]).rstrip("/")
        if not _STORAGE_PATH.fullmatch(path) or ".." in path.split("/"):
            raise where.error(field, f"path {value['path']!r} is not an absolute path", example)
        return "path", path
    kind = value.get("kind", "head")
    if kind not in STORAGE_KINDS:
        raise where.error(field, f"kind {kind!r} is not one of {', '.join(STORAGE_KINDS)}", example)
    return str(kind), ""


def check_size(value: Any, where: Where, field: str) -> int | None:
    """Bytes from an integer or a size such as 8GiB / 512m."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    match = None if isinstance(value, bool) else _SIZE.fullmatch(str(value))
    size = 0
    if match:
        number, unit = float(match.group(1)), match.group(2).lower()
        size = int(number * 1024 ** "_kmgt".index(unit or "_"))
    if size < 1:
        raise where.error(
            field,
            f"expected a size above zero such as 8GiB or 4000000000, got {value!r}",
            "use e.g. 8GiB, or leave it out for the default",
        )
    return size


def check_string_map(value: Any, where: Where, field: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise where.error(
            field, f"expected a mapping of names to text, got {value!r}", "e.g. {zone: a}"
        )
    return {k: str(v) for k, v in value.items()}


def check_label_map(value: Any, where: Where, field: str) -> dict[str, str]:
    """Ray labels: each key and value as Ray's own label syntax allows (so Ray receives
    exactly these labels, one each)."""
    labels = check_string_map(value, where, field)
    syntax = (
        "63 characters at most, letters and digits at both ends, `-`, `_`, `.` between "
        "(Ray's label syntax; a key may have a DNS prefix: example.com/zone)"
    )
    for key, text in labels.items():
        if not _LABEL_KEY.fullmatch(key) or key.startswith(RAY_LABEL_PREFIX):
            raise where.error(
                f"{field}.{key[:60]}",
                f"{key[:60]!r} is not a Ray label name",
                f"use {syntax}, not starting with {RAY_LABEL_PREFIX}",
            )
        if not _LABEL_VALUE.fullmatch(text):
            raise where.error(
                f"{field}.{key}",
                f"{text[:60]!r} is not a Ray label value (Ray would read `,` and `=` as other "
                "labels)",
                f"use {syntax}",
            )
    return labels


def check_resource_map(value: Any, where: Where, field: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise where.error(
            field, f"expected a mapping of names to numbers, got {value!r}", "e.g. {GPU: 2}"
        )
    return {k: check_number(v, where, f"{field}.{k}", zero_ok=True) for k, v in value.items()}


_GPU_ID = re.compile(r"(?:\d{1,3}|(?:GPU|MIG)-[A-Za-z0-9/-]{1,80})")


def check_gpus(
    value: Any, resources: Mapping[str, float], where: Where, field: str
) -> tuple[str, ...] | None:
    """A node's GPUs: `all` (None: every GPU it has, or the first `resources.GPU` of them),
    `none` (no GPU), or a list of indices and UUIDs as nvidia-smi shows them."""
    count = resources.get("GPU")
    if count is not None and count != int(count):
        raise where.error(
            f"{field.rsplit('.', 1)[0]}.resources.GPU",
            f"expected a whole number of GPUs, got {count}",
            "give Ray whole GPUs: GPU: 1 (tasks ask for fractions, nodes do not)",
        )
    if value is None or value == "all":
        return None
    if value == "none":
        value = []
    items = [value] if isinstance(value, int | str) and not isinstance(value, bool) else value
    if not isinstance(items, list) or any(
        isinstance(i, bool) or not isinstance(i, int | str) or not _GPU_ID.fullmatch(str(i))
        for i in items
    ):
        raise where.error(
            field,
            f"expected all, none or a list of GPU indices and UUIDs, got {value!r}",
            "e.g. gpus: [0, 1] or gpus: [GPU-5ba6b7e4-...] (as `nvidia-smi -L` lists them)",
        )
    gpus = tuple(str(i) for i in items)
    if len(set(gpus)) != len(gpus):
        raise where.error(field, f"a GPU is named twice in {value!r}", "name each GPU once")
    if count is not None and int(count) != len(gpus):
        raise where.error(
            field,
            f"{len(gpus)} GPU(s) named but resources.GPU is {int(count)}",
            "leave resources.GPU out (the GPUs named are what Ray gets) or make them agree",
        )
    return gpus


HOST_KEY_POLICIES_TEXT = "strict or accept-new"
