"""A node's NVIDIA GPU stack, parsed from facts.sh's GPU sections (no judging here).

Sections (raw output, read in the doctor's one round trip):
- `gpus`: `nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version
  --format=csv,noheader,nounits` and `rc=N` (absent: no nvidia-smi on the PATH);
- `gpu_driver`: the first line of /proc/driver/nvidia/version (the loaded kernel module);
- `gpu_devices`: the /dev/nvidia* files;
- `gpu_toolkit`: `%%TOOL=PATH` of the container toolkit's programs, then the first line of
  `nvidia-ctk --version` (or `nvidia-container-cli --version`);
- `docker_runtimes`: Docker's `{"DefaultRuntime", "Runtimes", "CDISpecDirs"}` (JSON);
- `cdi`: `%%file=PATH` then the text of each CDI spec in /etc/cdi and /var/run/cdi.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from provisioner.inventory import Node

GPU_KIND = "nvidia.com/gpu"  # the CDI kind of NVIDIA's GPUs (nvidia-ctk cdi generate)
HOOK = "nvidia-container-runtime-hook"  # what Docker's --gpus runs (its "nvidia" driver)
TOOLS = ("nvidia-ctk", "nvidia-container-runtime", HOOK, "nvidia-container-cli")
_GPU_FILE = re.compile(r"^/dev/nvidia\d+$")
_VERSION = re.compile(r"(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class Gpu:
    """One GPU as nvidia-smi lists it."""

    index: int
    uuid: str
    name: str
    memory_mib: int
    driver: str


@dataclass(frozen=True)
class CdiSpec:
    """One CDI spec file: its kind and device names (or why it could not be read)."""

    path: str
    kind: str = ""
    devices: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class GpuFacts:
    """What a node says about its NVIDIA GPUs, driver and container toolkit."""

    smi: bool = False  # nvidia-smi is on the PATH
    smi_rc: int | None = None
    smi_said: str = ""  # nvidia-smi's own words when it did not list GPUs
    gpus: tuple[Gpu, ...] = ()
    module: str = ""  # /proc/driver/nvidia/version's first line: the loaded kernel module
    devices: tuple[str, ...] = ()
    tools: dict[str, str] = field(default_factory=dict)  # toolkit program -> path
    toolkit_version: str = ""
    runtimes: dict[str, str] = field(default_factory=dict)  # Docker runtime -> its path
    default_runtime: str = ""
    cdi_dirs: tuple[str, ...] = ()  # where Docker reads CDI specs (empty: CDI off or unknown)
    cdi: tuple[CdiSpec, ...] = ()

    @property
    def driver_ok(self) -> bool:
        """nvidia-smi answered with at least one GPU."""
        return self.smi_rc == 0 and bool(self.gpus)

    @property
    def gpu_files(self) -> tuple[str, ...]:
        """/dev/nvidiaN: one per GPU the driver created."""
        return tuple(d for d in self.devices if _GPU_FILE.fullmatch(d))

    @property
    def present(self) -> bool:
        """Some sign of an NVIDIA GPU or its stack on the node."""
        return bool(
            self.gpus or self.gpu_files or self.smi or self.module or self.tools or self.cdi_gpus
        )

    @property
    def driver_version(self) -> str:
        if self.gpus:
            return self.gpus[0].driver
        match = _VERSION.search(self.module.split("Kernel Module", 1)[-1])
        return match.group(1) if match else ""

    @property
    def cdi_gpus(self) -> tuple[str, ...]:
        """Device names of kind nvidia.com/gpu in the node's CDI specs (0, GPU-..., all)."""
        return tuple(d for spec in self.cdi if spec.kind == GPU_KIND for d in spec.devices)

    @property
    def nvidia_runtime(self) -> bool:
        return "nvidia" in self.runtimes

    @property
    def toolkit(self) -> bool:
        """Some part of the NVIDIA Container Toolkit is installed."""
        return bool(self.tools) or self.nvidia_runtime or bool(self.cdi_gpus)


@dataclass(frozen=True)
class Selection:
    """The node's GPUs the inventory asks for."""

    chosen: tuple[Gpu, ...]
    missing: tuple[str, ...] = ()  # named in the inventory, absent on the node
    asked: int | None = None  # GPUs the inventory asks for (None: all there are)


