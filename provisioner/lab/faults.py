"""Faults to inject into lab nodes, each with its undo.

Faults are applied from the host with `docker exec` (the lab's own control path),
recorded in the lab's faults.json so that `lab fault clear` can undo them all.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from provisioner.errors import InputError, LabError
from provisioner.lab import gpusim
from provisioner.lab.config import LabNode
from provisioner.lab.engine import docker_cli, exec_rc
from provisioner.lab.nodes import LabInfo, split_networks, wait_ready

TAG = "provisioner-fault"


@dataclass(frozen=True)
class Fault:
    kind: str
    node: str
    arg: str = ""

    def key(self) -> str:
        return f"{self.kind}:{self.node}:{self.arg}"


def _record(lab: LabInfo, fault: Fault, active: bool) -> None:
    path = lab.state_dir / "faults.json"
    faults = _load(path)
    faults.pop(fault.key(), None)
    if active:
        faults[fault.key()] = {"kind": fault.kind, "node": fault.node, "arg": fault.arg}
    path.write_text(json.dumps(faults, indent=1) + "\n")


def _load(path: Path) -> dict[str, dict[str, str]]:
    return json.loads(path.read_text()) if path.exists() else {}


def active(lab: LabInfo) -> list[Fault]:
    return [Fault(**f) for f in _load(lab.state_dir / "faults.json").values()]


def _run(node: LabNode, script: str) -> str:
    rc, out = exec_rc(node.container, script)
    if rc != 0:
        raise LabError(
            f"{node.name}: fault command failed (exit {rc}): {out.strip()[-300:]}",
            "check that the node runs (`provisioner lab status`); `provisioner lab fault clear` "
            "undoes every fault",
        )
    return out


# --- stop / start ------------------------------------------------------------------------


def stop(lab: LabInfo, node: LabNode) -> None:
    """Power a node off (its container stops; disk and host keys are kept)."""
    docker_cli(["stop", "-t", "3", node.container], timeout=60)
    _record(lab, Fault("stop", node.name), True)


def start(lab: LabInfo, node: LabNode) -> None:
    """Power a node back on and wait for its sshd and dockerd."""
    docker_cli(["start", node.container], timeout=60)
    wait_ready(node)
    if node.data_address:  # its firewall went with its network namespace
        split_networks(node)
    _record(lab, Fault("stop", node.name), False)


# --- cut / uncut traffic between two nodes ----------------------------------------------


def _cut_rules(peer: str) -> list[str]:
    comment = f"-m comment --comment {TAG}"
    return [f"INPUT -s {peer} {comment} -j DROP", f"OUTPUT -d {peer} {comment} -j DROP"]


def cut(lab: LabInfo, a: LabNode, b: LabNode) -> None:
    """Drop all traffic between two nodes, in both directions (iptables in each node)."""
    if a == b:
        raise InputError("cut needs two different nodes", "name two different lab nodes")
    for node, peer in ((a, b), (b, a)):
        for rule in _cut_rules(peer.address):
            _run(node, f"iptables -C {rule} 2>/dev/null || iptables -I {rule}")
    _record(lab, Fault("cut", a.name, b.name), True)


def uncut(lab: LabInfo, a: LabNode, b: LabNode) -> None:
    for node, peer in ((a, b), (b, a)):
        for rule in _cut_rules(peer.address):
            _run(node, f"while iptables -C {rule} 2>/dev/null; do iptables -D {rule}; done")
    _record(lab, Fault("cut", a.name, b.name), False)


# --- occupy / release a TCP port ----------------------------------------------------------

_LISTENER = (
    "import socket,sys,time\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(8)\n"
    "time.sleep(10**8)\n"
)


def occupy(lab: LabInfo, node: LabNode, port: int) -> None:
    """Hold a TCP port on a node with a listener that is not Ray."""
    if not 1 <= port <= 65535:
        raise InputError(f"port must be 1-65535, got {port}", "pass a TCP port from 1 to 65535")
    pidfile = f"/run/{TAG}-port-{port}.pid"
    script = (
        f"python3 -c {shlex.quote(_LISTENER)} {port} >/dev/null 2>&1 & echo $! > {pidfile}; "
        f"for i in $(seq 50); do ss -ltn | grep -q ':{port} ' && exit 0; sleep 0.1; done; exit 1"
    )
    _run(node, script)
    _record(lab, Fault("occupy", node.name, str(port)), True)


def release(lab: LabInfo, node: LabNode, port: int) -> None:
    pidfile = f"/run/{TAG}-port-{port}.pid"
    _run(node, f"[ -f {pidfile} ] && kill $(cat {pidfile}) 2>/dev/null; rm -f {pidfile}; true")
    _record(lab, Fault("occupy", node.name, str(port)), False)


# --- delay / undelay a node's link --------------------------------------------------------

_PROXY_PORT = 2299
_PROXY_PID = f"/run/{TAG}-delay.pid"
_REDIRECT = (
    f"PREROUTING -p tcp --dport 22 -m comment --comment {TAG} -j REDIRECT --to-ports {_PROXY_PORT}"
)


def delay(lab: LabInfo, node: LabNode, ms: int) -> None:
    """Add `ms` of round-trip latency to a node's link.

    With sch_netem in the kernel: `tc netem` on the node's eth0 (every packet it sends).
    Without it (common on cloud and sandbox kernels): a user-space proxy that delays the
    node's SSH traffic, reached through an iptables REDIRECT of inbound port 22.
    """
    if not 0 < ms <= 10_000:
        raise InputError(f"delay must be 1-10000 ms, got {ms}", "pass a delay from 1 to 10000 ms")
    undelay(lab, node)
    rc, out = exec_rc(node.container, f"tc qdisc replace dev eth0 root netem delay {ms}ms")
    if rc == 0:
        _record(lab, Fault("delay", node.name, f"netem:{ms}"), True)
        return
    if "unknown" not in out:
        raise LabError(
            f"{node.name}: tc netem failed: {out.strip()[-300:]}",
            "check that the node runs (`provisioner lab status`) and has NET_ADMIN; "
            "`provisioner lab fault clear` undoes every fault",
        )
    _run(
        node,
        f"python3 /usr/local/lib/lab-delay-proxy.py {_PROXY_PORT} {ms} >/dev/null 2>&1 & "
        f"echo $! > {_PROXY_PID}; "
        f"for i in $(seq 50); do ss -ltn | grep -q ':{_PROXY_PORT} ' && break; sleep 0.1; done; "
        f"iptables -t nat -I {_REDIRECT}",
    )
    _record(lab, Fault("delay", node.name, f"ssh-proxy:{ms}"), True)


def throttle(lab: LabInfo, node: LabNode, mbit: float, ms: int = 0) -> None:
    """Limit a node's SSH link to `mbit` Mbit/s in each direction (and add `ms` of round
    trip), without the kernel: the user-space proxy's token bucket, shared by every
    connection to the node's sshd, reached through the same REDIRECT as `delay`.
    Undo with `undelay`."""
    if not 0 < mbit <= 100_000:
        raise InputError(
            f"rate must be 0-100000 Mbit/s, got {mbit}", "pass a rate above 0, at most 100000"
        )
    if not 0 <= ms <= 10_000:
        raise InputError(f"delay must be 0-10000 ms, got {ms}", "pass a delay from 0 to 10000 ms")
    undelay(lab, node)
    rate = int(mbit * 1e6)
    _run(
        node,
        f"python3 /usr/local/lib/lab-delay-proxy.py {_PROXY_PORT} {ms} {rate} >/dev/null 2>&1 & "
        f"echo $! > {_PROXY_PID}; "
        f"for i in $(seq 50); do ss -ltn | grep -q ':{_PROXY_PORT} ' && break; sleep 0.1; done; "
        f"iptables -t nat -I {_REDIRECT}",
    )
    _record(lab, Fault("delay", node.name, f"ssh-proxy:{ms}:{rate}bit/s"), True)


def undelay(lab: LabInfo, node: LabNode) -> None:
    _run(
        node,
        "tc qdisc del dev eth0 root 2>/dev/null; "
        f"while iptables -t nat -C {_REDIRECT} 2>/dev/null; "
        f"do iptables -t nat -D {_REDIRECT}; done; "
        f"[ -f {_PROXY_PID} ] && kill $(cat {_PROXY_PID}) 2>/dev/null; rm -f {_PROXY_PID}; true",
    )
    for f in active(lab):
        if f.kind == "delay" and f.node == node.name:
            _record(lab, f, False)


# --- hang / unhang sshd -------------------------------------------------------------------


def hang(lab: LabInfo, node: LabNode) -> None:
    """Freeze the node's sshd listener: TCP connections are accepted but never answered."""
    _run(node, "kill -STOP $(cat /run/sshd.pid)")
    _record(lab, Fault("hang", node.name), True)


