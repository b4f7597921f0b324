"""The podman runtime: its commands (pure strings), its state parser, and the doctor's
judges of its facts section: golden/doctor/podman_*.txt.

podman_head: facts.sh with this runtime's section, captured on the head of the podman lab
after test_podman (rootless Podman 4.3, overlay storage, cgroup v1 with controllers on the
v2 mount, runc, lingering on, the pin loaded, no container). podman_running_head: the
captured host-mode head running its cluster (host_running_head), with that runtime section
and one `podman ps` line of the cluster's running container in Podman 4.3's words (as
seen on a probe node). Other cases are those files with one fact changed.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.findings import CATALOGUE, Finding
from provisioner.checks.plan import PinFacts, Plan
from provisioner.doctor.api import explained_by_own_ray, node_findings
from provisioner.doctor.gather import _script
from provisioner.gpu.plan import GpuPlan
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.runtime import judges, podman, runtime_for
from provisioner.runtime.podman_doctor import CHECKS, FACTS, PodmanFacts
from provisioner.runtime.podman_doctor import parse_facts as parse_podman
from provisioner.runtime.podman_image import bare_id, full_id, has_image_command
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin

GOLDEN = Path(__file__).parent / "golden" / "doctor"
PIN_ID = "sha256:" + "d" * 64


def test_the_registry_builds_it_by_name(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="podman")
    runtime = runtime_for(inv, make_pin())
    assert isinstance(runtime, podman.PodmanRuntime) and runtime.name == "podman"
    assert (runtime.caps.containers, runtime.caps.needs_image) == (True, True)
    assert judges("podman") is podman.JUDGES and podman.JUDGES.facts == FACTS


def test_worker_podman_run_mirrors_docker_mode_and_carries_no_token(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, shm_size=2**30, tls=False)
    cmd = podman.run_command(inv, inv.workers[0], PIN_ID, cluster_id="c1")
    guard, _, rest = cmd.partition("; mkdir -p ")
    assert guard.startswith("l=$(podman container inspect --format ")
    assert "exit 3" in guard and "RAY_AUTH_TOKEN=" not in cmd  # by path, never by value
    assert rest == (
        '"$HOME"/.provisioner/clusters/demo/ray "$HOME"/.provisioner/clusters/demo/results '
        "&& podman run -d --name ray-demo --network host --pull=never "
        "--restart=unless-stopped --log-driver k8s-file --shm-size=1073741824 "
        '-v "$HOME"/.provisioner/clusters/demo/ray:/tmp/ray '
        '--mount type=bind,source="$HOME"/.provisioner/clusters/demo/auth_token,'
        "target=/run/provisioner/auth_token,readonly "
        '-v "$HOME"/.provisioner/clusters/demo/results:/provisioner/results '
        "-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/provisioner/auth_token "
        "-e RAY_USAGE_STATS_ENABLED=0 -e PROVISIONER_RESULTS_ROOT=/provisioner/results "
        "--label provisioner.cluster=demo --label provisioner.role=worker "
        f"--label provisioner.cluster-id=c1 {'d' * 64} ray start --address=10.250.9.10:6379 "
        "--node-ip-address=10.250.9.11 --node-manager-port=8077 --object-manager-port=8076 "
        "--runtime-env-agent-port=8079 --dashboard-agent-grpc-port=8078 "
        "--dashboard-agent-listen-port=52365 --metrics-export-port=8090 "
        "--min-worker-port=10002 --max-worker-port=19999 --disable-usage-stats --block"
    )


def test_gpus_go_through_cdi(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    gpus = GpuPlan(method="cdi", uuids=("GPU-a",), indices=(0,), cdi_names=("0",))
    cmd = podman.run_command(inv, inv.head, PIN_ID, gpus)
    assert "--device nvidia.com/gpu=0 --label provisioner.gpus=cdi:GPU-a " in cmd
    assert podman.gpu_probe_command(PIN_ID, gpus) == (
        f"podman run --rm -i --pull=never --network none --device nvidia.com/gpu=0 "
        f"{'d' * 64} python3 -"
    )


def test_down_removes_only_this_clusters_container() -> None:
    cmd = podman.remove_command("demo", "c1")
    assert cmd.endswith(
        "; podman rm -f -t 0 ray-demo >/dev/null 2>&1; "
        "! podman container exists ray-demo >/dev/null 2>&1"
    )
    # another cluster's namesake (its id label) is left alone: exit 0 before any rm
    guard = cmd.split("; podman rm")[0]
    assert "provisioner.cluster-id" in guard and "exit 0; fi" in guard


def test_other_commands() -> None:
    assert podman.log_command("demo", 50) == "podman logs --timestamps --tail 50 ray-demo 2>&1"
    assert podman.exec_python_command("demo", "--x", "a b") == (
        "podman exec -i ray-demo python - --x 'a b'"
    )
    assert podman.running_test("demo") == (
        "[ \"$(podman container inspect --format '{{.State.Running}}' ray-demo 2>/dev/null)\" "
        "= true ]"
    )
    assert has_image_command(PIN_ID) == (
        f"podman image inspect --format '{{{{.Id}}}}' {'d' * 64} 2>/dev/null || true"
    )
    assert bare_id(PIN_ID) == "d" * 64 and full_id("d" * 64) == PIN_ID and full_id("") == ""


def test_state_parses_podmans_inspect_with_the_pins_id(tmp_path: Path) -> None:
    line = (
        '{"running": true, "status": "running", "image": "' + "d" * 64 + '", '
        '"started_at": "2026-12-03T06:40:01.5Z", "restarts": 1, "exit_code": 0, '
        '"oom_killed": false, "cluster_id": "c1", "gpus": ""}'
    )
    state = podman.parse_state(line, "c1")
    assert state.running and state.runs == PIN_ID and state.restarts == 1
    runtime = runtime_for(make_inventory(tmp_path, runtime="podman"), make_pin(image_id=PIN_ID))
    assert runtime.is_current(state) is True
    assert podman.parse_state(line, "c2").status == "absent"  # another cluster's namesake
    assert podman.parse_state("null").status == "absent"


def test_render_uses_rays_podman_switch(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="podman")
    section = runtime_for(inv, make_pin(image_id=PIN_ID)).render_section(tmp_path / "token")
    docker = section.config["docker"]
    assert docker["use_podman"] is True and docker["image"] == "d" * 64
    assert docker["container_name"] == "ray-demo" and docker["pull_before_run"] is False


# --- the doctor's judges, on facts captured on lab nodes

SSH = SSHSettings(user="lab")
HEAD = Node("provisioner-e2e-podman-0", "10.250.103.10", "head", SSH)
PIN = PinFacts(PIN_ID, "3.11.2", "2.60.0", "amd64")


def plan(pin: PinFacts | None = PIN) -> Plan:
    return Plan(
        ports=RayPorts(),
        head=HEAD.name,
        pin=pin,
        runtime="podman",
        cluster="e2e-podman",
        caps=podman.CAPS,
    )


def golden(name: str) -> NodeFacts:
    return parse_facts(HEAD.name, (GOLDEN / f"{name}.txt").read_text())


def edited(facts: NodeFacts, old: str, new: str) -> NodeFacts:
    assert old in facts.runtime, old
    return replace(facts, runtime=facts.runtime.replace(old, new))


def found(facts: NodeFacts, p: Plan | None = None) -> dict[str, Finding]:
    result = podman.JUDGES.node(HEAD, facts, p or plan())
    assert all(f.check in CATALOGUE or f.check in CHECKS for f in result)
    return {f.check: f for f in result if f.check.startswith(("podman.", "image."))}


def test_the_facts_section_runs_in_the_doctors_script() -> None:
    script = _script("facts.sh").decode()
    for helper in ("lookup()", "with_timeout()", "image=$3"):
        assert helper in script.replace(" image=$3", "\nimage=$3")  # FACTS uses these


def test_a_healthy_node() -> None:
    facts = golden("podman_head")
    p = parse_podman(facts.runtime)
    assert p.version.startswith("4.") and p.rootless and p.graph_driver == "overlay"
    assert p.subuid == ((100000, 65536),) and p.subgid == ((100000, 65536),)
    assert p.linger and not p.systemd and p.oci_runtime == "runc"
    checks = found(facts)
    assert {c: f.severity for c, f in checks.items()} == {
        "podman.version": "ok",
        "podman.rootless": "ok",
        "podman.storage": "ok",
        "podman.cgroups": "warning",  # cgroup v1 here: no limits, but it runs
        "podman.subids": "ok",
        "podman.linger": "ok",
        "image.present": "ok",
    }
    assert "unified hierarchy" in checks["podman.cgroups"].fix


def test_without_lingering_the_fix_is_loginctl() -> None:
    facts = edited(golden("podman_head"), "%%linger=yes", "%%linger=no")
    finding = found(facts)["podman.linger"]
    assert finding.severity == "warning"  # no systemd on this node: nothing ends it yet
    assert finding.fix == f"sudo loginctl enable-linger lab on {HEAD.name}"
    with_systemd = edited(facts, "%%systemd=no", "%%systemd=yes")
    finding = found(with_systemd)["podman.linger"]
    assert finding.severity == "error" and "dies when the SSH session" in finding.message
    assert finding.fix == f"sudo loginctl enable-linger lab on {HEAD.name}"


def test_missing_subordinate_ids_name_usermod() -> None:
    facts = golden("podman_head")
    lines = [ln for ln in facts.runtime.splitlines() if not ln.startswith("%%subgid=")]
    no_gids = replace(facts, runtime="\n".join(lines))
    finding = found(no_gids)["podman.subids"]
    assert finding.severity == "error" and "no subordinate GIDs" in finding.message
    assert finding.fix.startswith("sudo usermod --add-subuids 100000-165535 --add-subgids")
    narrow = edited(facts, "%%subuid=lab:100000:65536", "%%subuid=lab:100000:1000")
    assert found(narrow)["podman.subids"].severity == "warning"
    no_map = replace(facts, runtime=facts.runtime.replace("%%newuidmap=", "%%gone="))
    assert found(no_map)["podman.subids"].fix == "sudo apt-get install -y uidmap"


def test_vfs_storage_and_crun_on_a_hybrid_layout() -> None:
    facts = golden("podman_head")
    vfs = edited(facts, '"graphDriverName": "overlay"', '"graphDriverName": "vfs"')
    finding = found(vfs)["podman.storage"]
    assert finding.severity == "warning" and 'driver = "overlay"' in finding.fix
    crun = edited(facts, '"name": "runc"', '"name": "crun"')
    finding = found(crun)["podman.cgroups"]
    assert finding.severity == "error" and 'runtime = "runc"' in finding.fix


def test_no_podman_and_a_failing_podman() -> None:
    facts = golden("podman_head")
    absent = replace(facts, runtime="%%user=lab 1000\n%%linger=yes\n")
    (only,) = found(absent).values()
    assert only.check == "podman.version" and only.severity == "error"
    assert "apt-get install -y podman uidmap" in only.fix
    broken = parse_podman(
        "%%podman=/usr/bin/podman\n%%info_rc=125\n%%info=\n"
        "%%info_msg=Error: cannot set up namespace using newuidmap: exit status 1\n"
    )
    assert not broken.info and broken.info_rc == 125
    text = "%%podman=/usr/bin/podman\n%%info_rc=125\n%%info=\n%%info_msg=Error: newuidmap\n"
    checks = found(replace(facts, runtime=text))
    assert checks["podman.rootless"].severity == "error"
    assert "newuidmap" in checks["podman.rootless"].evidence


def test_the_pin_absent_from_the_users_podman() -> None:
    facts = golden("podman_head")
    lines = [ln for ln in facts.runtime.splitlines() if not ln.startswith("%%image=")]
    finding = found(replace(facts, runtime="\n".join(lines)))["image.present"]
    assert finding.severity == "warning" and "podman load" in finding.fix


def test_own_ray_is_this_clusters_running_container() -> None:
    running = golden("podman_running_head")
    assert podman.JUDGES.own_ray(running, "e2e-podman")
    assert not podman.JUDGES.own_ray(running, "another")
    assert not podman.JUDGES.own_ray(golden("podman_head"), "e2e-podman")
    # the busy ports and Ray processes there are this cluster's own: warnings, not errors
    judged = node_findings(HEAD, running, plan())
    kept = explained_by_own_ray(judged, running, "e2e-podman", "podman")
    assert any(f.check == "ray.stale" and f.severity == "error" for f in judged)
    assert not [f for f in kept if f.severity == "error"], [
        f for f in kept if f.severity == "error"
    ]


def test_empty_section_parses_to_nothing() -> None:
    assert parse_podman("") == PodmanFacts()
