"""Benchmark the doctor: the 3-node lab, then N SSH endpoints against OpenSSH and Ansible.

    .venv/bin/python scripts/bench_doctor.py [--lab NAME] [--endpoints 100] [--parallel 100]
        [--no-ansible]

N endpoints are extra sshd processes inside the lab's head node listening on N ports
(each port is one "node" to the doctor). The baselines, at the same parallelism: `ssh HOST
true` to every endpoint through OpenSSH, and Ansible's ad-hoc command running the doctor's
own facts script on every endpoint (`ansible all -f N -m script -a facts.sh ...`), so both
gather the same facts. Prints one JSON document; scripts/bench.py repeats it side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from bench_ssh_latency import connect_and_run_true

from provisioner.doctor import run_doctor
from provisioner.doctor.gather import facts_script
from provisioner.inventory import load_inventory
from provisioner.lab.engine import docker_cli, exec_in, exec_rc
from provisioner.lab.nodes import LabInfo, load_lab
from provisioner.runtime import judges
from provisioner.runtime.context import cluster_context

T = TypeVar("T")
BASE_PORT = 2201
PORTS_PER_SSHD = 16  # one sshd listens on at most 16 sockets
ANSIBLE = Path(sys.executable).parent / "ansible"


@dataclass(frozen=True)
class Endpoints:
    """N sshd endpoints on one lab node, and the files that reach them."""

    lab: LabInfo
    address: str
    user: str
    count: int
    known_hosts: Path
    inventory: Path  # native inventory for the doctor
    ansible_inventory: Path

    @property
    def ports(self) -> range:
        return range(BASE_PORT, BASE_PORT + self.count)


def start_sshd(container: str, count: int) -> None:
    for first in range(0, count, PORTS_PER_SSHD):
        last = min(first + PORTS_PER_SSHD, count)
        ports = " ".join(f"-p {BASE_PORT + i}" for i in range(first, last))
        pidfile = f"/run/bench-sshd-{first}.pid"
        rc, out = exec_rc(
            container,
            f"/usr/sbin/sshd -o AddressFamily=inet -o PidFile={pidfile} "
            f"-o MaxStartups=1000 -o MaxSessions=100 {ports}",
        )
        if rc != 0:
            raise SystemExit(f"cannot start the bench sshd: {out}")


def stop_sshd(container: str) -> None:
    exec_rc(container, "for f in /run/bench-sshd-*.pid; do kill $(cat $f); rm -f $f; done")


def bench_inventory(
    lab_inventory: Path, known_hosts: Path, address: str, count: int, out: Path
) -> Path:
    document = yaml.safe_load(lab_inventory.read_text())
    document["ssh"]["key"] = str(lab_inventory.parent / document["ssh"]["key"])
    document["ssh"]["known_hosts"] = str(known_hosts)
    document["ssh"]["host_key_policy"] = "accept-new"
    document["cluster"] = "bench"
    document.pop("image", None)  # the endpoints are one node: no image to look for
    document["head"] = {"name": f"ep-{BASE_PORT}", "address": address, "port": BASE_PORT}
    document["workers"] = [
        {"name": f"ep-{BASE_PORT + i}", "address": address, "port": BASE_PORT + i}
        for i in range(1, count)
    ]
    out.write_text(yaml.safe_dump(document))
    return out


def ansible_inventory(
    lab: LabInfo, known_hosts: Path, address: str, user: str, count: int, out: Path
) -> Path:
    ssh_args = (
        f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=accept-new "
        "-o GlobalKnownHostsFile=/dev/null"
    )
    lines = ["[endpoints]"]
    lines += [
        f"ep-{port} ansible_host={address} ansible_port={port}"
        for port in range(BASE_PORT, BASE_PORT + count)
    ]
    lines += [
        "",
        "[endpoints:vars]",
        f"ansible_user={user}",
        f"ansible_ssh_private_key_file={lab.key}",
        f"ansible_ssh_common_args='{ssh_args}'",
    ]
    out.write_text("\n".join(lines) + "\n")
    return out


@contextmanager
def endpoints(lab: LabInfo, count: int, workdir: Path) -> Iterator[Endpoints]:
    """`count` sshd endpoints on the lab's head, their host keys recorded; removed after."""
    head = lab.nodes[0]
    workdir.mkdir(parents=True, exist_ok=True)
    known = workdir / "known_hosts"
    known.unlink(missing_ok=True)
    stop_sshd(head.container)
    start_sshd(head.container, count)
    try:
        time.sleep(0.5)
        eps = Endpoints(
            lab=lab,
            address=head.address,
            user=head.user,
            count=count,
            known_hosts=known,
            inventory=bench_inventory(
                lab.inventory, known, head.address, count, workdir / "inventory.yaml"
            ),
            ansible_inventory=ansible_inventory(
                lab, known, head.address, head.user, count, workdir / "ansible.ini"
            ),
        )
        openssh_fan_out(eps, min(count, 32))  # records the host keys
        yield eps
    finally:
        stop_sshd(head.container)