def unhang(lab: LabInfo, node: LabNode) -> None:
    _run(node, "kill -CONT $(cat /run/sshd.pid)")
    _record(lab, Fault("hang", node.name), False)


# --- isolate / unisolate: SSH only through a jump host -------------------------------------


def _isolate_rules(node: LabNode, also_from: Sequence[LabNode]) -> list[str]:
    # the control machine, as the node sees it: the lab network's gateway
    gateway = _run(node, "ip route | awk '/^default/ {print $3; exit}'").strip()
    if not gateway:
        raise LabError(
            f"{node.name}: no default route; cannot tell the control machine",
            "make the lab again (`provisioner lab down`, then `provisioner lab up`)",
        )
    sources = [gateway, *(other.address for other in also_from)]
    return [
        f"INPUT -p tcp --dport 22 -s {source} -m comment --comment {TAG} -j DROP"
        for source in sources
    ]


def isolate(lab: LabInfo, node: LabNode, also_from: Sequence[LabNode] = ()) -> None:
    """Drop SSH from the control machine (and from the nodes `also_from`) to the node; the
    other nodes still reach it (reach it through a jump host, or a chain of them). Only SSH
    is dropped: Ray's own traffic between the nodes goes on."""
    for rule in _isolate_rules(node, also_from):
        _run(node, f"iptables -C {rule} 2>/dev/null || iptables -I {rule}")
    _record(lab, Fault("isolate", node.name, ",".join(n.name for n in also_from)), True)


