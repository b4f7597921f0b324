"""Each check's judging, against facts.sh output captured from real lab nodes.

The golden files in golden/doctor/ are facts.sh's raw output on a lab node, healthy or
with one lab fault injected, captured by `make goldens` (scripts/capture_goldens.py);
golden/doctor/nodes.json names the lab's nodes they were captured on.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from provisioner.checks.cluster_checks import check_clock
from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.findings import Finding, ordered
from provisioner.checks.intent import PinFacts, Plan
from provisioner.doctor import CATALOGUE
from provisioner.doctor.run import node_findings
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.runtime import judges
from provisioner.runtime.container_checks import check_versions
from provisioner.runtime.docker.doctor import parse as docker_parse
from provisioner.runtime.docker.runtime import CAPS as DOCKER_CAPS
from provisioner.runtime.host.runtime import CAPS as HOST_CAPS

GOLDEN = Path(__file__).parent / "golden" / "doctor"
SSH = SSHSettings(user="lab")
HEAD, WORKER1, WORKER2 = (
    Node(n["name"], n["address"], n["role"], SSH)
    for n in json.loads((GOLDEN / "nodes.json").read_text())["nodes"]
)
PLAN = Plan(ports=RayPorts(), head=HEAD.name, caps=DOCKER_CAPS)


def facts(name: str, node: Node) -> NodeFacts:
    return parse_facts(node.name, (GOLDEN / f"{name}.txt").read_text(), runtime=docker_parse)


def judged(name: str, node: Node, plan: Plan = PLAN) -> list[Finding]:
    return node_findings(node, facts(name, node), plan, judges(plan.runtime))


def problems(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.check, f.severity) for f in findings if f.severity != "ok"}


def test_parse_healthy_head() -> None:
    f = facts("healthy_head", HEAD)
    assert f.complete and f.user == "lab" and "docker" in f.groups
    assert f.addresses and HEAD.address in f.addresses
    assert f.route_source == HEAD.address
    assert f.runtime.usable and f.plain.python3_version and f.plain.ray is None
    assert f.cpus >= 1 and f.mem_total_kb > 0 and f.shm_kb is not None
    assert any(listener.port == 22 and listener.process == "sshd" for listener in f.listening)


@pytest.mark.parametrize(("name", "node"), [("healthy_head", HEAD), ("healthy_worker", WORKER1)])
def test_healthy_nodes_have_no_errors(name: str, node: Node) -> None:
    findings = judged(name, node)
    assert not [f for f in findings if f.severity == "error"]
    assert all(f.check in CATALOGUE for f in findings)


def test_busy_port_names_process() -> None:
    (finding,) = [f for f in judged("port_6379_busy", HEAD) if f.severity == "error"]
    assert finding.check == "ports.free"
    assert "6379" in finding.message and "python3" in finding.message
    assert "ray.ports.gcs" in finding.fix


def test_busy_gcs_port_does_not_matter_on_a_worker() -> None:
    findings = judged("port_6379_busy", WORKER1)  # 6379 is only the head's
    assert ("ports.free", "error") not in problems(findings)


def test_docker_needs_sudo() -> None:
    findings = judged("docker_needs_sudo", WORKER1)
    assert problems(findings) >= {("docker.access", "error")}
    (finding,) = [f for f in findings if f.check == "docker.access"]
    assert "sudo usermod -aG docker lab" in finding.fix
    assert "works with sudo" in finding.message


def test_ray_login_only_is_a_warning_in_both_runtimes() -> None:
    # docker: Ray runs in the image, only commands on the host are affected;
    # host: provisioner runs Ray through a login shell (as Ray's launcher does).
    (finding,) = [f for f in judged("ray_login_only", WORKER1) if f.check == "shell.env"]
    assert finding.severity == "warning" and "command not found" in finding.message
    assert "/opt/provisioner-fault-ray/bin" in finding.fix
    host = Plan(ports=RayPorts(), head=HEAD.name, runtime="host", caps=HOST_CAPS)
    (finding,) = [f for f in judged("ray_login_only", WORKER1, host) if f.check == "shell.env"]
    assert finding.severity == "warning" and "through a login shell" in finding.message


def test_python_version_skew_blames_the_odd_node() -> None:
    all_facts = {
        HEAD.name: facts("healthy_head", HEAD),
        WORKER1.name: facts("healthy_worker", WORKER1),
        WORKER2.name: facts("python_3_10", WORKER2),
    }
    findings = check_versions(all_facts, PLAN)
    bad = [f for f in findings if f.severity != "ok"]
    assert [(f.check, f.host) for f in bad] == [("python.version", WORKER2.name)]
    assert "3.10.12" in bad[0].message


def test_hostname_on_loopback_is_a_warning() -> None:
    findings = judged("hostname_loopback", WORKER2)
    (finding,) = [f for f in findings if f.check == "net.hostname"]
    assert finding.severity == "warning" and "127.0.1.1" in finding.message
    assert WORKER2.address in finding.fix


def test_stale_raylet() -> None:
    (finding,) = [f for f in judged("stale_raylet", HEAD) if f.check == "ray.stale"]
    assert finding.severity == "error" and "raylet" in finding.evidence


def test_address_not_on_node() -> None:
    elsewhere = Node(HEAD.name, "192.0.2.99", "head", SSH)
    (finding,) = [f for f in judged("healthy_head", elsewhere) if f.check == "net.address"]
    assert finding.severity == "warning" and "NAT" in finding.message


def test_pinned_image_missing_and_arch() -> None:
    pin = PinFacts("sha256:" + "1" * 64, "3.11.2", "2.60.0", arch="arm64")
    plan = Plan(ports=RayPorts(), head=HEAD.name, pin=pin, caps=DOCKER_CAPS)
    findings = judged("healthy_head", HEAD, plan)
    assert ("image.present", "warning") in problems(findings)
    assert ("image.arch", "error") in problems(findings)


def test_shm_larger_than_memory_is_an_error() -> None:
    plan = Plan(ports=RayPorts(), head=HEAD.name, shm_size=10**15, caps=DOCKER_CAPS)
    assert ("resources.shm", "error") in problems(judged("healthy_head", HEAD, plan))


def test_clock_offset() -> None:
    f = facts("healthy_head", HEAD)
    assert f.clock is not None
    f.sent_at, f.received_at, f.clock_uncertainty = f.clock - 30.05, f.clock - 29.95, 0.05
    (finding,) = check_clock(f)
    assert finding.severity == "warning" and "ahead" in finding.message
    f.sent_at, f.received_at = f.clock - 0.1, f.clock + 0.1
    assert check_clock(f)[0].severity == "ok"


def test_truncated_output_is_reported() -> None:
    text = (GOLDEN / "healthy_head.txt").read_text().split("@@listening")[0]
    findings = node_findings(
        HEAD, parse_facts(HEAD.name, text, runtime=docker_parse), PLAN, judges(PLAN.runtime)
    )
    assert ("doctor.facts", "warning") in problems(findings)


def test_rsync_needed_only_for_ray_up() -> None:
    f = facts("healthy_head", HEAD)
    f.rsync = ""
    plain = node_findings(HEAD, f, PLAN, judges(PLAN.runtime))
    assert not [x for x in plain if x.check == "tools.rsync"]
    ray_up = node_findings(
        HEAD,
        f,
        Plan(ports=RayPorts(), head=HEAD.name, ray_up=True, caps=DOCKER_CAPS),
        judges(PLAN.runtime),
    )
    assert ("tools.rsync", "error") in problems(ray_up)


def test_ordered_groups_by_node_errors_first() -> None:
    findings = [
        Finding("a", "ok", "w", "m"),
        Finding("b", "error", "w", "m"),
        Finding("c", "warning", "h", "m"),
    ]
    assert [(f.host, f.severity) for f in ordered(findings, ["h", "w"])] == [
        ("h", "warning"),
        ("w", "error"),
        ("w", "ok"),
    ]


def test_docker_socket_output_parses_like_the_docker_cli_fallback() -> None:
    """One lab node, one moment, both ways facts.sh reads Docker: the socket from one
    python3, and the docker CLI (its fallback without python3, with DOCKER_HOST set, or
    when the socket refuses)."""
    node = HEAD
    old = facts("pair_cli_format", node)
    new = facts("pair_lean_format", node)
    moving = {"clock", "mem_available_kb", "disks"}
    for field in dataclasses.fields(NodeFacts):
        if field.name not in moving:
            assert getattr(new, field.name) == getattr(old, field.name), field.name
    assert [d.path for d in new.disks] == [d.path for d in old.disks]
    assert new.addresses == ("127.0.0.1", "172.17.0.1", node.address)
    assert new.hostname_addresses == (node.address,)
    assert next((x.port, x.process) for x in new.listening if x.port == 22) == (22, "sshd")
    assert new.runtime.usable and new.runtime.data_root == "/var/lib/docker"
    assert new.sudo == "ok"
    assert new.runtime.image.endswith("linux/amd64") and new.complete


def test_node_text_in_a_fix_is_quoted_for_pasting() -> None:
    import shlex

    from provisioner.checks.facts import Container
    from provisioner.checks.port_checks import check_stale_ray

    f = facts("ray_login_only", WORKER1)
    hostile_dir = "/opt/x $(touch /tmp/pwned)"
    f.login = dataclasses.replace(f.login, ray=f"{hostile_dir}/ray")
    (finding,) = [
        g for g in node_findings(WORKER1, f, PLAN, judges(PLAN.runtime)) if g.check == "shell.env"
    ]
    assert f"export PATH={shlex.quote(hostile_dir)}:" in finding.fix
    stale = facts("stale_raylet", HEAD)
    stale.runtime = dataclasses.replace(
        stale.runtime, containers=(Container("ray-x;rm -rf ~", "img", "running", ""),)
    )
    (finding,) = [g for g in check_stale_ray(HEAD, stale) if g.check == "ray.stale"]
    assert "docker rm -f 'ray-x;rm -rf ~'" in finding.fix
