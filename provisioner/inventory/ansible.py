"""Ansible inventories (INI, YAML, TOML): read by ansible-core, mapped to head and workers.

ansible-core runs in a child process (provisioner/inventory/ansible_core.py) and answers,
for every host of the head and worker groups, the SSH options as its ssh connection
plugin resolves them. Here they become RawHosts; ssh_config is applied afterwards by
`ssh -G` (resolve.py) on the same command line Ansible would give ssh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from provisioner.errors import InventoryError
from provisioner.inventory.fields import (
    HOST_KEY_POLICIES_TEXT,
    Where,
    check_address,
    check_cluster,
    check_flag,
    check_gpus,
    check_jump,
    check_label_map,
    check_name,
    check_port,
    check_port_base,
    check_price,
    check_python,
    check_ray_address,
    check_ray_subnet,
    check_resource_map,
    check_runtime,
    check_storage,
    check_user,
    closest,
)
from provisioner.inventory.models import DEFAULT_RUNTIME, HOST_KEY_POLICIES
from provisioner.inventory.raw import RawHost, RawInventory, RawSSH, relative_path

INSTALL = "pip install 'provisioner[ansible]' (ansible-core 2.19)"
PROVISIONER_VARS = {
    "provisioner_cluster": "cluster name",
    "provisioner_known_hosts": "known_hosts file",
    "provisioner_host_key_policy": HOST_KEY_POLICIES_TEXT,
    "provisioner_jump": "jump host(s): [user@]host[:port][,...]",
    "provisioner_image_lock": "image lock file",
    "provisioner_runtime": "how Ray runs on the nodes: a runtime's name (default docker)",
    "provisioner_ray_python": "host runtime: the interpreter Ray runs with",
    "provisioner_ray_port_base": "first port of the cluster's block of Ray ports",
    "provisioner_ray_tls": "TLS on Ray's channels with the cluster's own CA (true | false)",
    "provisioner_price_per_node_hour": "what one node-hour costs (a job's cost in summary.json)",
    "provisioner_storage": "Tune's storage every node shares: {kind: head|none} or {path: DIR}",
    "provisioner_resources": "Ray resources of a host",
    "provisioner_labels": "Ray labels of a host",
    "provisioner_gpus": "NVIDIA GPUs for Ray: all | none | [index or UUID, ...]",
    "provisioner_ray_address": "the address Ray uses on a host (default: its SSH address)",
    "provisioner_ray_subnet": "the network that carries Ray's traffic, a CIDR (all's var): "
    "each host's Ray address is its own address there (a host's provisioner_ray_address wins)",
}
_CONNECTIONS = ("ssh", "smart")


def ansible_core_installed() -> bool:
    return importlib.util.find_spec("ansible") is not None


def read_with_ansible_core(paths: list[Path]) -> list[dict[str, Any]]:
    """What ansible-core makes of each inventory (see ansible_core.py for the shape)."""
    if not ansible_core_installed():
        raise InventoryError(
            "this is an Ansible inventory; provisioner reads those with ansible-core,"
            " which is not installed",
            f"install it: {INSTALL}",
            where=str(paths[0]) if len(paths) == 1 else None,
        )
    # a plain script (the child imports ansible-core, not provisioner); -P: its folder, where
    # this module is, must not shadow the `ansible` package
    script = Path(__file__).with_name("ansible_core.py")
    command = [sys.executable, "-P", str(script), *map(str, paths)]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode != 0:
            raise ValueError(done.stderr.strip().splitlines()[-1:] or done.returncode)
        documents: list[dict[str, Any]] = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise InventoryError(
            f"ansible-core could not read the inventory: {exc}",
            f"check that ansible-core works here (ansible-inventory -i {paths[0]} --list)",
            where=str(paths[0]),
        ) from None
    return documents


def _where(path: Path, origin: str | None) -> Where:
    if not origin:
        return Where(path)
    file, _, line = origin.rpartition(":")
    if file and line.isdigit():
        return Where(Path(file), int(line))
    return Where(Path(origin))


def _line_of(path: Path, name: str) -> Where:
    """Where a host is first written in the inventory (for errors about the host itself)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return Where(path)
    for number, line in enumerate(lines, start=1):
        if name in line.replace(":", " ").replace("[", " ").split() or line.strip().startswith(
            name
        ):
            return Where(path, number)
    return Where(path)


