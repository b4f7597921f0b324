"""Checks of one node's own facts that every runtime shares: sudo, address, resources, tools.

A runtime's own judges (its daemon, its image, its shells) live with the runtime
(`provisioner/runtime/`); these read its facts through `RuntimeFacts` and name it by its
`Plan.label`.
"""

from __future__ import annotations

import ipaddress

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.intent import (
    DISK_ERROR_GIB,
    DISK_WARN_GIB,
    MEMORY_WARN_GIB,
    SHM_FRACTION,
    TMP_WARN_GIB,
    Plan,
)
from provisioner.inventory import Node

GIB_KB = 1024 * 1024


def check_sudo(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    """sudo without a password, where the runtime needs it (it does not answer the SSH user
    as it is: the fix of its access takes sudo)."""
    label = plan.label
    if f.sudo.strip().endswith("ok"):
        return [ok("sudo", node.name, "sudo works without a password")]
    if f.runtime.usable:
        return [ok("sudo", node.name, f"sudo is not needed ({label} works without it)", f.sudo)]
    return [
        warning(
            "sudo",
            node.name,
            f"sudo asks for a password, so provisioner cannot repair {label} access for you",
            f.sudo,
            f"add '{node.ssh.user} ALL=(ALL) NOPASSWD: ALL' via visudo, or fix {label} access by "
            "hand",
        )
    ]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_address(node: Node, f: NodeFacts) -> list[Finding]:
    findings = []
    loopback = [a for a in f.hostname_addresses if _is_loopback(a)]
    ray = node.ray_address  # what provisioner passes as --node-ip-address
    # the inventory's word for it: its SSH address, or the node's `ray: {address}`
    said = f"ray.address {ray}" if node.data_address else f"inventory address {ray}"
    if loopback and not _is_loopback(ray):
        findings.append(
            warning(
                "net.hostname",
                node.name,
                f"hostname {f.hostname} resolves to {', '.join(loopback)}: Ray started without "
                "--node-ip-address may advertise it and workers never join",
                f"getent ahosts {f.hostname}: {', '.join(f.hostname_addresses)}",
                f"in /etc/hosts on {node.name}, map {f.hostname} to {ray} instead of "
                f"{loopback[0]} (provisioner passes --node-ip-address itself)",
            )
        )
    else:
        findings.append(
            ok(
                "net.hostname",
                node.name,
                f"hostname {f.hostname} resolves to {', '.join(f.hostname_addresses) or 'nothing'}",
            )
        )
    try:
        ipaddress.ip_address(ray)
        literal = True
    except ValueError:
        literal = False
    where = "the node's `ray: {address}`" if node.data_address else "the inventory"
    if literal and f.addresses and ray not in f.addresses:
        if node.data_address:
            what = f"Ray would advertise {ray}, which other nodes cannot reach it at"
        else:
            what = f"Ray would advertise {f.route_source or 'another address'}"
        findings.append(
            warning(
                "net.address",
                node.name,
                f"the {said} is not on any interface of {node.name} (NAT?): {what}",
                f"addresses: {', '.join(a for a in f.addresses if ':' not in a)}",
                f"use the node's own address in {where}, one the other nodes can reach",
            )
        )
    elif literal and f.route_source and f.route_source != ray:
        findings.append(
            warning(
                "net.address",
                node.name,
                f"toward the head this node sends from {f.route_source}, not the {said}",
                f"ip route get <head>: src {f.route_source}",
                f"use the address on the network the nodes share in {where}",
            )
        )
    else:
        findings.append(ok("net.address", node.name, f"Ray would advertise {ray}"))
    return findings


def check_resources(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    findings = []
    mem_gib = f.mem_total_kb / GIB_KB
    store = plan.object_store_memory or int(f.mem_total_kb * 1024 * SHM_FRACTION)
    shm_planned = plan.shm_size or store
    if f.mem_total_kb and shm_planned > f.mem_total_kb * 1024:
        findings.append(
            error(
                "resources.shm",
                node.name,
                f"the planned /dev/shm ({shm_planned / 2**30:.1f} GiB) exceeds the node's memory "
                f"({mem_gib:.1f} GiB)",
                "",
                "lower ray.shm_size / ray.object_store_memory in the inventory",
            )
        )
    elif f.shm_kb is not None and f.shm_kb * 1024 < store and not plan.caps.containers:
        findings.append(
            warning(
                "resources.shm",
                node.name,
                f"/dev/shm is {f.shm_kb / GIB_KB:.1f} GiB, smaller than the object store "
                f"({store / 2**30:.1f} GiB): Ray falls back to /tmp and slows down",
                f"df /dev/shm: {f.shm_kb} KiB",
                "sudo mount -o remount,size=XG /dev/shm (or run Ray in the container with "
                "--shm-size)",
            )
        )
    else:
        findings.append(
            ok(
                "resources.shm",
                node.name,
                f"object store {store / 2**30:.1f} GiB fits (shm {shm_planned / 2**30:.1f} GiB "
                "planned)",
            )
        )
    if f.mem_total_kb and mem_gib < MEMORY_WARN_GIB:
        findings.append(
            warning(
                "resources.memory",
                node.name,
                f"only {mem_gib:.1f} GiB of memory",
                f"MemTotal {f.mem_total_kb} kB",
                "RLlib with torch needs several GiB per node; use a bigger machine",
            )
        )
    else:
        findings.append(
            ok(
                "resources.memory",
                node.name,
                f"{mem_gib:.1f} GiB memory, {f.mem_available_kb / GIB_KB:.1f} GiB available",
            )
        )
    findings.append(
        ok("resources.cpu", node.name, f"{f.cpus} CPUs ({f.arch})")
        if f.cpus >= 2
        else warning(
            "resources.cpu",
            node.name,
            f"{f.cpus} CPU",
            "",
            "Ray's own processes need a CPU; use a machine with 2 or more",
        )
    )
    root = f.runtime.data_root  # where the runtime keeps its images ("": none)
    for disk in f.disks:
        free = disk.free_kb / GIB_KB
        is_data = bool(root) and disk.path == root
        low, warn = (DISK_ERROR_GIB, DISK_WARN_GIB) if is_data else (1.0, TMP_WARN_GIB)
        what = (
            f"{plan.label}'s data"
            if is_data
            else "Ray's logs and spill"
            if disk.path != "/tmp"
            else "temporary files"
        )
        hint = f"{plan.label}'s unused images, old logs" if is_data else "old logs"
        if free < low:
            findings.append(
                error(
                    "resources.disk",
                    node.name,
                    f"only {free:.1f} GiB free at {disk.path} ({what})",
                    f"df {disk.path}: {disk.free_kb} KiB free",
                    f"free space under {disk.path} ({hint})",
                )
            )
        elif free < warn:
            findings.append(
                warning(
                    "resources.disk",
                    node.name,
                    f"{free:.1f} GiB free at {disk.path} ({what})",
                    f"df {disk.path}: {disk.free_kb} KiB free",
                    f"free space under {disk.path}",
                )
            )
        else:
            findings.append(ok("resources.disk", node.name, f"{free:.0f} GiB free at {disk.path}"))
    return findings


def check_tools(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    if f.rsync:
        return [ok("tools.rsync", node.name, f"rsync at {f.rsync}")]
    if plan.ray_up:
        return [
            error(
                "tools.rsync",
                node.name,
                "rsync is missing; Ray's `ray up` copies files with it",
                "",
                "sudo apt-get install -y rsync (or your distribution's package)",
            )
        ]
    return []
