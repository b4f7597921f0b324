"""GPU nodes: the facts of the GPU stack, the doctor's GPU checks, and the commands that give
Ray its GPUs, against golden outputs.

tests/unit/golden/gpu/ holds facts.sh's GPU sections written by hand from the formats NVIDIA
and Docker document (each file names its sources); tests/unit/golden/doctor/simulated_*.txt
are facts.sh's whole output on a lab node with the SIMULATED GPU faults
(provisioner/lab/gpusim.py), captured by `make goldens`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.findings import Finding
from provisioner.checks.gpu_checks import check_gpus, check_inside, check_models, parse_inside
from provisioner.checks.intent import PinFacts, Plan
from provisioner.doctor import CATALOGUE
from provisioner.doctor.run import node_findings
from provisioner.errors import InventoryError
from provisioner.gpu.assignment import GpuPlan, plan_gpus
from provisioner.gpu.facts import GpuFacts, parse_cdi_spec, parse_gpu_facts
from provisioner.inventory import Node, RayPorts, SSHSettings, load_inventory
from provisioner.node import commands
from provisioner.runtime import judges
from provisioner.runtime.docker import doctor as docker_doctor
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.docker.gpu import check_toolkit
from provisioner.runtime.docker.gpu import gpu_methods as docker_gpu_methods
from provisioner.runtime.docker.gpu import gpu_options as docker_gpu_options
from provisioner.runtime.docker.runtime import CAPS as DOCKER_CAPS
from provisioner.runtime.host import runtime as host
from provisioner.runtime.host.gpu import gpu_env as host_gpu_env
from provisioner.runtime.host.runtime import CAPS as HOST_CAPS
from tests.unit.inventories import docker_runtime, make_inventory

GOLDEN = Path(__file__).parent / "golden"
SSH = SSHSettings(user="lab")
PLAN = Plan(ports=RayPorts(), head="head-0", caps=DOCKER_CAPS)
PIN_CPU = PinFacts("sha256:" + "a" * 64, "3.11.2", "2.60.0", "amd64", cuda="")
PIN_CUDA = dataclasses.replace(PIN_CPU, cuda="12.8")
PLAN_CPU = dataclasses.replace(PLAN, pin=PIN_CPU)


def gpu_facts(name: str) -> GpuFacts:
    return parse_facts("n", (GOLDEN / "gpu" / f"{name}.txt").read_text()).gpu


def node_facts(name: str) -> NodeFacts:
    text = (GOLDEN / "doctor" / f"{name}.txt").read_text()
    return parse_facts("n", text, runtime=docker_doctor.parse)


def node(**kw: object) -> Node:
    return Node("n", "10.0.0.5", "worker", SSH, **kw)  # type: ignore[arg-type]


def judged(g: GpuFacts, n: Node | None = None, plan: Plan = PLAN) -> dict[str, Finding]:
    """The GPU checks, and in Docker mode the docker runtime's own (the container toolkit)."""
    findings = check_gpus(n or node(), NodeFacts("n", gpu=g), plan)
    if plan.caps.containers:
        findings += check_toolkit(n or node(), g)
    assert all(f.check in CATALOGUE for f in findings)
    return {f.check: f for f in findings}


# --- facts ----------------------------------------------------------------------------------


def test_eight_a100_with_the_full_toolkit() -> None:
    g = gpu_facts("dgx_a100_docker_gpus")
    assert g.driver_ok and len(g.gpus) == 8
    first = g.gpus[0]
    assert (first.index, first.name, first.memory_mib, first.driver) == (
        0,
        "NVIDIA A100-SXM4-80GB",
        81920,
        "550.54.15",
    )
    assert first.uuid == "GPU-2a5c1a1e-4e0e-5d6c-a1f5-b2e0d1c3f401"
    assert g.driver_version == "550.54.15" and "550.54.15" in g.module
    assert len(g.gpu_files) == 8 and "/dev/nvidiactl" in g.devices
    assert g.toolkit_version == "1.17.0" and g.nvidia_runtime
    assert docker_gpu_methods(g) == ("gpus", "runtime")  # the hook first: Docker's own --gpus