def _check_vars(values: dict[str, Any], where: dict[str, str | None], path: Path) -> None:
    for key in values:
        if key not in PROVISIONER_VARS:
            guess = closest(key, PROVISIONER_VARS)
            raise _where(path, where.get(key)).error(
                key,
                "unknown provisioner variable",
                f"did you mean '{guess}'?" if guess else f"valid: {', '.join(PROVISIONER_VARS)}",
            )


def _split(text: Any, at: Where, field: str) -> tuple[str, ...]:
    if not text:
        return ()
    try:
        return tuple(shlex.split(str(text)))
    except ValueError as exc:
        raise at.error(field, f"cannot split {text!r}: {exc}", "check the quotes") from None


def _host(path: Path, entry: dict[str, Any]) -> RawHost:
    name = entry["name"]
    origins: dict[str, str | None] = entry.get("where", {})

    def at(*names: str) -> Where:
        found = next((origins[n] for n in names if origins.get(n)), None)
        return _where(path, found) if found else _line_of(path, name)

    if "error" in entry:
        raise _where(path, entry["error"].get("where")).error(
            name, entry["error"]["message"], "fix the variable (Jinja templates must render)"
        )
    options = entry["options"]
    if entry.get("connection") not in _CONNECTIONS:
        raise at("ansible_connection").error(
            f"{name}.ansible_connection",
            "provisioner connects over SSH as Ansible's ssh plugin does,"
            f" not {entry.get('connection')!r}",
            "remove ansible_connection for this host, or set it to ssh",
        )
    for option, variable in (
        ("password", "ansible_password"),
        ("private_key", "ansible_private_key"),
    ):
        if options.get(option):
            raise at(variable, f"ansible_ssh_{option}").error(
                f"{name}.{variable}",
                "provisioner logs in with key files (and the SSH agent), not this",
                "use ansible_ssh_private_key_file, or load the key into ssh-agent",
            )
    values: dict[str, Any] = entry.get("vars", {})
    _check_vars(values, origins, path)
    host_at = at("ansible_host", "ansible_ssh_host")
    user_at = at("ansible_user", "ansible_ssh_user")
    port_at = at("ansible_port", "ansible_ssh_port")
    ssh = RawSSH()
    if options.get("remote_user") is not None:
        ssh.user = check_user(options["remote_user"], user_at, f"{name}.ansible_user")
    if options.get("port") is not None:
        ssh.port = check_port(options["port"], port_at, f"{name}.ansible_port")
    if options.get("private_key_file"):
        # as Ansible hands it to ssh: ~ expanded, a relative path relative to the current directory
        ssh.key = Path(os.path.expanduser(str(options["private_key_file"]))).absolute()
        ssh.key_at = at("ansible_ssh_private_key_file", "ansible_private_key_file")
        ssh.key_field = f"{name}.ansible_ssh_private_key_file"
    jump_at = at("provisioner_jump")
    ssh.jump = check_jump(values.get("provisioner_jump"), jump_at, f"{name}.provisioner_jump")
    common_at = at("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
    resources = check_resource_map(
        values.get("provisioner_resources"),
        at("provisioner_resources"),
        f"{name}.provisioner_resources",
    )
    return RawHost(
        name=check_name(name, host_at, f"{name} (host name)"),
        address=check_address(options["host"], host_at, f"{name}.ansible_host"),
        where=host_at,
        ssh=ssh,
        args_before=_split(
            options.get("ssh_args"), at("ansible_ssh_args"), f"{name}.ansible_ssh_args"
        ),
        args_after=(
            *_split(options.get("ssh_common_args"), common_at, f"{name}.ansible_ssh_common_args"),
            *_split(options.get("ssh_extra_args"), common_at, f"{name}.ansible_ssh_extra_args"),
        ),
        args_where=common_at,
        resources=resources,
        labels=check_label_map(
            values.get("provisioner_labels"), at("provisioner_labels"), f"{name}.provisioner_labels"
        ),
        gpus=check_gpus(
            values.get("provisioner_gpus"),
            resources,
            at("provisioner_gpus"),
            f"{name}.provisioner_gpus",
        ),
        data_address=check_ray_address(
            values.get("provisioner_ray_address"),
            at("provisioner_ray_address"),
            f"{name}.provisioner_ray_address",
        ),
    )


def to_raw(path: Path, document: dict[str, Any]) -> RawInventory:
    """Head and workers from what ansible-core read."""
    top = Where(path, 1)
    if "error" in document:
        error = document["error"]
        raise _where(path, error.get("where")).error(
            "Ansible inventory",
            error["message"],
            "fix that line (the syntax ansible-inventory accepts:"
            f" ansible-inventory -i {path} --list)",
        )
    if document.get("warnings"):
        named = re.search(r"\(([^()\s]+)\)", document["warnings"][0])
        raise (_line_of(path, named.group(1)) if named else top).error(
            "Ansible inventory",
            f"ansible-core warned: {document['warnings'][0]}",
            "fix what the warning names: provisioner does not go on with a partly read inventory",
        )
    entries = {e["name"]: e for e in document["hosts"]}
    heads = document["groups"]["head"]
    if len(heads) != 1:
        raise top.error(
            "head group",
            f"expected exactly one host in the group head, found {', '.join(heads) or 'none'}",
            "put the head machine alone in a [head] group",
        )
    head = _host(path, entries[heads[0]])
    workers = [_host(path, entries[n]) for n in dict.fromkeys(document["groups"]["workers"])]
    common: dict[str, Any] = entries[heads[0]].get("vars", {})
    origins = entries[heads[0]].get("where", {})

    def at(key: str) -> Where:
        return _where(path, origins.get(key)) if origins.get(key) else top

    policy = str(common.get("provisioner_host_key_policy", "strict"))
    if policy not in HOST_KEY_POLICIES:
        raise at("provisioner_host_key_policy").error(
            "provisioner_host_key_policy",
            f"expected {HOST_KEY_POLICIES_TEXT}, got {policy!r}",
            "use strict or accept-new",
        )
    known = common.get("provisioner_known_hosts")
    lock = common.get("provisioner_image_lock")
    runtime, runtime_where = check_runtime(
        str(common.get("provisioner_runtime", DEFAULT_RUNTIME)), top, "provisioner_runtime"
    )
    storage, storage_path = check_storage(
        common.get("provisioner_storage"), at("provisioner_storage"), "provisioner_storage"
    )
    return RawInventory(
        path=path,
        cluster=check_cluster(
            str(common.get("provisioner_cluster", path.stem.lower().replace("_", "-"))),
            at("provisioner_cluster"),
            "provisioner_cluster",
        ),
        head=head,
        workers=workers,
        known_hosts=(relative_path(path, str(known)),) if known else (),
        host_key_policy=policy,
        image_lock=relative_path(path, str(lock)) if lock else None,
        runtime=runtime,
        runtime_where=runtime_where,
        runtime_field="provisioner_runtime",
        ray_python=check_python(
            common.get("provisioner_ray_python"), top, "provisioner_ray_python"
        ),
        ports=check_port_base(
            common.get("provisioner_ray_port_base"),
            at("provisioner_ray_port_base"),
            "provisioner_ray_port_base",
        ),
        tls=check_flag(
            _ini_flag(common.get("provisioner_ray_tls")),
            at("provisioner_ray_tls"),
            "provisioner_ray_tls",
            default=True,
        ),
        ray_subnet=check_ray_subnet(
            common.get("provisioner_ray_subnet"),
            at("provisioner_ray_subnet"),
            "provisioner_ray_subnet",
        ),
        ray_subnet_where=str(at("provisioner_ray_subnet")),
        price_per_node_hour=check_price(
            common.get("provisioner_price_per_node_hour"),
            at("provisioner_price_per_node_hour"),
            "provisioner_price_per_node_hour",
        ),
        storage=storage,
        storage_path=storage_path,
    )


def _ini_flag(value: Any) -> Any:
    """An INI inventory's `true` / `false` arrive as text (ansible-core reads only Python's
    True / False as booleans there): the same yes/no as YAML's."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return value


def parse_ansible(path: Path) -> RawInventory:
    (document,) = read_with_ansible_core([path])
    return to_raw(path, document)
