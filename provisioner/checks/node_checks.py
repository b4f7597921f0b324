"""Checks of one node's own facts: sudo, docker, shells, image, address, resources, tools."""

from __future__ import annotations

import ipaddress
import shlex

from provisioner.checks.facts import NodeFacts
from provisioner.checks.findings import Finding, error, ok, warning
from provisioner.checks.plan import (
    DISK_ERROR_GIB,
    DISK_WARN_GIB,
    MEMORY_WARN_GIB,
    SHM_FRACTION,
    TMP_WARN_GIB,
    Plan,
)
from provisioner.inventory import Node

GIB_KB = 1024 * 1024
_ARCH = {
    "x86_64": "amd64",
    "aarch64": "arm64",
    "arm64": "arm64",
    "amd64": "amd64",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}


def check_docker(node: Node, f: NodeFacts) -> list[Finding]:
    user = node.ssh.user
    if f.docker_ok:
        return [
            ok("docker.daemon", node.name, f"docker {f.docker} runs"),
            ok("docker.access", node.name, f"{user} uses docker without sudo"),
        ]
    text = f.docker.lower()
    if "command not found" in text:
        return [
            error(
                "docker.daemon",
                node.name,
                "docker is not installed",
                f.docker,
                "install Docker Engine (https://docs.docker.com/engine/install/) and start it",
            )
        ]
    if "permission denied" in text:
        evidence = f"{f.docker}\nsocket: {f.docker_socket}\ngroups of {user}: {' '.join(f.groups)}"
        sudo_note = " (works with sudo)" if f.docker_sudo_ok else ""
        return [
            ok(
                "docker.daemon",
                node.name,
                "docker daemon runs" if f.docker_sudo_ok else "docker is installed",
            ),
            error(
                "docker.access",
                node.name,
                f"{user} cannot use docker without sudo{sudo_note}",
                evidence,
                f"sudo usermod -aG docker {user} on {node.name}, then log out and in (or restart "
                "sshd sessions)",
            ),
        ]
    return [
        error(
            "docker.daemon",
            node.name,
            "the docker daemon does not answer",
            f.docker,
            "start it: sudo systemctl enable --now docker (or dockerd)",
        )
    ]


def check_sudo(node: Node, f: NodeFacts) -> list[Finding]:
    if f.sudo.strip().endswith("ok"):
        return [ok("sudo", node.name, "sudo works without a password")]
    if f.docker_ok:
        return [ok("sudo", node.name, "sudo is not needed (docker works without it)", f.sudo)]
    return [
        warning(
            "sudo",
            node.name,
            "sudo asks for a password, so provisioner cannot repair docker access for you",
            f.sudo,
            f"add '{node.ssh.user} ALL=(ALL) NOPASSWD: ALL' via visudo, or fix docker access by "
            "hand",
        )
    ]


def _describe(
    shell_python: str | None, version: str | None, ray: str | None, ray_version: str | None
) -> str:
    py = f"python3 {version} ({shell_python})" if shell_python else "no python3"
    r = f"ray {ray_version or '?'} ({ray})" if ray else "no ray"
    return f"{py}, {r}"