def test_cdi_spec_as_nvidia_ctk_writes_it() -> None:
    g = gpu_facts("cdi_only")
    assert g.cdi_dirs == ("/etc/cdi", "/var/run/cdi")
    (spec,) = g.cdi
    assert spec.path == "/etc/cdi/nvidia.yaml" and spec.kind == "nvidia.com/gpu"
    assert spec.devices == (
        "0",
        "GPU-5ba6b7e4-9c1d-2f3a-8e7b-6d5c4b3a2f10",
        "1",
        "GPU-8c7d6e5f-4a3b-2c1d-0e9f-8a7b6c5d4e11",
        "all",
    )
    assert docker_gpu_methods(g) == ("cdi",)


def test_a_broken_cdi_file_is_named_not_fatal() -> None:
    assert parse_cdi_spec("/etc/cdi/x.yaml", "kind: [").error.startswith("not YAML")
    assert parse_cdi_spec("/etc/cdi/y.json", '{"cdiVersion": "0.6.0"}').error
    assert parse_cdi_spec("/etc/cdi/z.json", '{"kind": "vendor.com/x", "devices": []}').kind


def test_a_cpu_node_says_nothing_about_gpus() -> None:
    f = node_facts("healthy_worker")
    assert f.gpu == GpuFacts(runtimes=f.gpu.runtimes, default_runtime="runc")
    assert not f.gpu.present and "runc" in f.gpu.runtimes
    assert check_gpus(node(), f, PLAN) == []


def test_both_docker_paths_read_the_same_runtimes() -> None:
    lean, cli = node_facts("pair_lean_format"), node_facts("pair_cli_format")
    assert lean.gpu == cli.gpu and "runc" in lean.gpu.runtimes


def test_simulated_gpu_node_captured_from_the_lab() -> None:
    g = node_facts("simulated_gpu").gpu
    assert [x.name for x in g.gpus] == ["Tesla T4", "Tesla T4"] and g.driver_ok
    assert docker_gpu_methods(g) == ("runtime",)  # the simulation's `nvidia` runtime, no hook
    found = judged(g)
    assert {c: f.severity for c, f in found.items()} == {
        "gpu.driver": "ok",
        "gpu.count": "ok",
        "gpu.toolkit": "ok",
    }


# --- the checks, one fault class each ---------------------------------------------------------


@pytest.mark.parametrize("source", ["golden", "simulated"])
def test_gpus_without_container_toolkit(source: str) -> None:
    g = (
        gpu_facts("no_toolkit_t4")
        if source == "golden"
        else node_facts("simulated_gpu_no_toolkit").gpu
    )
    f = judged(g)["gpu.toolkit"]
    assert f.severity == "error" and "could not select device driver" in f.message
    assert "nvidia-container-toolkit" in f.fix and "nvidia-ctk runtime configure" in f.fix
    assert judged(g)["gpu.driver"].severity == "ok"


def test_toolkit_installed_but_not_registered_with_docker() -> None:
    g = dataclasses.replace(gpu_facts("no_toolkit_t4"), tools={"nvidia-ctk": "/usr/bin/nvidia-ctk"})
    f = judged(g)["gpu.toolkit"]
    assert f.severity == "error" and "does not use it" in f.message
    assert f.fix.startswith("register it with Docker: sudo nvidia-ctk runtime configure")


@pytest.mark.parametrize("source", ["golden", "simulated"])
def test_toolkit_but_no_working_driver(source: str) -> None:
    g = gpu_facts("no_driver") if source == "golden" else node_facts("simulated_gpu_no_driver").gpu
    assert g.smi and g.smi_rc == 9 and not g.gpus
    f = judged(g)["gpu.driver"]
    assert f.severity == "error"
    assert f.message.startswith("The NVIDIA Container Toolkit is installed, but nvidia-smi fails")
    assert "couldn't communicate with the NVIDIA driver" in f.message
    assert "modprobe nvidia" in f.fix and "nvidia-smi: exit 9" in f.evidence