def unisolate(lab: LabInfo, node: LabNode, also_from: Sequence[LabNode] = ()) -> None:
    for rule in _isolate_rules(node, also_from):
        _run(node, f"while iptables -C {rule} 2>/dev/null; do iptables -D {rule}; done")
    _record(lab, Fault("isolate", node.name, ",".join(n.name for n in also_from)), False)


# --- clock / unclock: a node's clock off by some seconds ----------------------------------

# The node's kernel clock is the machine's (containers share it): the offset is libfaketime's
# (Debian's `faketime`), preloaded into every SSH session through /etc/environment (sshd's
# pam_env), so what runs over SSH, the doctor's facts script among it, sees the clock
# `seconds` off; processes already running, and the monotonic clock, are untouched.
_ENVIRONMENT = "/etc/environment"
_CLOCK_KEYS = ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")
CLOCK_MAX_S = 10**8


def clock_script(seconds: int) -> str:
    """Shell (as root on the node) that sets its SSH sessions' clock `seconds` off."""
    lines = ['"LD_PRELOAD=$lib"', f"FAKETIME={seconds:+d}", "FAKETIME_DONT_FAKE_MONOTONIC=1"]
    return (
        "lib=$(dpkg -L libfaketime 2>/dev/null | grep '/libfaketime.so.1$' | head -n 1); "
        '[ -n "$lib" ] || { echo "libfaketime is not installed (Debian: faketime)"; exit 1; }; '
        f"printf '%s\\n' {' '.join(lines)} >> {_ENVIRONMENT}"
    )


def unclock_script() -> str:
    keys = "|".join(_CLOCK_KEYS)
    return f"[ ! -e {_ENVIRONMENT} ] || sed -i -E '/^({keys})=/d' {_ENVIRONMENT}"


