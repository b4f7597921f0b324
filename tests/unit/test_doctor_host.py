"""The doctor's host-mode judges, against facts.sh output captured on host-mode lab nodes
(`lab up --runtime host`): golden/doctor/host_*.txt.

host_head, host_worker: a clean node (Ray 2.60 in ~/ray-venv, on the login PATH only);
host_other_ray: that virtualenv with Ray 2.59.0 installed over it (pip, --no-deps);
host_trixie: a trixie node (Debian 13, Python 3.13.5) of a lab also holding bookworm
nodes (`lab up --runtime host --flavours ...`): the same Ray, with Debian's torch 2.6;
host_running_head: the head of lab `lead-host` while this cluster (`lead-host`) ran on it in
host mode (Ray's temp dir the short link /tmp/prov-lead-host).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from provisioner.checks.facts import NodeFacts, parse_facts
from provisioner.checks.findings import Finding, error
from provisioner.checks.intent import PinFacts, Plan
from provisioner.doctor import CATALOGUE
from provisioner.doctor.run import explained_by_own_ray, node_findings
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.runtime import judges
from provisioner.runtime.docker.doctor import parse as docker_parse
from provisioner.runtime.docker.runtime import CAPS as DOCKER_CAPS
from provisioner.runtime.host import doctor as host_doctor
from provisioner.runtime.host import runtime as host
from provisioner.runtime.host.runtime import CAPS as HOST_CAPS

GOLDEN = Path(__file__).parent / "golden" / "doctor"
SSH = SSHSettings(user="lab")
HEAD = Node("provisioner-e2e12h-0", "10.250.113.10", "head", SSH)
W1 = Node("provisioner-e2e12h-1", "10.250.113.11", "worker", SSH)
W2 = Node("provisioner-e2e12h-2", "10.250.113.12", "worker", SSH)
RUNNING_HEAD = Node("provisioner-lead-host-0", "10.250.131.10", "head", SSH)
PLAN = Plan(ports=RayPorts(), head=HEAD.name, runtime="host", control_ray="2.60.0", caps=HOST_CAPS)


def facts(name: str, node: Node) -> NodeFacts:
    return parse_facts(node.name, (GOLDEN / f"{name}.txt").read_text())


def bad(findings: list[Finding]) -> set[tuple[str, str, str]]:
    return {(f.check, f.severity, f.host) for f in findings if f.severity != "ok"}


def test_the_login_shells_ray_is_parsed_with_its_interpreter_and_stack() -> None:
    shell = facts("host_head", HEAD).login
    assert shell.ray == "/home/lab/ray-venv/bin/ray"
    assert shell.ray_interpreter == "/home/lab/ray-venv/bin/python"
    assert (shell.ray_version, shell.ray_python) == ("2.60.0", "3.11.2")
    assert shell.ray_stack is not None and shell.ray_stack.startswith("rllib=2.60.0 torch=")
    assert facts("host_head", HEAD).plain.ray is None  # login PATH only


def test_clean_host_nodes_have_no_errors_and_no_docker_checks() -> None:
    for name, node in (("host_head", HEAD), ("host_worker", W1)):
        found = node_findings(node, facts(name, node), PLAN, judges(PLAN.runtime))
        assert not [f for f in found if f.severity == "error"], found
        assert not any(f.check.startswith(("docker.", "image.")) for f in found)
        assert all(f.check in CATALOGUE for f in found)
        (python,) = [f for f in found if f.check == "ray.python"]
        assert python.severity == "ok" and "/home/lab/ray-venv/bin/python" in python.message
        (shell,) = [f for f in found if f.check == "shell.env"]
        assert shell.severity == "warning" and "login shell" in shell.message


def test_dockers_disk_does_not_matter_in_host_mode() -> None:
    # host mode has no facts section of its own: no runtime root, so no disk is judged as
    # a runtime's images (its round asks df for /tmp and $HOME only)
    full = facts("host_head", HEAD)
    assert full.runtime.data_root == ""
    host_disk = [
        f
        for f in node_findings(HEAD, full, PLAN, judges(PLAN.runtime))
        if f.check == "resources.disk"
    ]
    assert not any("Docker" in f.message for f in host_disk)
    # the same node as the docker runtime parses it: Docker's root, with its thresholds
    as_docker = parse_facts(HEAD.name, (GOLDEN / "host_head.txt").read_text(), runtime=docker_parse)
    root = as_docker.runtime.data_root
    disks = tuple(replace(d, free_kb=1024) if d.path == root else d for d in as_docker.disks)
    assert any(d.path == root for d in disks)
    low = replace(as_docker, disks=disks)
    docker = replace(PLAN, runtime="docker", caps=DOCKER_CAPS, runtime_label="Docker")
    (bad_disk,) = [
        f
        for f in node_findings(HEAD, low, docker, judges(docker.runtime))
        if f.check == "resources.disk" and root in f.message
    ]
    assert bad_disk.severity == "error" and "Docker's data" in bad_disk.message


def test_another_ray_on_one_node_is_an_error_naming_both_versions() -> None:
    all_facts = {
        HEAD.name: facts("host_head", HEAD),
        W1.name: facts("host_worker", W1),
        W2.name: facts("host_other_ray", W2),
    }
    found = judges("host").cluster(all_facts, PLAN)
    assert bad(found) == {
        ("ray.version", "error", W2.name),
        ("rllib.version", "error", W2.name),
    }
    (ray,) = [f for f in found if f.check == "ray.version" and f.severity == "error"]
    assert "2.59.0" in ray.message and "2.60.0" in ray.message
    assert "/home/lab/ray-venv/bin/python" in ray.message and "2.60.0" in ray.fix


def test_a_node_of_another_python_is_named_with_both_versions_and_the_fix() -> None:
    all_facts = {
        HEAD.name: facts("host_head", HEAD),
        W1.name: facts("host_worker", W1),
        W2.name: facts("host_trixie", W2),
    }
    found = judges("host").cluster(all_facts, PLAN)
    # the same Ray 2.60.0 everywhere; Python 3.13 on W2, and its stack with another torch
    assert bad(found) == {
        ("python.version", "error", W2.name),
        ("rllib.version", "error", W2.name),
    }
    pythons = {f.host: f for f in found if f.check == "python.version"}
    assert {h for h, f in pythons.items() if f.severity == "ok"} == {HEAD.name, W1.name}
    odd = pythons[W2.name]
    assert "Python 3.13.5 here" in odd.message and "3.11.2 on the head" in odd.message
    assert "3.13.5" in odd.evidence and "3.11.2" in odd.evidence
    assert "Python 3.11" in odd.fix and "'ray[default,rllib]==2.60.0'" in odd.fix
    assert "every node Python 3.13" in odd.fix


def test_the_control_machines_ray_must_match_the_clusters() -> None:
    all_facts = {HEAD.name: facts("host_head", HEAD), W1.name: facts("host_worker", W1)}
    older = replace(PLAN, control_ray="2.59.0")
    (control,) = [f for f in judges("host").cluster(all_facts, older) if f.check == "ray.control"]
    assert control.severity == "error" and control.host == "local"
    assert "2.59.0" in control.message and "2.60.0" in control.message
    (same,) = [f for f in judges("host").cluster(all_facts, PLAN) if f.check == "ray.control"]
    assert same.severity == "ok"


def test_a_named_interpreter_that_is_missing_is_an_error() -> None:
    plan = replace(PLAN, ray_python="/opt/nowhere/bin/python")
    found = host_doctor.check_host_python(HEAD, facts("host_head", HEAD), plan)
    assert bad(found) == {("ray.python", "error", HEAD.name)}
    assert "/opt/nowhere/bin/python" in found[0].message


def test_no_ray_at_all_is_an_error_with_the_fix() -> None:
    bare = replace(facts("host_head", HEAD), login=facts("host_head", HEAD).plain)
    (finding,) = host_doctor.check_host_python(HEAD, bare, PLAN)
    assert finding.severity == "error" and "ray: {python: PATH}" in finding.fix


def test_this_clusters_running_ray_is_waived_on_its_node_only() -> None:
    running = facts("host_running_head", RUNNING_HEAD)
    assert host.own_ray(running, "lead-host") and not host.own_ray(running, "other")
    assert not host.own_ray(running, "lead")  # a name that is a prefix of this one
    busy = [error("ports.free", HEAD.name, "port 6379 (gcs) is in use by gcs_server")]
    assert [
        f.severity for f in explained_by_own_ray(busy, running, "lead-host", judges("host"))
    ] == ["warning"]
    assert [f.severity for f in explained_by_own_ray(busy, running, "other", judges("host"))] == [
        "error"
    ]


def test_a_nodes_ray_version_reaches_a_suggested_pip_install_quoted_or_not_at_all() -> None:
    hostile = '2.59.0" && curl x | sh && echo "'
    text = (GOLDEN / "host_head.txt").read_text().replace("ray_version=2.60.0", "ray_version=")
    for version, expected in (
        ("2.59.0", "pip install 'ray[default]==2.59.0' here"),
        (hostile, "pip install 'ray[default]' (of the version the head runs) here"),
    ):
        head = parse_facts(HEAD.name, text.replace("ray_version=", f"ray_version={version}"))
        assert head.login.ray_version == version  # the node said it, as it was
        found = judges("host").cluster({HEAD.name: head}, PLAN)
        (control,) = [f for f in found if f.check == "ray.control"]
        assert control.severity == "error" and expected in control.fix, control.fix
        assert "curl" not in control.fix
    assert host_doctor.pip_requirement("rllib", "2.60.0rc1") == "'ray[rllib]==2.60.0rc1'"
    assert host_doctor.pip_requirement("rllib", "2.60.0; rm -rf ~").startswith("'ray[rllib]' ")


# host_project_head, host_project_worker: host_head and host_worker with the login Ray's
# stack line as facts.sh's stack snippet prints it now (`|` then every distribution),
# run with /opt/ray/bin/python in the images of examples/gridcells' project pin (shapely
# 2.2.0, gridcells 0.1.0) and of the base pin (neither).
PROJECT = (("shapely", "2.2.0"), ("gridcells", "0.1.0"))
PROJECT_PIN = PinFacts("sha256:" + "1" * 64, "3.11.2", "2.60.0", project=PROJECT)


def test_the_stack_line_gives_every_distribution_and_keeps_the_stack() -> None:
    shell = facts("host_project_head", HEAD).login
    assert shell.ray_stack == "rllib=2.60.0 torch=2.13.0+cpu gymnasium=1.2.2"
    assert shell.ray_dists is not None
    assert (shell.ray_dists["shapely"], shell.ray_dists["gridcells"]) == ("2.2.0", "0.1.0")
    assert shell.ray_dists["ray"] == "2.60.0" and shell.ray_dists["jinja2"] == "3.1.6"
    assert facts("host_head", HEAD).login.ray_dists is None  # an older line: not told


def test_the_project_pins_packages_on_every_node_pass() -> None:
    plan = replace(PLAN, pin=PROJECT_PIN)
    both = {HEAD.name: facts("host_project_head", HEAD), W1.name: facts("host_project_head", W1)}
    found = [f for f in host.check_host_versions(both, plan) if f.check == "project.packages"]
    assert [(f.host, f.severity) for f in found] == [(HEAD.name, "ok"), (W1.name, "ok")]
    assert "shapely 2.2.0, gridcells 0.1.0" in found[0].message


def test_a_node_without_the_project_packages_is_an_error_with_the_pip_fix() -> None:
    plan = replace(PLAN, pin=PROJECT_PIN)
    both = {HEAD.name: facts("host_project_head", HEAD), W1.name: facts("host_project_worker", W1)}
    found = host.check_host_versions(both, plan)
    assert ("project.packages", "error", W1.name) in bad(found)
    assert ("project.packages", "error", HEAD.name) not in bad(found)  # the positive control
    (err,) = [f for f in found if f.check == "project.packages" and f.severity == "error"]
    assert "shapely missing (the pin: 2.2.0); gridcells missing (the pin: 0.1.0)" in err.message
    assert err.fix.startswith(
        f"on {W1.name}: /home/lab/ray-venv/bin/python -m pip install shapely==2.2.0 "
        "gridcells==0.1.0"
    )
    assert f"{HEAD.name}: shapely 2.2.0, gridcells 0.1.0" in err.evidence


def test_another_version_on_a_node_names_both_and_a_base_pin_checks_nothing() -> None:
    other = facts("host_project_head", W1)
    dists = {**(other.login.ray_dists or {}), "shapely": "2.1.2"}
    other = replace(other, login=replace(other.login, ray_dists=dists))
    both = {HEAD.name: facts("host_project_head", HEAD), W1.name: other}
    found = host.check_host_versions(both, replace(PLAN, pin=PROJECT_PIN))
    (err,) = [f for f in found if f.check == "project.packages" and f.severity == "error"]
    assert err.host == W1.name and "shapely 2.1.2 (the pin: 2.2.0)" in err.message
    assert "pip install shapely==2.2.0" in err.fix and "gridcells" not in err.fix
    base = replace(PROJECT_PIN, project=())
    assert not [
        f
        for f in host.check_host_versions(both, replace(PLAN, pin=base))
        if f.check == "project.packages"
    ]


def test_facts_sh_stack_snippet_gives_this_pythons_distributions() -> None:
    """The stack snippet of facts.sh itself, run by this machine's Python: its line parses
    to the stack and to every distribution, at the versions importlib.metadata gives."""
    import importlib.metadata
    import re
    import subprocess
    import sys

    from provisioner.checks.facts import parse_shell

    text = (Path(host_doctor.__file__).parents[2] / "doctor" / "facts.sh").read_text()
    m = re.search(r"kind\" = stack \].*?v=\$\(\"\$file\" -c '(.*?)' 2>/dev/null\)", text, re.S)
    assert m is not None
    line = subprocess.run(
        [sys.executable, "-c", m[1]], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    shell = parse_shell(f"%%ray_stack={line}\n")
    assert shell.ray_stack is not None and shell.ray_stack.startswith("rllib=")
    assert shell.ray_dists is not None
    assert shell.ray_dists["packaging"] == importlib.metadata.version("packaging")
    assert shell.ray_dists["provisioner"] == importlib.metadata.version("provisioner")
