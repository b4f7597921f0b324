"""Shared steps of the fault and security suites: the CLI as a subprocess, Ctrl-C at a
chosen moment, lab nodes reached through the lab's own control path (docker exec)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container

PROVISIONER = str(Path(sys.executable).parent / "provisioner")


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float
    after_signal: float | None = None  # seconds from SIGINT to exit

    def json(self) -> Any:
        return json.loads(self.stdout)

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def cli(*args: str, timeout: float = 300) -> Run:
    """`provisioner ARGS` as a separate process, the way a user runs it."""
    t0 = time.monotonic()
    proc = subprocess.run(
        [PROVISIONER, *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def sigint_as_at_a_terminal() -> None:
    """In the child before exec: SIGINT back to its default. A suite started as a background
    job of a non-interactive shell (`nohup bash .ci/run &`) has SIGINT ignored, and an
    ignored signal stays ignored across exec; a user's Ctrl-C meets no such thing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def during(
    *args: str,
    when: str,
    action: Callable[[subprocess.Popen[str]], None],
    delay: float = 0.0,
    timeout: float = 300,
    watch: str = "stderr",
) -> Run:
    """Run the CLI; call `action(process)` `delay` seconds after a line of its `watch`
    stream ("stderr" or "stdout") contains `when`. Fails when the line never comes (the
    command ended first). `after_signal`: seconds from the action to the exit."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [PROVISIONER, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=sigint_as_at_a_terminal,
    )
    got: dict[str, list[str]] = {"stdout": [], "stderr": []}
    seen = threading.Event()

    def read(name: str) -> None:
        stream = getattr(proc, name)
        assert stream is not None
        for line in stream:
            got[name].append(line)
            if name == watch and when in line:
                seen.set()

    readers = [threading.Thread(target=read, args=(n,), daemon=True) for n in got]
    for reader in readers:
        reader.start()
    acted: float | None = None
    try:
        while proc.poll() is None and time.monotonic() - t0 < timeout:
            if seen.wait(0.1):
                time.sleep(delay)
                action(proc)
                acted = time.monotonic()
                break
        try:
            proc.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`provisioner {' '.join(args[:2])}` neither finished nor failed within "
                f"{timeout:.0f}s; last output: {''.join(got[watch])[-300:]}"
            ) from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for reader in readers:
        reader.join(5)
    out, err = "".join(got["stdout"]), "".join(got["stderr"])
    end = time.monotonic()
    said = "".join(got[watch])
    assert acted is not None, f"never saw {when!r}; the command ended first:\n{said[-2000:]}"
    return Run(proc.returncode, out, err, end - t0, end - acted)


def interrupt(
    *args: str, when: str, delay: float = 0.0, timeout: float = 300, watch: str = "stderr"
) -> Run:
    """Ctrl-C: SIGINT to the CLI `delay` seconds after a line of its `watch` stream
    contains `when`."""
    return during(
        *args,
        when=when,
        action=lambda p: p.send_signal(signal.SIGINT),
        delay=delay,
        timeout=timeout,
        watch=watch,
    )


def on_node(node: LabNode, script: str, timeout: float = 120) -> str:
    """Run a script as root on a lab node (the lab's control path, not the tool's SSH)."""
    rc, out = exec_rc(node.container, script, timeout=timeout)
    assert rc == 0, f"{node.name}: {script[:80]}: exit {rc}: {out[-500:]}"
    return out


def probe(node: LabNode, script: str) -> tuple[int, str]:
    return exec_rc(node.container, script, timeout=60)


def image_store(container: str) -> str:
    """A lab node's Docker image store: "containerd" (Docker's containerd image store) or
    "classic" (a graph driver's)."""
    rc, out = exec_rc(
        container, "docker info --format '{{range .DriverStatus}}{{index . 1}} {{end}}'", timeout=60
    )
    assert rc == 0, out
    return "containerd" if "io.containerd.snapshotter" in out else "classic"


# After SIGHUP sshd re-executes itself: wait until it answers with a banner again.
_SSHD_BACK = (
    "for i in $(seq 100); do sleep 0.1; "
    "(exec 3<>/dev/tcp/127.0.0.1/22 && head -c 4 <&3) 2>/dev/null | grep -q SSH && break; done"
)


@contextmanager
def new_host_keys(node: LabNode) -> Iterator[None]:
    """The node's host keys regenerated (as after a reinstall); the old ones restored after."""
    on_node(
        node,
        "mkdir -p /root/hostkeys.faults && cp -p /etc/ssh/ssh_host_* /root/hostkeys.faults/ && "
        "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && "
        "kill -HUP $(cat /run/sshd.pid) && " + _SSHD_BACK,
    )
    try:
        yield
    finally:
        on_node(
            node,
            "cp -p /root/hostkeys.faults/* /etc/ssh/ && rm -rf /root/hostkeys.faults && "
            "kill -HUP $(cat /run/sshd.pid) && " + _SSHD_BACK,
        )


def edited_inventory(inventory: Path, target: Path, **changes: Any) -> Path:
    """A copy of an inventory (paths made absolute) with top-level or ssh settings changed:
    `ssh={...}` merges into ssh, any other key replaces the top-level value."""
    document = yaml.safe_load(inventory.read_text())
    base = inventory.parent
    for key in ("key", "known_hosts"):
        if key in document["ssh"]:
            document["ssh"][key] = str((base / document["ssh"][key]).resolve())
    if document.get("image", {}).get("lock"):
        document["image"]["lock"] = str((base / document["image"]["lock"]).resolve())
    document["ssh"].update(changes.pop("ssh", {}))
    document.update(changes)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(document))
    return target


def lab_container(lab: LabInfo) -> str:
    """The name of the lab cluster's Ray container (`node.token.ray_container`: it carries
    the id of the cluster's state folder on this machine)."""
    from provisioner.inventory import load_inventory

    return ray_container(load_inventory(lab.inventory))


def container_state(lab: LabInfo, node: LabNode) -> str:
    """The cluster's Ray container on a node: its status, or `absent`."""
    name = lab_container(lab)
    rc, out = probe(node, f"docker inspect -f '{{{{.State.Status}}}}' {name}")
    return out.strip() if rc == 0 else "absent"
