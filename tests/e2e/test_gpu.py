"""GPU nodes on the lab, in SIMULATION: no GPU, driver or CUDA is here.

The lab's GPU faults (provisioner/lab/gpusim.py) make a node look like an NVIDIA GPU node: a
stand-in `nvidia-smi` answering in NVIDIA's format, /dev/nvidia* stand-ins, and a Docker
runtime named `nvidia` that runs plain runc. What this proves end to end: the doctor's GPU
facts and checks through real sshd and dockerd, and `up` building and starting a GPU node's
container with the GPU options Docker reads back, and Ray advertising that node's GPUs
(under a pin that says CUDA torch); under the lab's own CPU pin, Ray gets none of them and a
job's learner trains on CPU.
It does not prove that a real GPU reaches torch (scripts/gpu_check.sh, on a GPU machine).
Every fault is mended after; the cluster is taken down at the end of the module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.cluster import headprobe
from provisioner.cluster.headprobe import GcsNode
from provisioner.doctor import DoctorReport, run_doctor
from provisioner.image.pin import read_pin, write_pin
from provisioner.inventory import Inventory, load_inventory
from provisioner.lab import faults
from provisioner.lab.engine import exec_rc
from provisioner.lab.gpusim import uuid_for
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import ray_container
from provisioner.remote import Pool
from provisioner.runtime import runtime_for
from provisioner.runtime.context import cluster_context
from tests.cli import cli
from tests.e2e.test_doctor import broken

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


@pytest.fixture(scope="module")
def inventory(cluster_inventory: Path) -> Iterator[Path]:
    yield cluster_inventory
    cli("down", "-i", str(cluster_inventory), "--no-logs")


def gpu_findings(report: DoctorReport) -> dict[tuple[str, str], str]:
    """(host, check) -> severity of every GPU finding that is not ok."""
    return {
        (f.host, f.check): f.severity
        for f in report.findings
        if f.check.startswith("gpu.") and f.severity != "ok"
    }


def fix_of(report: DoctorReport, host: str, check: str) -> str:
    return next(f.fix for f in report.findings if (f.host, f.check) == (host, check))


def with_cuda_pin(
    inventory: Path, tmp_path: Path, worker_resources: dict[str, int] | None = None
) -> Path:
    """The inventory, its pin saying the image has CUDA 12.8 torch (as the CUDA image's
    pin does), and worker 1 given `worker_resources` (None: as it was). The lab's image
    is the CPU one: under this pin `up` hands the SIMULATED GPUs to Ray (a GPU goes to Ray
    only where the image's torch can use it)."""
    pin = read_pin(load_inventory(inventory).image_lock)  # type: ignore[arg-type]
    pin.extra["cuda"] = "12.8"
    write_pin(pin, tmp_path / "cuda.lock.json")
    data = yaml.safe_load(inventory.read_text())
    data["image"] = {"lock": str(tmp_path / "cuda.lock.json")}
    for key in ("key", "known_hosts"):
        data["ssh"][key] = str(inventory.parent / data["ssh"][key])
    if worker_resources is not None:
        worker = data["workers"][0]
        data["workers"][0] = {**worker, "resources": worker_resources}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_doctor_names_each_gpu_fault_with_its_fix(
    lab: LabInfo, inventory: Path, tmp_path: Path
) -> None:
    """Each GPU fault class on SIMULATED GPU nodes: named on the right node, with its fix."""
    _, w1, w2 = lab.nodes[:3]
    inv = load_inventory(with_cuda_pin(inventory, tmp_path, {"GPU": 4}))
    # driver 470 under a CUDA 12.8 image; 4 GPUs asked of a 2-GPU node; T4 beside A100
    with broken(lab, (w1, "gpu-old-driver"), (w2, "gpu-a100")):
        report = run_doctor(cluster_context(inv, lenient_pin=True), reachability=False)
    assert gpu_findings(report) == {
        (w1.name, "gpu.cuda"): "error",
        (w1.name, "gpu.count"): "error",
        ("cluster", "gpu.models"): "warning",
    }
    assert "upgrade the driver to 525.60.13 or newer" in fix_of(report, w1.name, "gpu.cuda")
    assert "(2)" in fix_of(report, w1.name, "gpu.count")
    assert "one GPU model per cluster" in fix_of(report, "cluster", "gpu.models")
    # GPUs and their driver but no toolkit; the toolkit but no working driver
    with broken(lab, (w1, "gpu-no-toolkit"), (w2, "gpu-no-driver")):
        report = run_doctor(
            cluster_context(load_inventory(inventory), lenient_pin=True), reachability=False
        )
    found = gpu_findings(report)
    assert found[(w1.name, "gpu.toolkit")] == "error"
    assert found[(w2.name, "gpu.driver")] == "error"
    assert "nvidia-ctk runtime configure" in fix_of(report, w1.name, "gpu.toolkit")
    assert "modprobe nvidia" in fix_of(report, w2.name, "gpu.driver")
    assert not any(host == lab.nodes[0].name for host, _ in found)  # the head: no GPU, no word
    # the deep check: the simulated runtime is runc, so no GPU shows inside the image
    with broken(lab, (w1, "gpu")):
        report = run_doctor(
            cluster_context(load_inventory(inventory), lenient_pin=True),
            reachability=False,
            gpu_deep=True,
        )
    deep = [f for f in report.findings if f.check == "gpu.container"]
    assert [(f.host, f.severity) for f in deep] == [(w1.name, "error")]
    assert "0 of 2 GPU(s) are visible" in deep[0].message, deep[0]
    assert report.round_trips == 2


def test_up_hands_the_simulated_gpus_to_that_nodes_container_and_ray(
    lab: LabInfo, inventory: Path, tmp_path: Path
) -> None:
    """`up` on a lab with one SIMULATED GPU node (the `nvidia` runtime), under a pin that
    says the image's torch has CUDA 12.8: that node's container
    runs with the nvidia runtime and its two GPUs by UUID; Ray lists 2 GPUs and the T4
    accelerator type on that node only. The node became a GPU node while its Ray ran (a
    driver installed later): `up` restarts that node alone."""
    _, w1, _ = lab.nodes[:3]
    inventory = with_cuda_pin(inventory, tmp_path)
    inv = load_inventory(inventory)
    container = ray_container(inv)
    uuids = [uuid_for(w1.name, i) for i in range(2)]
    before = cli("up", "-i", str(inventory), "--json")  # the cluster, without GPUs
    assert before.exit_code == 0, before.stdout + before.stderr
    try:
        with broken(lab, (w1, "gpu")):
            result = cli("up", "-i", str(inventory), "--json")
            assert result.exit_code == 0, result.stdout + result.stderr
            assert result.json()["started"] == [w1.name]  # its GPUs changed, nothing else
            assert result.json()["gpus"][w1.name]["method"] == "runtime"
            config = {}
            for node in lab.nodes[:3]:
                rc, out = exec_rc(
                    node.container,
                    f"docker inspect --format '{{{{json .HostConfig.Runtime}}}} "
                    f"{{{{json .Config.Env}}}}' {container}",
                )
                assert rc == 0, out
                runtime, _, env = out.strip().partition(" ")
                config[node.name] = (json.loads(runtime), json.loads(env))
            assert config[w1.name][0] == "nvidia"
            assert f"NVIDIA_VISIBLE_DEVICES={','.join(uuids)}" in config[w1.name][1]
            for name, (runtime, env) in config.items():
                if name != w1.name:
                    assert runtime == "runc" and not [e for e in env if "NVIDIA" in e], name
            with Pool(inv) as pool:
                # The raylet reports its resources a moment after joining, and the replaced
                # container's raylet stays listed alive (no GPUs) beside the new one until its
                # health checks fail: wait (up to 120 s) for one alive node per address.
                for _ in range(240):
                    nodes = headprobe.gcs_nodes(pool.session(inv.head), runtime_for(inv))
                    listed = [n for n in nodes if n.alive]
                    alive = {n.ip: n for n in listed}
                    if len(alive) == len(listed) == 3:
                        break
                    time.sleep(0.5)
            gpus = {ip: n.resources.get("GPU", 0) for ip, n in alive.items()}
            assert gpus == {n.address: (2.0 if n is w1 else 0) for n in lab.nodes[:3]}
            assert alive[w1.address].resources.get("accelerator_type:T4") == 1.0
            assert alive[w1.address].labels.get("ray.io/accelerator-type") == "T4"
            others = [alive[n.address] for n in lab.nodes[:3] if n is not w1]
            assert not any("accelerator_type:T4" in n.resources for n in others)
            # before the runtime goes: remove the container that names it
            exec_rc(w1.container, f"docker rm -f {container}")
    finally:
        faults.clear(lab)
        exec_rc(w1.container, f"docker rm -f {container}")


def alive_gpus(inv: Inventory, count: int) -> dict[str, GcsNode]:
    """The cluster's alive Ray nodes by address, once there is one per address (`count`).
    The raylet reports its resources a moment after joining, and a replaced container's
    raylet stays listed alive (no GPUs) beside the new one until its health checks fail:
    wait up to 120 s."""
    alive: dict[str, GcsNode] = {}
    with Pool(inv) as pool:
        for _ in range(240):
            nodes = headprobe.gcs_nodes(pool.session(inv.head), runtime_for(inv))
            listed = [n for n in nodes if n.alive]
            alive = {n.ip: n for n in listed}
            if len(alive) == len(listed) == count:
                break
            time.sleep(0.5)
    return alive


def test_up_hands_the_simulated_gpus_through_cdi_on_a_docker_26_node(
    lab: LabInfo, inventory: Path, tmp_path: Path
) -> None:
    """A trixie node (Docker 26) with Docker's `cdi` feature on and a CDI spec of its two
    SIMULATED GPUs (stand-in device nodes), no nvidia runtime: `up` hands them over by CDI
    (`--device nvidia.com/gpu=UUID`), the container's configuration says so (device
    requests of driver cdi) and holds the spec's device nodes; Ray lists 2 GPUs on that
    node only."""
    odd = [n for n in lab.nodes[:3] if n.flavour.startswith("trixie") and n.role == "worker"]
    # the default e2e lab has two; a lab without one (PROVISIONER_LAB_FLAVOURS=bookworm)
    # cannot show CDI, and says so by failing rather than by passing over it
    assert odd, "CDI needs a worker of Docker >= 25 (a trixie flavour): none in this lab"
    node = odd[0]
    rc, version = exec_rc(node.container, "docker version --format '{{.Server.Version}}'")
    assert rc == 0 and int(version.split(".")[0]) >= 25, version  # CDI: Docker >= 25
    inventory = with_cuda_pin(inventory, tmp_path)  # (a CUDA torch: Ray gets the GPUs)
    inv = load_inventory(inventory)
    container = ray_container(inv)
    uuids = [uuid_for(node.name, i) for i in range(2)]
    before = cli("up", "-i", str(inventory), "--json")  # the cluster, without GPUs
    assert before.exit_code == 0, before.stdout + before.stderr
    try:
        with broken(lab, (node, "gpu-cdi")):
            result = cli("up", "-i", str(inventory), "--json")
            assert result.exit_code == 0, result.stdout + result.stderr
            assert result.json()["gpus"][node.name]["method"] == "cdi"
            asked = {}
            for n in lab.nodes[:3]:
                rc, out = exec_rc(
                    n.container,
                    f"docker inspect --format '{{{{json .HostConfig.DeviceRequests}}}}' "
                    f"{container} && docker exec {container} sh -c "
                    "'for d in /dev/nvidia0 /dev/nvidia1; do [ -c $d ] && "
                    'stat -c "$d %t:%T" $d; done; true\'',
                )
                assert rc == 0, out
                requests, _, devices = out.strip().partition("\n")
                asked[n.name] = (json.loads(requests) or [], devices.split("\n"))
            (request,) = asked[node.name][0]
            assert request["Driver"] == "cdi", request
            assert request["DeviceIDs"] == [f"nvidia.com/gpu={u}" for u in uuids], request
            # the spec's device nodes, as CDI made them: the stand-ins' numbers (1:3)
            assert asked[node.name][1] == ["/dev/nvidia0 1:3", "/dev/nvidia1 1:3"], asked
            for name, (requests, devices) in asked.items():
                if name != node.name:
                    assert requests == [] and devices == [""], (name, requests, devices)
            alive = alive_gpus(inv, 3)
            gpus = {ip: n.resources.get("GPU", 0) for ip, n in alive.items()}
            assert gpus == {n.address: (2.0 if n is node else 0) for n in lab.nodes[:3]}
            assert alive[node.address].resources.get("accelerator_type:T4") == 1.0
            exec_rc(node.container, f"docker rm -f {container}")
    finally:
        faults.clear(lab)
        exec_rc(node.container, f"docker rm -f {container}")


def test_a_gpu_node_under_the_cpu_image_trains_on_cpu_and_up_says_why(
    lab: LabInfo, inventory: Path, tmp_path: Path
) -> None:
    """A SIMULATED GPU node under the lab's own pin, the CPU image (torch without CUDA).
    Positive control: `nvidia-smi` on the node lists its 2 GPUs. `up` shows the doctor's
    gpu.cuda warning with its fix, gives Ray none of those GPUs (its total and each node's
    resources say 0; the container gets no GPU), and a short job then completes with its
    learner on CPU, as `learners.json` home says. (Before: "2 GPUs", one learner per GPU,
    and the job died with "Distributed package doesn't have NCCL built in".)"""
    _, w1, _ = lab.nodes[:3]
    inv = load_inventory(inventory)
    assert inv.image_lock is not None and "cuda" not in read_pin(inv.image_lock).extra
    container = ray_container(inv)
    try:
        with broken(lab, (w1, "gpu")):
            rc, listed = exec_rc(w1.container, "nvidia-smi -L")
            assert rc == 0 and listed.count("GPU ") == 2, listed  # the node has its GPUs
            up = cli("up", "-i", str(inventory))
            assert up.exit_code == 0, up.stdout + up.stderr
            assert f"{w1.name}: gpu.cuda: the pinned image's torch is CPU-only" in up.stderr
            assert "Fix: build the CUDA image (provisioner image build --cuda)" in up.stderr
            assert " 0 GPUs in " in up.stdout, up.stdout
            assert f"the image's torch cannot use them, see the warning): {w1.name} (2)" in (
                up.stdout
            )
            alive = alive_gpus(inv, 3)
            gpus = {ip: n.resources.get("GPU", 0) for ip, n in alive.items()}
            assert gpus == {n.address: 0 for n in lab.nodes[:3]}, gpus
            rc, out = exec_rc(
                w1.container,
                f"docker inspect --format '{{{{json .HostConfig.Runtime}}}} "
                f"{{{{json .Config.Env}}}}' {container}",
            )
            assert rc == 0, out
            runtime, _, env = out.strip().partition(" ")
            assert json.loads(runtime) == "runc" and "NVIDIA" not in env, out
            results = tmp_path / "results"
            code = cli(
                "submit", "-i", str(inventory), "--results", str(results), "--json",
                str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--train-batch", "300",
                "--max-iterations", "2",
            )  # fmt: skip
            assert code.exit_code == 0, code.stderr[-3000:]
            job = code.json()
            assert job["status"] == "SUCCEEDED", code.stderr[-3000:]
            learners = json.loads((results / job["job_id"] / "learners.json").read_text())
            assert [(d["device"], d["gpu"]) for d in learners] == [("cpu", None)], learners
    finally:
        faults.clear(lab)
        exec_rc(w1.container, f"docker rm -f {container}")
