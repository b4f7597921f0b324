"""Ansible inventories (INI and YAML): groups for head and workers, host and group vars."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.inventory.fields import (
    HOST_KEY_POLICIES_TEXT,
    Where,
    check_address,
    check_cluster,
    check_jump,
    check_label_map,
    check_name,
    check_port,
    check_python,
    check_resource_map,
    check_runtime,
    check_user,
    closest,
)
from provisioner.inventory.located import LocatedMap
from provisioner.inventory.models import HOST_KEY_POLICIES
from provisioner.inventory.raw import RawHost, RawInventory, RawSSH, relative_path

HEAD_GROUPS = ("head", "ray_head", "heads")
WORKER_GROUPS = ("workers", "worker", "ray_workers", "ray_worker")
PROVISIONER_VARS = {
    "provisioner_cluster": "cluster name",
    "provisioner_known_hosts": "known_hosts file",
    "provisioner_host_key_policy": HOST_KEY_POLICIES_TEXT,
    "provisioner_jump": "jump host user@host:port",
    "provisioner_image_lock": "image lock file",
    "provisioner_runtime": "docker | host",
    "provisioner_ray_python": "host runtime: the interpreter Ray runs with",
    "provisioner_resources": "Ray resources of a host",
    "provisioner_labels": "Ray labels of a host",
}
_SECTION = re.compile(r"^\[([A-Za-z0-9_.-]+)(?::(vars|children))?\]\s*$")


@dataclass
class Group:
    hosts: dict[str, tuple[dict[str, Any], int]] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)


def _value(text: str) -> Any:
    """An INI value: a number, a JSON mapping or list (as Ansible reads them), or text."""
    if text.isdigit():
        return int(text)
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def parse_ini(path: Path, text: str) -> dict[str, Group]:
    """Groups from an INI inventory; lines are kept for error messages."""
    groups: dict[str, Group] = {"all": Group(), "ungrouped": Group()}
    current, kind = "ungrouped", "hosts"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        where = Where(path, number)
        section = _SECTION.match(line)
        if section:
            current, kind = section.group(1), section.group(2) or "hosts"
            groups.setdefault(current, Group())
            continue
        if line.startswith("["):
            raise where.error(
                "section",
                f"cannot read {line!r}",
                "write [group], [group:vars] or [group:children]",
            )
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:
            raise where.error("line", f"cannot read {line!r}: {exc}", "check the quotes") from None
        group = groups[current]
        if kind == "vars":
            key, sep, value = line.partition("=")
            if not sep:
                raise where.error(
                    current, f"expected key=value, got {line!r}", "write e.g. ansible_user=ubuntu"
                )
            group.vars[key.strip()] = _value(value.strip().strip("'\""))
        elif kind == "children":
            group.children.append(words[0])
        else:
            host_vars: dict[str, Any] = {}
            for word in words[1:]:
                key, sep, value = word.partition("=")
                if not sep:
                    raise where.error(
                        words[0],
                        f"expected key=value, got {word!r}",
                        "write e.g. ansible_host=10.0.0.5",
                    )
                host_vars[key] = _value(value)
            group.hosts[words[0]] = (host_vars, number)
    return groups


def _yaml_group(name: str, data: Any, where: Where, groups: dict[str, Group]) -> None:
    group = groups.setdefault(name, Group())
    if data is None:
        return
    if not isinstance(data, dict):
        raise where.error(
            name,
            f"expected a group mapping (hosts, vars, children), got {data!r}",
            "see inventories/ansible.yaml",
        )
    for key in data:
        if key not in ("hosts", "vars", "children"):
            guess = closest(str(key), ("hosts", "vars", "children"))
            line = data.line_of(key) if isinstance(data, LocatedMap) else where.line
            raise where.at(line).error(
                f"{name}.{key}",
                "unknown key (expected hosts, vars or children)",
                f"did you mean '{guess}'?" if guess else "use hosts, vars or children",
            )
    for key in ("hosts", "vars", "children"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise where.error(
                f"{name}.{key}",
                f"expected a mapping, got {data[key]!r}",
                "see inventories/ansible.yaml",
            )
    for host, host_vars in (data.get("hosts") or {}).items():
        if host_vars is not None and not isinstance(host_vars, dict):
            raise where.error(
                f"{name}.hosts.{host}",
                f"expected the host's variables as a mapping, got {host_vars!r}",
                "write e.g. gpu-01: {ansible_host: 10.0.0.5}",
            )
        line = data["hosts"].line_of(host) if isinstance(data["hosts"], LocatedMap) else where.line
        group.hosts[str(host)] = (dict(host_vars or {}), line)
    group.vars.update(data.get("vars") or {})
    for child, child_data in (data.get("children") or {}).items():
        group.children.append(str(child))
        line = (
            data["children"].line_of(child)
            if isinstance(data["children"], LocatedMap)
            else where.line
        )
        _yaml_group(str(child), child_data, where.at(line), groups)


def parse_yaml_groups(path: Path, document: dict[str, Any]) -> dict[str, Group]:
    groups: dict[str, Group] = {"all": Group()}
    for name, data in document.items():
        line = document.line_of(name) if isinstance(document, LocatedMap) else 0
        _yaml_group(str(name), data, Where(path, line), groups)
    return groups


def is_ansible_yaml(document: Any) -> bool:
    """An Ansible YAML inventory: groups whose values hold hosts/children/vars."""
    if not isinstance(document, dict) or (
        "head" in document and not isinstance(document["head"], dict | None)
    ):
        return False
    if "all" in document:
        return True
    return bool(document) and all(
        isinstance(v, dict) and set(v) <= {"hosts", "vars", "children"} and v
        for v in document.values()
    )


def _ancestors(groups: dict[str, Group], name: str) -> list[str]:
    """Groups whose vars apply to `name`, most general first."""
    parents = [g for g, group in groups.items() if name in group.children]
    chain: list[str] = []
    for parent in parents:
        for ancestor in _ancestors(groups, parent):
            if ancestor not in chain:
                chain.append(ancestor)
    return [*chain, name] if name != "all" else ["all"]


def _members(groups: dict[str, Group], name: str) -> dict[str, tuple[dict[str, Any], int]]:
    group = groups.get(name)
    if group is None:
        return {}
    found = dict(group.hosts)
    for child in group.children:
        for host, value in _members(groups, child).items():
            found.setdefault(host, value)
    return found


def _host_vars(
    groups: dict[str, Group], group_name: str, host: str, own: dict[str, Any]
) -> dict[str, Any]:
    merged: dict[str, Any] = dict(groups["all"].vars)
    for name in _ancestors(groups, group_name):
        merged.update(groups[name].vars)
    for name, group in groups.items():  # vars given to the same host elsewhere
        if host in group.hosts and name != group_name:
            merged.update(group.hosts[host][0])
    merged.update(own)
    return merged


def _check_vars(values: dict[str, Any], where: Where) -> None:
    for key in values:
        if key.startswith("provisioner_") and key not in PROVISIONER_VARS:
            guess = closest(key, PROVISIONER_VARS)
            raise where.error(
                key,
                "unknown provisioner variable",
                f"did you mean '{guess}'?" if guess else f"valid: {', '.join(PROVISIONER_VARS)}",
            )


def _host(path: Path, name: str, values: dict[str, Any], where: Where) -> RawHost:
    _check_vars(values, where)
    address = check_address(str(values.get("ansible_host", name)), where, f"{name}.ansible_host")
    ssh = RawSSH()
    user = values.get("ansible_user", values.get("ansible_ssh_user"))
    ssh.user = check_user(user, where, f"{name}.ansible_user") if user is not None else None
    port = values.get("ansible_port", values.get("ansible_ssh_port"))
    ssh.port = check_port(port, where, f"{name}.ansible_port") if port is not None else None
    key = values.get("ansible_ssh_private_key_file", values.get("ansible_private_key_file"))
    ssh.key = relative_path(path, str(key)) if key else None
    ssh.jump = check_jump(values.get("provisioner_jump"), where, f"{name}.provisioner_jump")
    return RawHost(
        name=check_name(name, where, f"{name} (host name)"),
        address=address,
        where=where,
        ssh=ssh,
        resources=check_resource_map(
            values.get("provisioner_resources"), where, f"{name}.provisioner_resources"
        ),
        labels=check_label_map(
            values.get("provisioner_labels"), where, f"{name}.provisioner_labels"
        ),
    )


def _group_hosts(path: Path, groups: dict[str, Group], names: tuple[str, ...]) -> list[RawHost]:
    hosts = []
    for group_name in names:
        for host, (own, line) in _members(groups, group_name).items():
            hosts.append(
                _host(path, host, _host_vars(groups, group_name, host, own), Where(path, line))
            )
    return hosts


def to_raw(path: Path, groups: dict[str, Group]) -> RawInventory:
    """Head and workers from the Ansible groups."""
    top = Where(path, 1)
    heads = _group_hosts(path, groups, HEAD_GROUPS)
    if len(heads) != 1:
        found = ", ".join(h.name for h in heads) or "none"
        raise top.error(
            "head group",
            f"expected exactly one host in a group named {' or '.join(HEAD_GROUPS)}, found {found}",
            "put the head machine alone in a [head] group",
        )
    workers = _group_hosts(path, groups, WORKER_GROUPS)
    common = dict(groups["all"].vars)
    _check_vars(common, top)
    policy = str(common.get("provisioner_host_key_policy", "strict"))
    if policy not in HOST_KEY_POLICIES:
        raise top.error(
            "provisioner_host_key_policy",
            f"expected {HOST_KEY_POLICIES_TEXT}, got {policy!r}",
            "use strict or accept-new",
        )
    known = common.get("provisioner_known_hosts")
    lock = common.get("provisioner_image_lock")
    return RawInventory(
        path=path,
        cluster=check_cluster(
            str(common.get("provisioner_cluster", path.stem.lower().replace("_", "-"))),
            top,
            "provisioner_cluster",
        ),
        head=heads[0],
        workers=workers,
        known_hosts=(relative_path(path, str(known)),) if known else (),
        host_key_policy=policy,
        image_lock=relative_path(path, str(lock)) if lock else None,
        runtime=check_runtime(
            str(common.get("provisioner_runtime", "docker")), top, "provisioner_runtime"
        ),
        ray_python=check_python(
            common.get("provisioner_ray_python"), top, "provisioner_ray_python"
        ),
    )