def test_no_nvidia_smi_at_all_where_the_inventory_asks_for_gpus() -> None:
    f = judged(GpuFacts(), node(resources={"GPU": 2.0}))
    assert (
        f["gpu.driver"].severity == "error"
        and "nvidia-smi is not installed" in f["gpu.driver"].message
    )
    assert f["gpu.count"].severity == "error" and "has 0" in f["gpu.count"].message


def test_inventory_asks_more_gpus_than_the_node_has() -> None:
    f = judged(gpu_facts("cdi_only"), node(resources={"GPU": 4.0}))["gpu.count"]
    assert f.severity == "error" and "gives Ray 4 GPU(s), the node has 2" in f.message


def test_inventory_names_a_gpu_the_node_lacks() -> None:
    f = judged(gpu_facts("cdi_only"), node(gpus=("1", "GPU-00000000-dead")))["gpu.count"]
    assert f.severity == "error" and "GPU-00000000-dead" in f.message and "nvidia-smi -L" in f.fix


def test_inventory_count_below_the_nodes_is_a_warning_naming_the_chosen() -> None:
    f = judged(gpu_facts("dgx_a100_docker_gpus"), node(resources={"GPU": 2.0}))["gpu.count"]
    assert f.severity == "warning" and "2 of the node's 8 GPUs (indices 0, 1)" in f.message
    chosen = judged(gpu_facts("dgx_a100_docker_gpus"), node(gpus=("3", "5")))["gpu.count"]
    assert chosen.severity == "ok" and chosen.message == "Ray gets 2 of 8 GPU(s): 3, 5"


def test_driver_too_old_for_the_images_cuda() -> None:
    plan = dataclasses.replace(PLAN, pin=PIN_CUDA)
    f = judged(gpu_facts("no_toolkit_t4"), plan=plan)["gpu.cuda"]
    assert f.severity == "error"
    assert "driver 470.256.02 is too old for the image's CUDA 12.8" in f.message
    assert "525.60.13" in f.fix
    assert judged(gpu_facts("cdi_only"), plan=plan)["gpu.cuda"].severity == "ok"


def test_gpus_under_a_cpu_image_are_a_warning() -> None:
    f = judged(gpu_facts("cdi_only"), plan=dataclasses.replace(PLAN, pin=PIN_CPU))["gpu.cuda"]
    assert f.severity == "warning" and "image build --cuda" in f.fix


def test_host_mode_needs_no_container_toolkit() -> None:
    plan = dataclasses.replace(PLAN, runtime="host", caps=HOST_CAPS)
    f = NodeFacts("n", gpu=gpu_facts("no_toolkit_t4"))
    checks = {x.check for x in node_findings(node(), f, plan, judges(plan.runtime))}
    assert "gpu.driver" in checks and "gpu.toolkit" not in checks
    assert "gpu.toolkit" in {x.check for x in node_findings(node(), f, PLAN, judges(PLAN.runtime))}


def test_mixed_models_across_the_cluster_warn() -> None:
    a100 = NodeFacts("a", gpu=gpu_facts("dgx_a100_docker_gpus"))
    l4 = NodeFacts("b", gpu=gpu_facts("cdi_only"))
    (f,) = check_models({"a": a100, "b": l4})
    assert (f.check, f.severity, f.host) == ("gpu.models", "warning", "cluster")
    assert "NVIDIA A100-SXM4-80GB: a" in f.evidence and "NVIDIA L4: b" in f.evidence
    assert check_models({"a": a100, "c": dataclasses.replace(a100, host="c")}) == []


def test_gpu_checks_run_in_the_doctors_node_findings() -> None:
    f = node_facts("simulated_gpu_no_toolkit")
    checks = {x.check: x.severity for x in node_findings(node(), f, PLAN, judges(PLAN.runtime))}
    assert checks["gpu.toolkit"] == "error" and checks["docker.daemon"] == "ok"


# --- the deep check: a GPU seen inside a container of the pinned image -------------------------