def check_clock_offset(seconds: int) -> int:
    """A clock fault's offset: seconds, not zero, at most CLOCK_MAX_S either way."""
    if seconds == 0 or abs(seconds) > CLOCK_MAX_S:
        raise InputError(
            f"clock offset must be a non-zero number of seconds up to {CLOCK_MAX_S}, got {seconds}",
            "e.g. 300 (ahead) or -- -300 (behind)",
        )
    return seconds


def clock(lab: LabInfo, node: LabNode, seconds: int) -> None:
    """Set a node's clock `seconds` ahead (negative: behind) for everything run over SSH.
    Undo: `unclock`."""
    check_clock_offset(seconds)
    unclock(lab, node)
    # recorded first: `clear` undoes a half-applied one
    _record(lab, Fault("clock", node.name, str(seconds)), True)
    _run(node, clock_script(seconds))


def unclock(lab: LabInfo, node: LabNode) -> None:
    _run(node, unclock_script())
    for f in active(lab):
        if f.kind == "clock" and f.node == node.name:
            _record(lab, f, False)


# --- break / mend: one doctor check's fault on a node -------------------------------------

_SAVED = f"/root/{TAG}-saved"
_FAKE_RAY = f"/opt/{TAG}-ray"
_DOCKERD_UP = (
    "for i in $(seq 150); do docker info >/dev/null 2>&1 && exit 0; sleep 0.2; done; "
    "echo dockerd did not come back; exit 1"
)


def _fake_ray(version: str, link: str) -> str:
    """A virtualenv whose metadata says Ray `version`, its `ray` at `link` (what facts.sh
    reads: the script's interpreter and that interpreter's ray package version)."""
    return (
        f"python3 -m venv --without-pip {_FAKE_RAY} && "
        f"d=$(echo {_FAKE_RAY}/lib/python3*/site-packages)/ray-{version}.dist-info && "
        f"mkdir -p $d && printf 'Metadata-Version: 2.1\\nName: ray\\nVersion: {version}\\n' "
        f"> $d/METADATA && printf '#!{_FAKE_RAY}/bin/python\\nprint(1)\\n' > {_FAKE_RAY}/bin/ray "
        f"&& chmod +x {_FAKE_RAY}/bin/ray && {link}"
    )


def _spare_address(lab: LabInfo, node: LabNode) -> str:
    """An unused address of the lab's subnet for `node` (its own + 100)."""
    return str(ipaddress.ip_address(node.address) + 100)


