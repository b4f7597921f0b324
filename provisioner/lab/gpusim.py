"""A SIMULATED NVIDIA GPU node for the lab: no GPU, no driver, no CUDA, only what the
doctor and `up` read, so that GPU detection and command building run end to end.

What it puts on a lab node (root, `docker exec`), every file marked as a simulation:
- `/usr/local/bin/nvidia-smi`: a stand-in that answers `--query-gpu=...
  --format=csv,noheader,nounits` and `-L` in the format of NVIDIA's nvidia-smi (its man
  page), from a table of made-up GPUs; or, as a node without a working driver does, fails
  with nvidia-smi's own message and exit code 9;
- `/dev/nvidia0...`, `/dev/nvidiactl`: empty stand-ins of the driver's device files;
- a Docker runtime named `nvidia` (`/etc/docker/daemon.json`, dockerd reloaded with
  SIGHUP) whose program, `/usr/local/bin/nvidia-container-runtime`, runs runc: a
  container started with it gets no GPU; and `/usr/local/bin/nvidia-ctk` printing a
  toolkit version, as NVIDIA's does;
- or, with `cdi` (Docker >= 25), a CDI spec (`/etc/cdi/`, kind nvidia.com/gpu, each GPU
  by index and by UUID, as `nvidia-ctk cdi generate` names them) whose device nodes
  `/dev/nvidiaN` are stand-ins with /dev/null's numbers (char 1:3: nothing to read, writes
  go nowhere), and Docker's `cdi` feature on in daemon.json (merged into the node's own),
  dockerd restarted: features are read at start only.
Everything is removed again by the undo (daemon.json as it was, dockerd reloaded or
restarted).
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass

MARK = "SIMULATION by provisioner's lab (provisioner/lab/gpusim.py): not NVIDIA's program"
STATE = "/etc/provisioner-gpu-simulation"
DAEMON_JSON = "/etc/docker/daemon.json"
_FILES = (
    "/usr/local/bin/nvidia-smi",
    "/usr/local/bin/nvidia-container-runtime",
    "/usr/local/bin/nvidia-ctk",
)
# nvidia-smi's words on a node whose driver does not answer (exit code 9)
NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


@dataclass(frozen=True)
class SimulatedGpus:
    """What the simulated node shows."""

    model: str = "Tesla T4"
    count: int = 2
    memory_mib: int = 15360
    driver: str = "550.54.15"
    toolkit: bool = True  # the `nvidia` runtime and nvidia-ctk
    driver_ok: bool = True  # False: nvidia-smi fails as without a loaded driver
    cdi: bool = False  # a CDI spec of the GPUs, and Docker's `cdi` feature on


def uuid_for(node: str, index: int) -> str:
    """A made-up GPU UUID, stable per node and index, in nvidia-smi's form."""
    h = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def smi_rows(node: str, sim: SimulatedGpus) -> list[str]:
    """The CSV lines of `--query-gpu=index,uuid,name,memory.total,driver_version
    --format=csv,noheader,nounits`."""
    return [
        f"{i}, {uuid_for(node, i)}, {sim.model}, {sim.memory_mib}, {sim.driver}"
        for i in range(sim.count)
    ]


def _write(path: str, text: str, mode: str = "755") -> str:
    return f"printf '%s\\n' {shlex.quote(text)} > {path} && chmod {mode} {path}"


def _smi_script(node: str, sim: SimulatedGpus) -> str:
    if not sim.driver_ok:
        return f"#!/bin/sh\n# {MARK}\necho {shlex.quote(NO_DRIVER)}\nexit 9"
    rows = "\n".join(smi_rows(node, sim))
    listing = "\n".join(
        f"GPU {i}: {sim.model} (UUID: {uuid_for(node, i)})" for i in range(sim.count)
    )
    return (
        f"#!/bin/sh\n# {MARK}\n"
        'case "$*" in\n'
        f"  *--query-gpu=*) cat <<'EOF'\n{rows}\nEOF\n;;\n"
        f"  *-L*) cat <<'EOF'\n{listing}\nEOF\n;;\n"
        f'  *) echo "simulated nvidia-smi (provisioner lab): driver {sim.driver}";;\n'
        "esac"
    )


CDI_DIR = "/etc/cdi"
CDI_SPEC = f"{CDI_DIR}/provisioner-simulation.yaml"


def cdi_spec(node: str, sim: SimulatedGpus) -> str:
    """The CDI spec (YAML, CDI 0.5.0) of the simulated GPUs: each by index and by UUID,
    its device node `/dev/nvidiaN`."""
    devices = []
    for i in range(sim.count):
        for name in (str(i), uuid_for(node, i)):
            devices.append(
                f'- name: "{name}"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia{i}'
            )
    return f'# {MARK}\ncdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n' + "\n".join(devices)


# daemon.json with Docker's `cdi` feature on, the node's own settings kept (python3: every
# lab node has it)
_CDI_ON = (
    "python3 -c 'import json, os, sys; p = sys.argv[1]; "
    "d = json.load(open(p)) if os.path.exists(p) else {}; "
    'd.setdefault("features", {})["cdi"] = True; '
    'json.dump(d, open(p, "w"))\' ' + DAEMON_JSON
)


