"""provisioner's own inventory YAML."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from provisioner.inventory.fields import (
    HOST_KEY_POLICIES_TEXT,
    IMAGE_FIELDS,
    NODE_FIELDS,
    NODE_RAY_FIELDS,
    RAY_FIELDS,
    SSH_FIELDS,
    TOP_FIELDS,
    Where,
    check_address,
    check_cluster,
    check_flag,
    check_gpus,
    check_jump,
    check_keys,
    check_label_map,
    check_name,
    check_number,
    check_port,
    check_port_base,
    check_price,
    check_python,
    check_ray_address,
    check_ray_subnet,
    check_resource_map,
    check_runtime,
    check_size,
    check_storage,
    check_user,
)
from provisioner.inventory.located import LocatedList, LocatedMap
from provisioner.inventory.models import DEFAULT_RUNTIME, HOST_KEY_POLICIES, RayPorts
from provisioner.inventory.raw import RawHost, RawInventory, RawSSH, relative_path
from provisioner.inventory.scheduler import parse_scheduler

PORT_FIELDS = {f.name: f"port ({f.default})" for f in fields(RayPorts)}


def _line(mapping: Any, key: str, fallback: Where) -> Where:
    return fallback.at(mapping.line_of(key)) if isinstance(mapping, LocatedMap) else fallback


def _mapping(value: Any, where: Where, field: str, table: dict[str, str]) -> dict[str, Any]:
    if value is None:
        return LocatedMap()
    if not isinstance(value, dict):
        raise where.error(field, f"expected a mapping, got {value!r}", f"write {field}: {{...}}")
    check_keys(value, table, where, f"{field}.")
    return value


def parse_ssh(data: dict[str, Any], where: Where, path: Path, field: str) -> RawSSH:
    def at(key: str) -> Where:
        return _line(data, key, where)

    raw = RawSSH()
    if data.get("user") is not None:
        raw.user = check_user(data["user"], at("user"), f"{field}.user")
    if data.get("port") is not None:
        raw.port = check_port(data["port"], at("port"), f"{field}.port")
    if data.get("key") is not None:
        raw.key = relative_path(path, str(data["key"]))
        raw.key_at, raw.key_field = at("key"), f"{field}.key"
    if data.get("jump") is not None:
        raw.jump = check_jump(data["jump"], at("jump"), f"{field}.jump")
    return raw


def parse_host(item: Any, where: Where, path: Path, field: str) -> RawHost:
    if isinstance(item, str):
        address = check_address(item, where, field)
        return RawHost(name=address, address=address, where=where)
    data = _mapping(item, where, field, NODE_FIELDS)
    if "address" not in data:
        raise where.error(field, "missing 'address'", f"add address: IP-OR-NAME under {field}")
    address = check_address(data["address"], _line(data, "address", where), f"{field}.address")
    name = data.get("name", address)
    name = check_name(name, _line(data, "name", where), f"{field}.name")
    resources = check_resource_map(
        data.get("resources"), _line(data, "resources", where), f"{field}.resources"
    )
    ray_where = _line(data, "ray", where)
    ray = _mapping(data.get("ray"), ray_where, f"{field}.ray", NODE_RAY_FIELDS)
    return RawHost(
        name=name,
        address=address,
        where=where,
        ssh=parse_ssh(data, where, path, field),
        resources=resources,
        labels=check_label_map(data.get("labels"), _line(data, "labels", where), f"{field}.labels"),
        gpus=check_gpus(data.get("gpus"), resources, _line(data, "gpus", where), f"{field}.gpus"),
        data_address=check_ray_address(
            ray.get("address"), _line(ray, "address", ray_where), f"{field}.ray.address"
        ),
    )


def _workers(value: Any, where: Where, path: Path) -> list[RawHost]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise where.error(
            "workers", f"expected a list, got {value!r}", "write workers: [ADDRESS, ...]"
        )
    lines = value.item_lines if isinstance(value, LocatedList) else [where.line] * len(value)
    return [
        parse_host(item, where.at(line), path, f"workers[{i}]")
        for i, (item, line) in enumerate(zip(value, lines, strict=True))
    ]


def _ports(value: Any, where: Where, base: RayPorts) -> RayPorts:
    data = _mapping(value, where, "ray.ports", PORT_FIELDS)
    ports = {k: check_port(v, _line(data, k, where), f"ray.ports.{k}") for k, v in data.items()}
    result = replace(base, **ports)
    if result.min_worker > result.max_worker:
        raise where.error("ray.ports", "min_worker is above max_worker", "swap them")
    return result


def _known_hosts(value: Any, path: Path) -> tuple[Path, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    return tuple(relative_path(path, str(item)) for item in items)


def parse_native(path: Path, document: Any) -> RawInventory:
    """Read a provisioner inventory document (already parsed YAML)."""
    top = Where(path, 1)
    if not isinstance(document, dict):
        raise top.error(
            "(top level)",
            "expected a mapping with cluster, ssh, head, workers",
            "see inventories/ for examples",
        )
    check_keys(document, TOP_FIELDS, top, "")
    scheduler = None
    if "scheduler" in document:
        for listed in ("head", "workers"):
            if listed in document:
                raise _line(document, listed, top).error(
                    listed,
                    "an inventory with a scheduler lists no nodes: the scheduler allocates them",
                    f"remove {listed}: (or remove scheduler: to list the machines yourself)",
                )
        scheduler = parse_scheduler(
            document["scheduler"], _line(document, "scheduler", top), path, parse_host
        )
    elif "head" not in document:
        raise top.error(
            "head",
            "missing",
            "add head: ADDRESS (the machine that runs Ray's head), or scheduler: {type: slurm,"
            " ...} to have SLURM allocate the nodes",
        )
    cluster = check_cluster(
        document.get("cluster", path.stem.lower()), _line(document, "cluster", top), "cluster"
    )
    ssh_where = _line(document, "ssh", top)
    ssh = _mapping(document.get("ssh"), ssh_where, "ssh", SSH_FIELDS)
    policy = ssh.get("host_key_policy", "strict")
    if policy not in HOST_KEY_POLICIES:
        raise _line(ssh, "host_key_policy", ssh_where).error(
            "ssh.host_key_policy",
            f"expected {HOST_KEY_POLICIES_TEXT}, got {policy!r}",
            "use strict (or accept-new to trust on first use)",
        )
    image = _mapping(document.get("image"), _line(document, "image", top), "image", IMAGE_FIELDS)
    ray_where = _line(document, "ray", top)
    ray = _mapping(document.get("ray"), ray_where, "ray", RAY_FIELDS)
    timeout = ssh.get("connect_timeout")
    runtime, runtime_where = check_runtime(
        document.get("runtime", DEFAULT_RUNTIME), _line(document, "runtime", top), "runtime"
    )
    storage, storage_path = check_storage(
        document.get("storage"), _line(document, "storage", top), "storage"
    )
    return RawInventory(
        path=path,
        cluster=cluster,
        head=scheduler.login
        if scheduler
        else parse_host(document["head"], _line(document, "head", top), path, "head"),
        workers=_workers(document.get("workers"), _line(document, "workers", top), path),
        ssh=parse_ssh(ssh, ssh_where, path, "ssh"),
        known_hosts=_known_hosts(ssh.get("known_hosts"), path),
        host_key_policy=policy,
        connect_timeout=10.0
        if timeout is None
        else check_number(timeout, _line(ssh, "connect_timeout", ssh_where), "ssh.connect_timeout"),
        ports=_ports(
            ray.get("ports"),
            _line(ray, "ports", ray_where),
            check_port_base(
                ray.get("port_base"), _line(ray, "port_base", ray_where), "ray.port_base"
            ),
        ),
        image_lock=relative_path(path, str(image["lock"])) if image.get("lock") else None,
        shm_size=check_size(ray.get("shm_size"), _line(ray, "shm_size", ray_where), "ray.shm_size"),
        object_store_memory=check_size(
            ray.get("object_store_memory"),
            _line(ray, "object_store_memory", ray_where),
            "ray.object_store_memory",
        ),
        runtime=runtime,
        runtime_where=runtime_where,
        runtime_field="runtime",
        ray_python=check_python(ray.get("python"), _line(ray, "python", ray_where), "ray.python"),
        tls=check_flag(ray.get("tls"), _line(ray, "tls", ray_where), "ray.tls", default=True),
        ray_subnet=check_ray_subnet(
            ray.get("subnet"), _line(ray, "subnet", ray_where), "ray.subnet"
        ),
        ray_subnet_where=str(_line(ray, "subnet", ray_where)),
        price_per_node_hour=check_price(
            document.get("price_per_node_hour"),
            _line(document, "price_per_node_hour", top),
            "price_per_node_hour",
        ),
        slurm=scheduler.slurm if scheduler else None,
        storage=storage,
        storage_path=storage_path,
    )