def check_shells(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    login, plain = f.login, f.plain
    seen_login = _describe(login.python3, login.python3_version, login.ray, login.ray_version)
    seen_plain = _describe(plain.python3, plain.python3_version, plain.ray, plain.ray_version)
    same = (login.python3, login.python3_version, login.ray, login.ray_version) == (
        plain.python3,
        plain.python3_version,
        plain.ray,
        plain.ray_version,
    )
    if same:
        return [ok("shell.env", node.name, f"login and non-interactive shells agree: {seen_plain}")]
    evidence = (
        f"login shell (Ray's launcher): {seen_login}\nssh host cmd: {seen_plain}\n"
        f"PATH login: {login.path}\nPATH plain: {plain.path}"
    )
    where = "~/.bashrc above its 'not interactive' return, or /etc/environment"
    if login.ray and not plain.ray:
        message = (
            "`ray` is on the PATH of a login shell only: "
            "`ssh host ray ...` fails with `ray: command not found`"
        )
        # the directory comes from the node: quoted, so the line can be pasted as it is
        directory = shlex.quote(login.ray.rsplit("/", 1)[0])
        fix = f'put the PATH change (export PATH={directory}:"$PATH") in {where}'
    else:
        message = "python3/ray differ between a login shell and a non-interactive one"
        fix = f"set PATH (and any virtualenv activation) the same way for both: {where}"
    # The docker runtime's check (host mode has its own, runtime/host.py): Ray runs inside
    # the pinned image, so only the user's own commands on the node are affected.
    message += " (Ray runs inside the pinned image: only commands on the host are affected)"
    return [warning("shell.env", node.name, message, evidence, fix)]


def check_image(node: Node, f: NodeFacts, plan: Plan) -> list[Finding]:
    if plan.pin is None:
        return []
    arch = _ARCH.get(f.arch, f.arch)
    findings = []
    if not f.image:
        findings.append(
            warning(
                "image.present",
                node.name,
                f"the pinned image {plan.pin.image_id[:19]} is not on this node",
                "",
                "provisioner image push -i INVENTORY (up does it too)",
            )
        )
        image_arch = plan.pin.arch
    else:
        image_id, _, platform = f.image.partition(" ")
        image_arch = platform.rpartition("/")[2]
        findings.append(ok("image.present", node.name, f"holds the pinned image {image_id[:19]}"))
    if image_arch and arch and _ARCH.get(image_arch, image_arch) != arch:
        findings.append(
            error(
                "image.arch",
                node.name,
                f"the image is built for {image_arch}, the node is {f.arch}",
                f"uname -m: {f.arch}",
                f"build the image for {arch} (or leave this node out)",
            )
        )
    return findings


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def check_address(node: Node, f: NodeFacts) -> list[Finding]:
    findings = []
    loopback = [a for a in f.hostname_addresses if _is_loopback(a)]
    if loopback and not _is_loopback(node.address):
        findings.append(
            warning(
                "net.hostname",
                node.name,
                f"hostname {f.hostname} resolves to {', '.join(loopback)}: Ray started without "
                "--node-ip-address may advertise it and workers never join",
                f"getent ahosts {f.hostname}: {', '.join(f.hostname_addresses)}",
                f"in /etc/hosts on {node.name}, map {f.hostname} to {node.address} instead of "
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
        ipaddress.ip_address(node.address)
        literal = True
    except ValueError:
        literal = False
    if literal and f.addresses and node.address not in f.addresses:
        findings.append(
            warning(
                "net.address",
                node.name,
                f"the inventory address {node.address} is not on any interface of {node.name} "
                f"(NAT?): Ray would advertise {f.route_source or 'another address'}",
                f"addresses: {', '.join(a for a in f.addresses if ':' not in a)}",
                "use the node's own address in the inventory, one the other nodes can reach",
            )
        )
    elif literal and f.route_source and f.route_source != node.address:
        findings.append(
            warning(
                "net.address",
                node.name,
                f"toward the head this node sends from {f.route_source}, not the inventory's "
                f"{node.address}",
                f"ip route get <head>: src {f.route_source}",
                "use the address on the network the nodes share in the inventory",
            )
        )
    else:
        findings.append(ok("net.address", node.name, f"Ray would advertise {node.address}"))
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
    for disk in f.disks:
        free = disk.free_kb / GIB_KB
        is_docker = disk.path == (f.docker_root or "/var/lib/docker")
        if is_docker and not plan.caps.needs_image:
            continue  # a runtime without an image uses no Docker: its disk is not Ray's
        low, warn = (DISK_ERROR_GIB, DISK_WARN_GIB) if is_docker else (1.0, TMP_WARN_GIB)
        what = (
            "Docker's data"
            if is_docker
            else "Ray's logs and spill"
            if disk.path != "/tmp"
            else "temporary files"
        )
        if free < low:
            findings.append(
                error(
                    "resources.disk",
                    node.name,
                    f"only {free:.1f} GiB free at {disk.path} ({what})",
                    f"df {disk.path}: {disk.free_kb} KiB free",
                    f"free space under {disk.path} (docker system prune, old logs)",
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