# `nvidia-smi -L` lines as the nvidia-smi(1) man page describes them ("GPU N: NAME (UUID: ...)")
SEEN = {
    "smi": "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-2a5c1a1e-4e0e-5d6c-a1f5-b2e0d1c3f401)\n"
    "GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-6f0d7c82-93a4-1e0b-2c4d-9e8f7a6b5c02)",
    "torch_cuda": "12.8",
    "torch_devices": 2,
}


def inside(**kw: object) -> str:
    return "noise\nPROVISIONER-GPU " + json.dumps({**SEEN, **kw}) + "\n"


def test_deep_check_passes_when_nvidia_smi_and_torch_see_the_gpus() -> None:
    (f,) = check_inside(node(), 2, parse_inside(inside()))
    assert f.severity == "ok" and "2 GPU(s) visible" in f.message and "CUDA 12.8" in f.message


def test_deep_check_on_a_container_without_gpus() -> None:
    said = "nvidia-smi: [Errno 2] No such file or directory: 'nvidia-smi'"
    (f,) = check_inside(node(), 2, parse_inside(inside(smi=said, torch_cuda=None)))
    assert f.severity == "error" and "0 of 2 GPU(s) are visible" in f.message
    assert "torch is the CPU build" in f.message and f.evidence == said


def test_deep_check_torch_blind_though_nvidia_smi_sees() -> None:
    (f,) = check_inside(node(), 2, parse_inside(inside(torch_devices=0)))
    assert f.severity == "error" and "torch (CUDA 12.8) sees 0" in f.message


def test_deep_check_container_that_did_not_run() -> None:
    out = "docker: Error response from daemon: unknown or invalid runtime name: nvidia."
    (f,) = check_inside(node(), 1, parse_inside(out))
    assert f.severity == "error" and f.evidence == out


# --- up: the GPU options of the container and of `ray start` -----------------------------------


# Each runtime's ways of handing GPUs over (`Runtime.gpu_methods`), by the test's name.
WAYS = {"docker": docker.DockerRuntime.gpu_methods, "host": host.HostRuntime.gpu_methods}


def plan_for(name: str, n: Node | None = None, runtime: str = "docker") -> GpuPlan:
    plan = plan_gpus(n or node(), gpu_facts(name), WAYS[runtime])
    assert plan is not None
    return plan


def test_plan_by_uuid_with_rays_accelerator_type() -> None:
    plan = plan_for(
        "dgx_a100_docker_gpus", node(gpus=("1", "GPU-c4f2a896-1d3b-7e5c-8a0f-2b6d4e9c7f04"))
    )
    assert plan.method == "gpus" and plan.indices == (1, 3) and plan.count == 2
    assert plan.uuids == (
        "GPU-6f0d7c82-93a4-1e0b-2c4d-9e8f7a6b5c02",
        "GPU-c4f2a896-1d3b-7e5c-8a0f-2b6d4e9c7f04",
    )
    assert plan.accelerator_type == "A100"