# name -> (what it does, apply script, undo script); each script runs as root on the node
# and is given the lab and the node (some need addresses).
Script = Callable[[LabInfo, LabNode], str]
BREAKAGES: dict[str, tuple[str, Script, Script]] = {
    "docker-stopped": (
        "the node's dockerd stopped (its containers with it)",
        lambda lab, n: (
            "kill $(cat /var/run/docker.pid); "
            "for i in $(seq 150); do [ -e /var/run/docker.pid ] || exit 0; sleep 0.2; done; exit 1"
        ),
        lambda lab, n: (
            "docker info >/dev/null 2>&1 || { rm -rf /var/run/docker.pid /var/run/docker "
            "/run/containerd; dockerd >>/var/log/dockerd.log 2>&1 & }; " + _DOCKERD_UP
        ),
    ),
    "docker-group": (
        "the login user out of the docker group (docker only with sudo)",
        lambda lab, n: f"gpasswd -d {n.user} docker >/dev/null",
        lambda lab, n: f"usermod -aG docker {n.user}",
    ),
    "sudo-password": (
        "sudo asks the login user for a password",
        lambda lab, n: f"mkdir -p {_SAVED} && mv /etc/sudoers.d/lab {_SAVED}/sudoers-lab",
        lambda lab, n: (
            f"[ ! -e {_SAVED}/sudoers-lab ] || mv {_SAVED}/sudoers-lab /etc/sudoers.d/lab"
        ),
    ),
    "ray-2.59": (
        "`ray` 2.59.0 on the PATH of every shell (a virtualenv with its metadata)",
        lambda lab, n: _fake_ray("2.59.0", f"ln -sf {_FAKE_RAY}/bin/ray /usr/local/bin/ray"),
        lambda lab, n: f"rm -rf {_FAKE_RAY} /usr/local/bin/ray",
    ),
    "ray-login-only": (
        "`ray` 2.60.0 on the PATH of login shells only (~/.profile)",
        lambda lab, n: _fake_ray(
            "2.60.0", f"echo 'export PATH={_FAKE_RAY}/bin:$PATH # {TAG}' >> /home/{n.user}/.profile"
        ),
        lambda lab, n: f"sed -i '/# {TAG}/d' /home/{n.user}/.profile; rm -rf {_FAKE_RAY}",
    ),
    "python-3.10": (
        "`python3` on every PATH reports 3.10.12 (a wrapper in /usr/local/bin)",
        lambda lab, n: (
            "printf '%s\\n' '#!/bin/sh' "
            '\'/usr/bin/python3 "$@" | sed "s/^3\\.11\\.[0-9]*$/3.10.12/"\' '
            "> /usr/local/bin/python3 && chmod +x /usr/local/bin/python3"
        ),
        lambda lab, n: "rm -f /usr/local/bin/python3",
    ),
    "stale-raylet": (
        "a process named raylet left running",
        lambda lab, n: (
            f"mkdir -p {_SAVED} && cp /bin/sleep {_SAVED}/raylet && "
            f"{{ {_SAVED}/raylet 100000 >/dev/null 2>&1 & echo $! > {_SAVED}/raylet.pid; }}"
        ),
        lambda lab, n: (
            f"[ -f {_SAVED}/raylet.pid ] && kill $(cat {_SAVED}/raylet.pid) 2>/dev/null; "
            f"rm -f {_SAVED}/raylet {_SAVED}/raylet.pid; true"
        ),
    ),
    "hostname-loopback": (
        "the hostname resolves to 127.0.1.1 (/etc/hosts, as Debian's installer writes it)",
        lambda lab, n: (
            f"mkdir -p {_SAVED} && cp /etc/hosts {_SAVED}/hosts && "
            f'{{ echo "127.0.1.1 $(hostname)"; cat {_SAVED}/hosts; }} > /etc/hosts'
        ),
        lambda lab, n: (
            f"[ ! -e {_SAVED}/hosts ] || "
            f"{{ cat {_SAVED}/hosts > /etc/hosts && rm {_SAVED}/hosts; }}"
        ),
    ),
    "low-memory": (
        "/proc/meminfo says 2 GiB (a bind mount over it)",
        lambda lab, n: (
            f"mkdir -p {_SAVED} && sed -e 's/^MemTotal:.*/MemTotal:        2097152 kB/' "
            f"-e 's/^MemAvailable:.*/MemAvailable:    1048576 kB/' /proc/meminfo > {_SAVED}/meminfo"
            f" && mount --bind {_SAVED}/meminfo /proc/meminfo"
        ),
        lambda lab, n: (
            "while grep -q ' /proc/meminfo ' /proc/mounts; do umount /proc/meminfo; done; "
            f"rm -f {_SAVED}/meminfo"
        ),
    ),
    "one-cpu": (
        "sshd and every session it starts pinned to one CPU (sched affinity, what nproc reads)",
        lambda lab, n: "taskset -a -p -c 0 $(cat /run/sshd.pid) >/dev/null",
        lambda lab, n: "taskset -a -p -c 0-$(($(nproc --all) - 1)) $(cat /run/sshd.pid) >/dev/null",
    ),
    "small-tmp": (
        "/tmp a 64 MiB filesystem",
        lambda lab, n: f"mount -t tmpfs -o size=64m {TAG}-tmp /tmp",
        lambda lab, n: f"while grep -q '^{TAG}-tmp ' /proc/mounts; do umount -l /tmp; done",
    ),
    "no-rsync": (
        "rsync removed from the PATH",
        lambda lab, n: "mv /usr/bin/rsync /usr/bin/rsync.fault",
        lambda lab, n: "[ ! -e /usr/bin/rsync.fault ] || mv /usr/bin/rsync.fault /usr/bin/rsync",
    ),
    "other-source": (
        "traffic to the head sent from a second address (what Ray would advertise)",
        lambda lab, n: (
            f"ip addr add {_spare_address(lab, n)}/32 dev eth0 && "
            f"ip route add {lab.nodes[0].address}/32 dev eth0 src {_spare_address(lab, n)}"
        ),
        lambda lab, n: (
            f"ip route del {lab.nodes[0].address}/32 2>/dev/null; "
            f"ip addr del {_spare_address(lab, n)}/32 dev eth0 2>/dev/null; true"
        ),
    ),
}


