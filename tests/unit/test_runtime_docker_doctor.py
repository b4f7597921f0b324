"""The docker runtime's doctor (runtime/docker/doctor.py): its facts section inside the one
round trip, its parser, and its judges, on facts captured from lab nodes (golden/doctor/)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

from provisioner.checks.facts import NodeFacts, RuntimeFacts, parse_facts
from provisioner.checks.findings import Finding
from provisioner.checks.intent import PinFacts, Plan
from provisioner.checks.node_checks import check_resources, check_sudo
from provisioner.doctor import CATALOGUE
from provisioner.doctor.gather import RUNTIME_MARK, _script, facts_script
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.runtime import judges
from provisioner.runtime.docker import doctor as docker_doctor
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.docker.doctor import DockerFacts, check_docker, check_image
from provisioner.runtime.podman import doctor as podman_doctor
from provisioner.runtime.podman import runtime as podman

GOLDEN = Path(__file__).parent / "golden" / "doctor"
SSH = SSHSettings(user="lab")
HEAD = Node("provisioner-i17-0", "10.250.117.10", "head", SSH)
WORKER = Node("provisioner-i17-1", "10.250.117.11", "worker", SSH)
PIN_ID = "sha256:b36692a0d325c170869f2d9796e27ef06dba30ebc5f473c260ee1796602cf135"
PLAN = Plan(
    ports=RayPorts(),
    head=HEAD.name,
    pin=PinFacts(PIN_ID, "3.11.2", "2.60.0", "amd64"),
    caps=docker.CAPS,
    runtime_label="Docker",
)


def facts(name: str, node: Node = HEAD) -> NodeFacts:
    return parse_facts(node.name, (GOLDEN / f"{name}.txt").read_text(), runtime=docker_doctor.parse)


def by_check(found: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in found}


def test_nodefacts_has_no_field_named_after_a_runtime() -> None:
    names = {f.name for f in dataclasses.fields(NodeFacts)}
    assert not [n for n in names if n.startswith(("docker", "podman", "container", "image"))]
    assert "runtime" in names


def test_the_section_runs_inside_the_one_round_trip_before_the_disks() -> None:
    shared = _script("facts.sh")
    assert shared.count(RUNTIME_MARK) == 1
    assert b"docker" not in shared.replace(b"docker|libpod", b"")  # Docker's part moved out
    for name in ("docker", "podman", "host"):
        text = facts_script(judges(name), "echo state").decode()
        assert text.count("\nsection end\n") == 1 and "#@runtime-facts" not in text
        assert text.index(judges(name).facts.strip()) < text.index("section disk")
        # the state command starts first, beside the rest; its answer is told last
        started = "\nfacts() {\nexec 7< <({ echo state\n} 2>&1 </dev/null)\n"
        assert started in text and text.index(started) < text.index("section user")
        assert "section ray_state\ncat <&7\nexec 7<&-\nsection end\n" in text  # last
        assert "#@ray-state" not in facts_script(judges(name)).decode()
        assert "exec 7" not in facts_script(judges(name)).decode()
    docker_text = facts_script(judges("docker")).decode()
    assert "runtime_root=$docker_root" in docker_text
    assert "section docker_socket" not in facts_script(judges("host")).decode()


def test_docker_facts_parse_from_its_sections() -> None:
    healthy = facts("healthy_head").runtime
    assert isinstance(healthy, DockerFacts)
    assert healthy.usable and healthy.version and healthy.data_root == "/var/lib/docker"
    assert healthy.remove == "docker rm -f" and "/var/run/docker.sock" in healthy.socket
    sudo = facts("docker_needs_sudo", WORKER).runtime
    assert isinstance(sudo, DockerFacts)
    assert not sudo.usable and sudo.sudo_ok and sudo.sudo_version == "20.10.24+dfsg1"
    assert "permission denied" in sudo.version
    running = facts("two_clusters_head").runtime
    assert running.holds_cluster("i15", running=True) and not running.holds_cluster("x")
    # no section of its own (another runtime's round): nothing usable, nothing held
    assert docker_doctor.parse({}) == DockerFacts(data_root="/var/lib/docker")


def test_check_docker_healthy_and_missing() -> None:
    found = by_check(check_docker(HEAD, facts("healthy_head")))
    assert {c: f.severity for c, f in found.items()} == {
        "docker.daemon": "ok",
        "docker.access": "ok",
    }
    missing = replace(
        facts("healthy_head"),
        runtime=DockerFacts(version="docker: command not found"),
    )
    (only,) = check_docker(HEAD, missing)
    assert (only.check, only.severity) == ("docker.daemon", "error")
    assert "docs.docker.com/engine/install" in only.fix


def test_check_docker_needs_sudo_names_the_group_and_a_stopped_daemon() -> None:
    found = by_check(check_docker(WORKER, facts("docker_needs_sudo", WORKER)))
    assert found["docker.daemon"].severity == "ok"
    access = found["docker.access"]
    assert access.severity == "error" and "(works with sudo)" in access.message
    assert access.fix.startswith(f"sudo usermod -aG docker lab on {WORKER.name}")
    assert "groups of lab: lab sudo" in access.evidence
    down = replace(
        facts("healthy_head"),
        runtime=DockerFacts(version="Cannot connect to the Docker daemon"),
    )
    (only,) = check_docker(HEAD, down)
    assert only.severity == "error" and "systemctl enable --now docker" in only.fix


def test_check_image_present_absent_and_of_another_architecture() -> None:
    held = facts("pair_lean_format")
    assert by_check(check_image(HEAD, held, PLAN))["image.present"].severity == "ok"
    absent = replace(held, runtime=replace(held.runtime, image=""))
    finding = by_check(check_image(HEAD, absent, PLAN))["image.present"]
    assert finding.severity == "warning" and "image push" in finding.fix
    arm = replace(held, runtime=replace(held.runtime, image=f"{PIN_ID} linux/arm64"))
    assert by_check(check_image(HEAD, arm, PLAN))["image.arch"].severity == "error"
    assert check_image(HEAD, held, replace(PLAN, pin=None)) == []


def test_the_judges_report_only_catalogued_checks() -> None:
    for name in ("healthy_head", "docker_needs_sudo", "pair_lean_format"):
        found = docker.JUDGES.node(HEAD, facts(name), PLAN)
        assert found and all(f.check in CATALOGUE for f in found)
    assert set(docker_doctor.CHECKS) <= set(CATALOGUE)
    assert set(podman_doctor.CHECKS) <= set(CATALOGUE)  # Podman's checks are catalogued too
    assert judges("docker") is docker.JUDGES and judges("podman") is podman.JUDGES


def test_shared_checks_name_the_runtime_it_is() -> None:
    no_sudo = replace(facts("healthy_head"), sudo="sudo: a password is required")
    podman_plan = replace(PLAN, runtime="podman", runtime_label="Podman")
    broken = replace(no_sudo, runtime=podman_doctor.PodmanFacts(podman="/usr/bin/podman"))
    (warned,) = check_sudo(HEAD, broken, podman_plan)
    assert warned.severity == "warning" and "repair Podman access" in warned.message
    assert "Docker" not in warned.message + warned.fix
    fine = replace(no_sudo, runtime=RuntimeFacts())  # host mode: nothing to repair
    host_plan = replace(PLAN, runtime="host", runtime_label=judges("host").label)
    (good,) = check_sudo(HEAD, fine, host_plan)
    assert good.severity == "ok" and "(host mode works without it)" in good.message
    # the runtime's data disk: its own root, named after it, with its thresholds
    root = "/home/lab/.local/share/containers/storage"
    f = facts("healthy_head")
    disks = (replace(f.disks[0], path=root, free_kb=1024), *f.disks[1:])
    podman_node = replace(f, disks=disks, runtime=podman_doctor.PodmanFacts(data_root=root))
    (low,) = [
        x
        for x in check_resources(HEAD, podman_node, podman_plan)
        if x.check == "resources.disk" and x.severity == "error"
    ]
    assert "Podman's data" in low.message and "Podman's unused images" in low.fix
    assert "Docker" not in low.message + low.fix