def select(node: Node, gpus: Sequence[Gpu]) -> Selection:
    """Pure: the GPUs the inventory gives Ray on `node`, from those the node has."""
    count = node.resources.get("GPU")
    if node.gpus is None:
        if count is None:
            return Selection(tuple(gpus))
        return Selection(tuple(gpus[: int(count)]), asked=int(count))
    by_id = {str(g.index): g for g in gpus} | {g.uuid: g for g in gpus}
    chosen = tuple(by_id[i] for i in node.gpus if i in by_id)
    missing = tuple(i for i in node.gpus if i not in by_id)
    return Selection(chosen, missing, asked=len(node.gpus))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _int(text: str) -> int:
    try:
        return int(float(text.strip()))
    except ValueError:
        return 0


def parse_smi(text: str) -> tuple[bool, int | None, str, tuple[Gpu, ...]]:
    """The `gpus` section: (nvidia-smi ran, its exit code, its words if no GPU, GPUs)."""
    lines = _lines(text)
    if not lines:
        return False, None, "", ()
    rc_text = next((ln[3:] for ln in lines if ln.startswith("rc=")), "")
    rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
    gpus: list[Gpu] = []
    other: list[str] = []
    for row in csv.reader(ln for ln in lines if not ln.startswith("rc=")):
        cells = [c.strip() for c in row]
        if len(cells) == 5 and cells[0].isdigit():
            gpus.append(Gpu(int(cells[0]), cells[1], cells[2], _int(cells[3]), cells[4]))
        else:
            other.append(", ".join(cells))
    return True, rc, "\n".join(other), tuple(gpus)


def parse_tools(text: str) -> tuple[dict[str, str], str]:
    tools: dict[str, str] = {}
    version = ""
    for line in _lines(text):
        if line.startswith("%%") and "=" in line:
            name, _, path = line[2:].partition("=")
            tools[name] = path.strip()
        elif not version:
            match = _VERSION.search(line)
            version = match.group(1) if match else ""
    return tools, version


def parse_runtimes(text: str) -> tuple[dict[str, str], str, tuple[str, ...]]:
    """Docker's runtimes (name -> path), its default runtime and its CDI spec dirs."""
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}, "", ()
    if not isinstance(data, dict):
        return {}, "", ()
    runtimes = data.get("Runtimes") or {}
    paths = {
        str(name): str((value or {}).get("path", "")) if isinstance(value, dict) else ""
        for name, value in (runtimes.items() if isinstance(runtimes, dict) else ())
    }
    dirs = data.get("CDISpecDirs") or ()
    return paths, str(data.get("DefaultRuntime") or ""), tuple(str(d) for d in dirs)


def parse_cdi_spec(path: str, text: str) -> CdiSpec:
    """One CDI spec (YAML or JSON, read by a YAML parser): its kind and device names."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return CdiSpec(path, error=f"not YAML: {str(exc).splitlines()[0]}")
    if not isinstance(data, dict) or not isinstance(data.get("kind"), str):
        return CdiSpec(path, error="no `kind:` (not a CDI spec)")
    devices = data.get("devices") or []
    names = tuple(
        str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None
    )
    return CdiSpec(path, data["kind"], names)


def parse_cdi(text: str) -> tuple[CdiSpec, ...]:
    specs: list[CdiSpec] = []
    path: str | None = None
    body: list[str] = []
    for line in [*text.splitlines(), "%%file="]:
        if line.startswith("%%file="):
            if path:
                specs.append(parse_cdi_spec(path, "\n".join(body)))
            path, body = line[7:].strip(), []
        else:
            body.append(line)
    return tuple(specs)


def parse_gpu_facts(sections: dict[str, str]) -> GpuFacts:
    smi, rc, said, gpus = parse_smi(sections.get("gpus", ""))
    tools, version = parse_tools(sections.get("gpu_toolkit", ""))
    runtimes, default, dirs = parse_runtimes(sections.get("docker_runtimes", ""))
    return GpuFacts(
        smi=smi,
        smi_rc=rc,
        smi_said=said,
        gpus=gpus,
        module=sections.get("gpu_driver", "").strip(),
        devices=tuple(_lines(sections.get("gpu_devices", ""))),
        tools=tools,
        toolkit_version=version,
        runtimes=runtimes,
        default_runtime=default,
        cdi_dirs=dirs,
        cdi=parse_cdi(sections.get("cdi", "")),
    )