# A SIMULATED GPU node (provisioner/lab/gpusim.py: stand-ins only, no GPU): one variant per
# GPU fault class the doctor names.
_GPU_VARIANTS = {
    "gpu": ("2 Tesla T4, driver 550, a Docker runtime `nvidia` (runc)", gpusim.SimulatedGpus()),
    "gpu-a100": (
        "1 A100 40GB, driver 550, the `nvidia` runtime",
        gpusim.SimulatedGpus(model="NVIDIA A100-SXM4-40GB", count=1, memory_mib=40960),
    ),
    "gpu-no-toolkit": (
        "2 Tesla T4 and their driver, no container toolkit",
        gpusim.SimulatedGpus(toolkit=False),
    ),
    "gpu-cdi": (
        "2 Tesla T4 through CDI: a spec of stand-in device nodes, Docker's cdi feature on "
        "(Docker >= 25), no nvidia runtime",
        gpusim.SimulatedGpus(toolkit=False, cdi=True),
    ),
    "gpu-no-driver": (
        "the container toolkit and device files, nvidia-smi failing (no driver loaded)",
        gpusim.SimulatedGpus(driver_ok=False),
    ),
    "gpu-old-driver": (
        "2 Tesla T4 with driver 470 (too old for CUDA 12)",
        gpusim.SimulatedGpus(driver="470.256.02"),
    ),
}


def _simulate(sim: gpusim.SimulatedGpus) -> Script:
    return lambda lab, n: gpusim.apply_script(n.name, sim)


for _name, (_what, _sim) in _GPU_VARIANTS.items():
    BREAKAGES[_name] = (
        f"SIMULATED GPU node: {_what}",
        _simulate(_sim),
        lambda lab, n: gpusim.undo_script(),
    )


def _breakage(name: str) -> tuple[str, Script, Script]:
    if name not in BREAKAGES:
        raise InputError(f"no lab breakage {name!r}", f"use one of: {', '.join(BREAKAGES)}")
    return BREAKAGES[name]


def break_node(lab: LabInfo, node: LabNode, name: str) -> None:
    """Inject one of BREAKAGES on `node` (recorded: `clear` mends it)."""
    _, apply, _ = _breakage(name)
    _record(lab, Fault("break", node.name, name), True)  # first: a half-applied one is mended
    _run(node, apply(lab, node))


def mend(lab: LabInfo, node: LabNode, name: str) -> None:
    _, _, undo = _breakage(name)
    _run(node, undo(lab, node))
    _record(lab, Fault("break", node.name, name), False)


def clear(lab: LabInfo) -> list[Fault]:
    """Undo every recorded fault; return what was undone."""
    undone = []
    for f in active(lab):
        node = lab.node(f.node)
        if f.kind == "stop":
            start(lab, node)
        elif f.kind == "cut":
            uncut(lab, node, lab.node(f.arg))
        elif f.kind == "occupy":
            release(lab, node, int(f.arg))
        elif f.kind == "delay":
            undelay(lab, node)
        elif f.kind == "hang":
            unhang(lab, node)
        elif f.kind == "isolate":
            unisolate(lab, node, [lab.node(n) for n in f.arg.split(",") if n])
        elif f.kind == "break":
            mend(lab, node, f.arg)
        elif f.kind == "clock":
            unclock(lab, node)
        undone.append(f)
    return undone