def test_docker_gpu_options_each_way() -> None:
    uuids = ("GPU-aaaa", "GPU-bbbb")
    by = {m: GpuPlan(m, uuids, (0, 1), "T4", ("0", "GPU-bbbb")) for m in ("gpus", "runtime", "cdi")}
    assert docker_gpu_options(by["gpus"]) == ["--gpus '\"device=GPU-aaaa,GPU-bbbb\"'"]
    assert docker_gpu_options(by["runtime"]) == [
        "--runtime=nvidia",
        "-e NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb",
        "-e NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    ]
    assert docker_gpu_options(by["cdi"]) == [
        "--device nvidia.com/gpu=0",
        "--device nvidia.com/gpu=GPU-bbbb",
    ]
    # as the node's shell splits it, --gpus gets one CSV field naming both devices
    assert shlex.split(docker_gpu_options(by["gpus"])[0]) == [
        "--gpus",
        '"device=GPU-aaaa,GPU-bbbb"',
    ]


def test_the_runtimes_turn_the_plans_method_into_their_own_words() -> None:
    """The plan is data; each runtime hands it over its own way: a container's run options
    (the GPUs, Ray's accelerator label, the signature label) or host mode's environment."""
    from provisioner.runtime.docker.gpu import run_gpu_options

    plan = GpuPlan("cdi", ("GPU-a",), (0,), "T4", ("GPU-a",))
    assert run_gpu_options(None) == []
    assert run_gpu_options(plan) == [
        "--device nvidia.com/gpu=GPU-a",
        '-e \'RAY_OVERRIDE_LABELS={"ray.io/accelerator-type": "T4"}\'',
        "--label provisioner.gpus=cdi:GPU-a",
    ]
    assert host_gpu_env(dataclasses.replace(plan, method="host")) == {
        "CUDA_VISIBLE_DEVICES": "GPU-a",
        "RAY_OVERRIDE_LABELS": '{"ray.io/accelerator-type": "T4"}',
    }


def test_cdi_names_by_uuid_where_the_spec_lists_it() -> None:
    plan = plan_for("cdi_only")
    assert plan.method == "cdi" and plan.accelerator_type == "L4"
    assert docker_gpu_options(plan) == [
        "--device nvidia.com/gpu=GPU-5ba6b7e4-9c1d-2f3a-8e7b-6d5c4b3a2f10",
        "--device nvidia.com/gpu=GPU-8c7d6e5f-4a3b-2c1d-0e9f-8a7b6c5d4e11",
    ]


def test_no_plan_without_a_way_into_the_container_or_without_a_driver() -> None:
    assert plan_gpus(node(), gpu_facts("no_toolkit_t4"), WAYS["docker"]) is None
    assert plan_gpus(node(), gpu_facts("no_driver"), WAYS["docker"]) is None
    assert plan_gpus(node(gpus=()), gpu_facts("cdi_only"), WAYS["docker"]) is None
    assert plan_gpus(node(), gpu_facts("no_toolkit_t4"), WAYS["host"]) is not None


def test_docker_run_of_a_gpu_node(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    plan = GpuPlan("runtime", ("GPU-aaaa", "GPU-bbbb"), (0, 1), "T4")
    cmd = docker.docker_run_command(inv, inv.workers[0], "sha256:abc", plan)
    assert (
        "--label provisioner.role=worker --runtime=nvidia "
        "-e NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb "
        "-e NVIDIA_DRIVER_CAPABILITIES=compute,utility "
        '-e \'RAY_OVERRIDE_LABELS={"ray.io/accelerator-type": "T4"}\' '
        "--label provisioner.gpus=runtime:GPU-aaaa,GPU-bbbb sha256:abc ray start "
    ) in cmd
    assert "--num-gpus=2 '--resources={\"accelerator_type:T4\": 1}'" in cmd
    plain = docker.docker_run_command(inv, inv.workers[0], "sha256:abc")
    assert "nvidia" not in plain and "--num-gpus" not in plain


def test_ray_start_gets_gpus_as_num_gpus_never_as_a_resource(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    w = dataclasses.replace(inv.workers[0], resources={"GPU": 2.0, "accel": 1.0})
    args = commands.ray_start_args(inv, w)
    assert "--num-gpus=2" in args and '--resources={"accel": 1.0}' in args
    none = dataclasses.replace(inv.workers[0], gpus=())
    assert "--num-gpus=0" in commands.ray_start_args(inv, none)
    plan = GpuPlan("gpus", ("GPU-aaaa",), (0,), "GeForce-RTX-4090")
    args = commands.ray_start_args(inv, w, gpus=plan)
    assert "--num-gpus=1" in args
    assert '--resources={"accel": 1.0, "accelerator_type:GeForce-RTX-4090": 1}' in args


def test_host_mode_sets_cuda_visible_devices(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="host")
    plan = GpuPlan("host", ("GPU-aaaa", "GPU-bbbb"), (0, 1), "T4")
    cmd = host.start_command(inv, inv.workers[0], None, plan)
    assert "export CUDA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb; " in shlex.split(cmd)[-1]
    assert "RAY_OVERRIDE_LABELS=" in cmd and "--num-gpus=2" in cmd
    assert "CUDA_VISIBLE_DEVICES" not in host.start_command(inv, inv.workers[0], None)


# --- the inventory's gpus ----------------------------------------------------------------------


def inventory_with(tmp_path: Path, worker: str) -> Node:
    path = tmp_path / "inv.yaml"
    path.write_text(f"cluster: c\nssh: {{user: u}}\nhead: 10.0.0.1\nworkers:\n  - {worker}\n")
    return load_inventory(path, openssh=False).workers[0]


def test_inventory_gpus(tmp_path: Path) -> None:
    w = inventory_with(tmp_path, '{address: 10.0.0.2, gpus: [0, "GPU-5ba6b7e4-9c1d"]}')
    assert w.gpus == ("0", "GPU-5ba6b7e4-9c1d")
    assert inventory_with(tmp_path, "{address: 10.0.0.2, gpus: none}").gpus == ()
    assert inventory_with(tmp_path, "{address: 10.0.0.2, gpus: all}").gpus is None
    assert inventory_with(tmp_path, "{address: 10.0.0.2}").gpus is None


@pytest.mark.parametrize(
    ("worker", "says"),
    [
        ("{address: 10.0.0.2, gpus: [0, 0]}", "named twice"),
        ("{address: 10.0.0.2, gpus: ['$(reboot)']}", "list of GPU indices and UUIDs"),
        ("{address: 10.0.0.2, gpus: some}", "list of GPU indices and UUIDs"),
        ("{address: 10.0.0.2, gpus: [0], resources: {GPU: 2}}", "resources.GPU is 2"),
        ("{address: 10.0.0.2, resources: {GPU: 1.5}}", "whole number of GPUs"),
    ],
)
def test_bad_inventory_gpus_are_refused(tmp_path: Path, worker: str, says: str) -> None:
    with pytest.raises(InventoryError, match="workers") as caught:
        inventory_with(tmp_path, worker)
    assert says in caught.value.message and caught.value.fix


def test_every_golden_names_its_source() -> None:
    for path in (GOLDEN / "gpu").glob("*.txt"):
        head = path.read_text().split("\n@@", 1)[0]
        assert "nvidia-smi" in head or "CDI" in head, path.name
    for path in (GOLDEN / "doctor").glob("simulated_*.txt"):
        assert "SIMULATED GPU node" in path.read_text().split("\n@@", 1)[0]
    assert parse_gpu_facts({}) == GpuFacts()


def test_lab_lists_the_simulated_gpu_faults() -> None:
    from tests.cli import cli

    listed = cli("lab", "fault", "break", "0", "--list")
    assert listed.exit_code == 0
    assert "gpu-no-toolkit: SIMULATED GPU node" in listed.stdout
    assert cli("lab", "fault", "break", "0", "no-such-fault").exit_code == 2


def test_simulated_nvidia_smi_rows_are_nvidia_smis_csv() -> None:
    from provisioner.gpu.facts import parse_smi
    from provisioner.lab.gpusim import SimulatedGpus, smi_rows, uuid_for

    rows = smi_rows("node-1", SimulatedGpus(count=2))
    ran, rc, _, gpus = parse_smi("\n".join([*rows, "rc=0"]))
    assert ran and rc == 0 and [g.uuid for g in gpus] == [uuid_for("node-1", i) for i in (0, 1)]
    assert uuid_for("node-1", 0) != uuid_for("node-2", 0)


def test_the_simulated_cdi_spec_is_read_as_the_doctor_reads_one_and_plans_cdi_by_uuid() -> None:
    from provisioner.lab.gpusim import SimulatedGpus, cdi_spec, uuid_for

    spec = parse_cdi_spec("/etc/cdi/x.yaml", cdi_spec("node-1", SimulatedGpus(count=2)))
    uuids = tuple(uuid_for("node-1", i) for i in (0, 1))
    assert spec.kind == "nvidia.com/gpu" and not spec.error
    assert set(spec.devices) == {"0", "1", *uuids}
    # the simulated node's facts (nvidia-smi's GPUs), with that spec where Docker reads
    # CDI specs and neither the nvidia runtime nor the toolkit's hook: CDI is the way in
    captured = node_facts("simulated_gpu").gpu
    gpus = tuple(dataclasses.replace(g, uuid=u) for g, u in zip(captured.gpus, uuids, strict=True))
    sim = dataclasses.replace(
        captured, gpus=gpus, runtimes={}, tools=(), cdi=(spec,),
        cdi_dirs=("/etc/cdi", "/var/run/cdi"),
    )  # fmt: skip
    assert docker_gpu_methods(sim) == ("cdi",)
    plan = plan_gpus(node(), sim, docker.RUNTIME.gpu_methods)
    assert plan is not None and plan.method == "cdi" and plan.uuids == uuids
    assert docker_gpu_options(plan) == [f"--device nvidia.com/gpu={u}" for u in uuids]


def test_the_container_records_its_gpus_for_up_to_compare() -> None:
    from provisioner.gpu.assignment import signature

    plan = GpuPlan("gpus", ("GPU-aaaa",), (0,), "T4")
    assert signature(plan) == "gpus:GPU-aaaa" and signature(None) == ""
    cid = '"cluster_id": "0123456789abcdef"'
    line = '{"status": "running", "image": "sha256:x", "gpus": "gpus:GPU-aaaa", ' + cid + "}"
    assert docker.parse_container_facts(line, "0123456789abcdef").gpus == "gpus:GPU-aaaa"
    # a container without the label (a CPU node, or started before this version): no GPUs
    plain = '{"status": "running", "gpus": "", ' + cid + "}"
    assert docker.parse_container_facts(plain, "0123456789abcdef").gpus == ""
    assert '"gpus": {{json (index .Config.Labels "provisioner.gpus")}}' in (
        docker.container_facts_command("demo")
    )


def test_the_deep_check_probe_runs_in_the_image_with_ups_gpu_options(tmp_path: Path) -> None:
    from provisioner.runtime import runtime_for
    from tests.unit.inventories import make_inventory

    plan = GpuPlan("runtime", ("GPU-aaaa", "GPU-bbbb"), (0, 1), "T4")
    docker = runtime_for(make_inventory(tmp_path))
    assert docker.gpu_probe_command("sha256:abc", plan) == (
        "docker run --rm -i --net=none --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=GPU-aaaa,GPU-bbbb"
        " -e NVIDIA_DRIVER_CAPABILITIES=compute,utility sha256:abc python3 -"
    )
    host = runtime_for(make_inventory(tmp_path, runtime="host"))
    assert host.gpu_probe_command("sha256:abc", plan) is None


# --- a GPU goes to Ray only where the image's torch can use it (issue 47, item 13) -----------


def test_whether_the_images_torch_can_use_a_nodes_gpus() -> None:
    from provisioner.gpu.assignment import usable

    assert usable(None, "550.54.15") is None  # no image (host mode): the node's own torch
    cpu = usable("", "550.54.15")  # a pin without CUDA: the CPU build
    assert cpu is not None and "CPU build" in cpu[0] and "image build --cuda" in cpu[1]
    old = usable("12.8", "470.256.02")
    assert old is not None and "470.256.02 is too old for the image's CUDA 12.8" in old[0]
    assert "525.60.13" in old[1]
    assert usable("12.8", "525.60.13") is None and usable("13.0", "580.65.06") is None
    assert usable("9.0", "390.1") is None  # not in the table: the doctor warns, Ray gets them


def test_gpus_the_images_torch_cannot_use_are_withheld_from_ray() -> None:
    """The plan for a node with 8 A100s (driver 550) under each pin: the CPU pin keeps all
    8 from Ray, with why and the fix; a CUDA 12.8 pin gives them; no image: given too."""
    from provisioner.gpu.assignment import Withheld, withhold

    facts = {"n": gpu_facts("dgx_a100_docker_gpus")}
    plan = plan_gpus(node(), facts["n"], docker.RUNTIME.gpu_methods)
    assert plan is not None and plan.count == 8
    kept, withheld = withhold({"n": plan}, facts, "")
    assert kept == {} and list(withheld) == ["n"]
    assert isinstance(withheld["n"], Withheld) and withheld["n"].count == 8
    assert "image build --cuda" in withheld["n"].fix
    assert withhold({"n": plan}, facts, "12.8") == ({"n": plan}, {})
    assert withhold({"n": plan}, facts, None) == ({"n": plan}, {})
    old = {"n": gpu_facts("no_toolkit_t4")}  # driver 470 under CUDA 12.8: torch finds none
    t4 = plan_gpus(node(), old["n"], host.RUNTIME.gpu_methods)
    assert t4 is not None and list(withhold({"n": t4}, old, "12.8")[1]) == ["n"]


def test_a_node_whose_gpus_are_withheld_starts_ray_with_no_gpu(tmp_path: Path) -> None:
    """Whatever the inventory asked (gpus: [...] or resources.GPU), `ray start` says
    --num-gpus=0 and the container gets no GPU option."""
    from provisioner.gpu.assignment import without_gpus

    inv = make_inventory(tmp_path)
    for asked in (node(gpus=("0", "1")), node(resources={"GPU": 4.0, "x": 1.0}), node()):
        args = commands.ray_start_args(inv, without_gpus(asked))
        assert [a for a in args if "gpus" in a] == ["--num-gpus=0"], args
        assert not any('"GPU"' in a for a in args), args
    worker = dataclasses.replace(inv.workers[0], resources={"GPU": 2.0})
    command = docker_runtime(inv, "sha256:abc").start_command(without_gpus(worker), None)
    assert "--num-gpus=0" in command and "nvidia" not in command and "--gpus" not in command


def test_up_shows_the_doctors_gpu_warnings_and_what_it_withheld() -> None:
    """`up`'s warnings: the doctor's gpu.* warnings with their fix (not its other warnings,
    nor its errors); a node whose GPUs Ray did not get, of which the doctor said nothing
    (`up --no-doctor`), in up's own words; never both for one node."""
    from provisioner.checks.findings import error, warning
    from provisioner.cluster.up import gpu_warnings
    from provisioner.gpu.assignment import CPU_IMAGE_FIX, Withheld

    cuda = check_gpus(node(), NodeFacts("n", gpu=gpu_facts("cdi_only")), PLAN_CPU)
    (said,) = [f for f in cuda if f.check == "gpu.cuda"]
    findings = [
        said,
        warning("resources.memory", "n", "little memory", "", "add memory"),
        error("gpu.count", "m", "too many", "", "fewer"),
    ]
    withheld = {"n": Withheld(2, "the pinned image's torch is the CPU build", CPU_IMAGE_FIX)}
    (line,) = gpu_warnings(findings, withheld)
    assert line.startswith("n: gpu.cuda: the pinned image's torch is CPU-only")
    assert "gives Ray none" in line and "Fix: build the CUDA image" in line
    (own,) = gpu_warnings([], withheld)
    assert own == (
        "n: gpu.cuda: the pinned image's torch is the CPU build: Ray gets none of its 2 "
        f"GPU(s), learners train on CPU. Fix: {CPU_IMAGE_FIX}"
    )
    assert gpu_warnings([findings[1]], {}) == []


def test_up_reads_the_images_cuda_from_the_pin_where_ray_runs_the_image(tmp_path: Path) -> None:
    from provisioner.cluster.up import image_cuda
    from provisioner.image.pin import Pin, Versions
    from provisioner.runtime import runtime_for

    pin = Pin(
        "sha256:" + "a" * 64, (), "base", "sha256:b", "c", Versions("3.11", "2.60", "2", "1"), 1
    )
    cuda = dataclasses.replace(pin, extra={"variant": "cuda", "cuda": "12.8"})
    inv = make_inventory(tmp_path)
    assert image_cuda(runtime_for(inv, pin), pin) == ""  # the CPU pin: no "cuda"
    assert image_cuda(runtime_for(inv, cuda), cuda) == "12.8"
    assert image_cuda(runtime_for(inv, pin), None) is None
    hosted = make_inventory(tmp_path, runtime="host")
    assert image_cuda(runtime_for(hosted, cuda), cuda) is None  # no image: the node's torch