def openssh_facts_fan_out(eps: Endpoints, parallel: int) -> float:
    """Seconds for OpenSSH running the doctor's facts script on every endpoint, `parallel`
    at a time: `ssh HOST bash -s -- ARGS < facts.sh` (the doctor's own command line and
    arguments without the reachability listener, as the Ansible run has them)."""
    facts = facts_script(judges("docker"))
    args = shlex.join([eps.address, eps.address, "none", "", "0"])
    return openssh_fan_out(eps, parallel, f"bash -s -- {args}", facts)


def openssh_fan_out(
    eps: Endpoints, parallel: int, command: str = "true", stdin: bytes = b""
) -> float:
    """Seconds for `ssh HOST COMMAND` to every endpoint, `parallel` at a time."""

    def one(port: int) -> tuple[int, str]:
        proc = subprocess.run(
            [
                "ssh",
                "-i",
                str(eps.lab.key),
                "-p",
                str(port),
                "-o",
                f"UserKnownHostsFile={eps.known_hosts}",
                "-o",
                "StrictHostKeyChecking=accept-new",
                "-o",
                "GlobalKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                f"{eps.user}@{eps.address}",
                command,
            ],
            input=stdin,
            capture_output=True,
            check=False,
        )
        return proc.returncode, proc.stderr.decode(errors="replace")

    t0 = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        codes = list(pool.map(one, eps.ports))
    elapsed = time.monotonic() - t0
    failed = [err for c, err in codes if c != 0]
    if failed:
        raise SystemExit(f"OpenSSH fan-out failed on {len(failed)} endpoint(s): {failed[0]}")
    return elapsed


def doctor_fan_out(eps: Endpoints, parallel: int, *, reachability: bool) -> float:
    """Seconds for the doctor on every endpoint (its own elapsed time, inventory load included)."""
    t0 = time.monotonic()
    report = run_doctor(
        cluster_context(load_inventory(eps.inventory), lenient_pin=True),
        parallelism=parallel,
        reachability=reachability,
    )
    elapsed = time.monotonic() - t0
    unreachable = [f for f in report.errors if f.check.startswith("ssh")]
    if unreachable:
        raise SystemExit(
            f"doctor could not reach {len(unreachable)} endpoint(s): {unreachable[0].message}"
        )
    return elapsed


def ansible_fan_out(eps: Endpoints, parallel: int) -> float:
    """Seconds for `ansible all -f N -m script` running the doctor's facts script everywhere."""
    facts = facts_script(judges("docker"))  # the docker lab's round: with Docker's section
    with tempfile.TemporaryDirectory(prefix="bench-ansible-") as home:
        script = Path(home) / "facts.sh"
        script.write_bytes(facts)
        # same arguments as the doctor's facts round without the reachability listener
        args = f"{script} {eps.address} {{{{ ansible_host }}}} none '' 0"
        env = {
            **os.environ,
            "ANSIBLE_HOME": home,  # fresh: no ControlPersist master left from a previous run
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
            "ANSIBLE_LOCALHOST_WARNING": "False",
            "ANSIBLE_DEPRECATION_WARNINGS": "False",
            "ANSIBLE_SSH_USETTY": "False",
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=10s",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(Path(home) / "cp"),
        }
        cmd = [
            str(ANSIBLE),
            "all",
            "-i",
            str(eps.ansible_inventory),
            "-f",
            str(parallel),
            "-m",
            "script",
            "-a",
            args,
            "-o",
        ]
        t0 = time.monotonic()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        elapsed = time.monotonic() - t0
        # its ControlPersist masters linger 10 s, then close their 100 sessions on the node
        # inside whatever runs next: 201 sshd processes were left, and the floor run just
        # after read 8.0-8.4 s against 6.0-7.3 s twelve seconds later
        for control in (Path(home) / "cp").glob("*"):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={control}", "-O", "exit", "localhost"],
                capture_output=True,
                check=False,
            )
    ok = proc.stdout.count("| CHANGED") + proc.stdout.count("| SUCCESS")
    if proc.returncode != 0 or ok < eps.count:
        # the hosts that failed, with Ansible's reason (its one-line output per host)
        bad = [
            line
            for line in proc.stdout.splitlines()
            if "| UNREACHABLE" in line or "| FAILED" in line
        ]
        tail = " / ".join(bad)[:1500] or (proc.stdout + proc.stderr).strip()[-600:]
        raise SystemExit(
            f"ansible fan-out failed (rc {proc.returncode}, {ok}/{eps.count} ok): {tail}"
        )
    return elapsed