def _restart_dockerd(cdi: bool) -> str:
    """Stop dockerd, start it again as the lab node does, and wait until it answers and
    its CDI spec dirs are listed (or not): `features` are read at start only."""
    listed = "docker info --format '{{json .CDISpecDirs}}' 2>/dev/null | grep -q /etc/cdi"
    test = listed if cdi else f"! {listed}"
    return (
        "kill $(cat /var/run/docker.pid) && "
        "{ for i in $(seq 150); do [ -e /var/run/docker.pid ] || break; sleep 0.2; done; } && "
        "{ dockerd >>/var/log/dockerd.log 2>&1 & } && "
        f"{{ for i in $(seq 150); do {test} && break; sleep 0.2; done; {test}; }}"
    )


def _cdi_steps(node: str, sim: SimulatedGpus) -> list[str]:
    return [
        *(f"rm -f /dev/nvidia{i} && mknod -m 666 /dev/nvidia{i} c 1 3" for i in range(sim.count)),
        f"{{ [ -d {CDI_DIR} ] || touch {STATE}/cdi-dir; }}",
        f"mkdir -p {CDI_DIR}",
        _write(CDI_SPEC, cdi_spec(node, sim), "644"),
        f"touch {STATE}/cdi",
        _CDI_ON,
        _restart_dockerd(True),
    ]


def apply_script(node: str, sim: SimulatedGpus) -> str:
    """Root shell script that makes the lab node look like an NVIDIA GPU node."""
    steps = [
        f"mkdir -p {STATE} /etc/docker",
        # keep the node's own daemon.json (if any) to put back
        f"if [ -e {DAEMON_JSON} ] && [ ! -e {STATE}/daemon.json ] && [ ! -e {STATE}/ours ]; "
        f"then cp {DAEMON_JSON} {STATE}/daemon.json; fi",
        _write("/usr/local/bin/nvidia-smi", _smi_script(node, sim)),
        *(f"touch /dev/nvidia{i}" for i in range(sim.count)),
        "touch /dev/nvidiactl /dev/nvidia-uvm",
        f"echo {' '.join(f'/dev/nvidia{i}' for i in range(sim.count))} "
        f"/dev/nvidiactl /dev/nvidia-uvm > {STATE}/devices",
    ]
    if sim.cdi:
        steps += _cdi_steps(node, sim)
    if sim.toolkit:
        steps += [
            _write(
                "/usr/local/bin/nvidia-container-runtime",
                f'#!/bin/sh\n# {MARK}\n# the "nvidia" runtime: plain runc, no GPU\nexec runc "$@"',
            ),
            _write(
                "/usr/local/bin/nvidia-ctk",
                f"#!/bin/sh\n# {MARK}\necho 'NVIDIA Container Toolkit CLI version 1.17.0'\n"
                "echo 'commit: simulation'",
            ),
            _write(
                DAEMON_JSON,
                '{"runtimes": {"nvidia": {"path": "/usr/local/bin/nvidia-container-runtime", '
                '"runtimeArgs": []}}}',
                "644",
            ),
            f"touch {STATE}/ours",
            _reload_dockerd(True),
        ]
    return " && ".join(steps)


def _reload_dockerd(nvidia: bool) -> str:
    """SIGHUP dockerd (it re-reads daemon.json's runtimes), then wait until its runtime
    list has (or lacks) `nvidia`."""
    listed = "docker info --format '{{json .Runtimes}}' | grep -q '\"nvidia\"'"
    test = listed if nvidia else f"! {listed}"
    return (
        "kill -HUP $(cat /var/run/docker.pid) && "
        f"{{ for i in $(seq 100); do {test} && break; sleep 0.1; done; {test}; }}"
    )


def undo_script() -> str:
    """Remove every part of the simulation; put the node's daemon.json back."""
    return (
        f"rm -f {' '.join(_FILES)}; "
        f"[ -e {STATE}/devices ] && rm -f $(cat {STATE}/devices); "
        f"if [ -e {STATE}/cdi ]; then rm -f {CDI_SPEC}; "
        f"[ -e {STATE}/cdi-dir ] && rmdir {CDI_DIR}; "
        f"if [ -e {STATE}/daemon.json ]; then cp {STATE}/daemon.json {DAEMON_JSON}; "
        f"else rm -f {DAEMON_JSON}; fi; {_restart_dockerd(False)}; rm -rf {STATE}; "
        f"elif [ -e {STATE}/ours ]; then "
        # dockerd keeps runtimes that a reload does not name: an empty list drops ours
        f"if [ -e {STATE}/daemon.json ]; then cp {STATE}/daemon.json {DAEMON_JSON}; "
        f"else echo '{{\"runtimes\": {{}}}}' > {DAEMON_JSON}; fi; "
        f"{_reload_dockerd(False)}; "
        f"[ -e {STATE}/daemon.json ] || rm -f {DAEMON_JSON}; rm -rf {STATE}; "
        f"else rm -rf {STATE}; fi"
    )