def install_facts(eps: Endpoints) -> str:
    """The doctor's facts.sh (with the docker runtime's section) written on the endpoints'
    node, for the runs without SSH; its path there."""
    path = "/tmp/bench-facts.sh"
    facts = facts_script(judges("docker"))
    container = eps.lab.nodes[0].container
    docker_cli(["exec", "-i", container, "sh", "-c", f"cat > {path}"], input_=facts)
    return path


def facts_floor(eps: Endpoints, parallel: int) -> float:
    """Seconds for the facts script alone, run `count` times on the endpoints' node at the
    same parallelism, without SSH: the work every tool gathering these facts waits for."""
    node = eps.lab.nodes[0]
    path = install_facts(eps)
    run = (
        f"cd ~ && s=$EPOCHREALTIME && seq {eps.count} | xargs -P {parallel} -I@ "
        f"bash {path} {eps.address} {eps.address} none '' 0 >/dev/null && "
        'echo "$s $EPOCHREALTIME"'
    )
    start, end = exec_in(node.container, run, user=eps.user, timeout=300).split()
    return float(end) - float(start)


def node_cpu_s(eps: Endpoints) -> float:
    """CPU seconds the endpoints' lab node (its container's cgroup) has used so far: its
    sshd, the shells and facts.sh, whoever started them (cgroup v1 or v2)."""
    cid = docker_cli(["inspect", "-f", "{{.Id}}", eps.lab.nodes[0].container]).strip()
    v1 = Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage")
    if v1.exists():
        return int(v1.read_text()) / 1e9
    for v2 in (
        Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat"),
        Path(f"/sys/fs/cgroup/docker/{cid}/cpu.stat"),
    ):
        if v2.exists():
            usage = dict(line.split() for line in v2.read_text().splitlines())
            return int(usage["usage_usec"]) / 1e6
    raise SystemExit(f"no cgroup CPU account found for the lab node's container {cid[:12]}")


def on_node(eps: Endpoints, fn: Callable[[], T]) -> tuple[T, float]:
    """fn's result and the node CPU seconds spent meanwhile."""
    start = node_cpu_s(eps)
    value = fn()
    return value, node_cpu_s(eps) - start


def node_cost_serial(eps: Endpoints, count: int = 30) -> dict[str, float]:
    """Node CPU milliseconds, one at a time (no contention): an SSH connection and one
    command (`true`) as the doctor makes them, and one facts.sh run without SSH."""
    inventory = load_inventory(eps.inventory)
    node = inventory.head

    def connections() -> None:
        for _ in range(count):
            connect_and_run_true(node)

    path = install_facts(eps)
    container = eps.lab.nodes[0].container
    args = f"{eps.address} {eps.address} none '' 0"
    loop = f"cd ~ && for i in $(seq {count}); do bash {path} {args} >/dev/null; done"
    _, ssh_cpu = on_node(eps, connections)
    _, facts_cpu = on_node(eps, lambda: exec_in(container, loop, user=eps.user))
    return {"ssh_ms": ssh_cpu / count * 1000, "facts_ms": facts_cpu / count * 1000}


def ansible_available() -> bool:
    return ANSIBLE.exists() or shutil.which("ansible") is not None


def lab_doctor(lab: LabInfo, parallel: int) -> dict[str, object]:
    report = run_doctor(
        cluster_context(load_inventory(lab.inventory), lenient_pin=True), parallelism=parallel
    )
    return {
        "elapsed_s": round(report.elapsed_s, 2),
        "errors": len(report.errors),
        "round_trips_per_node": report.round_trips,
        "checks_per_node": len(report.findings) // max(1, len(report.nodes)),
        "timings_s": {k: round(v, 2) for k, v in report.timings.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lab", default=None)
    parser.add_argument("--endpoints", type=int, default=100)
    parser.add_argument("--parallel", type=int, default=100)
    parser.add_argument("--no-ansible", action="store_true")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/provisioner-bench-doctor"))
    args = parser.parse_args()
    lab = load_lab(args.lab)
    result: dict[str, object] = {"lab_3_nodes": lab_doctor(lab, args.parallel)}
    with endpoints(lab, args.endpoints, args.workdir) as eps:
        baseline = openssh_fan_out(eps, args.parallel)
        full = doctor_fan_out(eps, args.parallel, reachability=True)
        facts_only = doctor_fan_out(eps, args.parallel, reachability=False)
        ansible = None if args.no_ansible else ansible_fan_out(eps, args.parallel)
    result["endpoints"] = {
        "count": args.endpoints,
        "parallel": args.parallel,
        "openssh_true_s": round(baseline, 2),
        "doctor_s": round(full, 2),
        "doctor_no_reachability_s": round(facts_only, 2),
        "ansible_script_facts_s": None if ansible is None else round(ansible, 2),
        "ratio": round(full / baseline, 2),
        "ansible_vs_doctor_no_reachability": None
        if ansible is None
        else round(ansible / facts_only, 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
