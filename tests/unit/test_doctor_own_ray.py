"""The doctor on a node that runs this cluster's own Ray: busy ports are that Ray."""

from __future__ import annotations

from dataclasses import replace

from provisioner.checks.facts import Container, NodeFacts, RuntimeFacts
from provisioner.checks.findings import Finding, error
from provisioner.doctor.run import explained_by_own_ray
from provisioner.runtime import judges

BUSY = [
    error("ports.free", "n0", "port 6379 (gcs) is in use by gcs_server", "", "stop it"),
    error("ray.stale", "n0", "a Ray is already running", "", "ray stop"),
    error("docker.access", "n0", "docker needs sudo", "", "usermod -aG docker"),
]


def facts(*containers: Container) -> NodeFacts:
    return replace(NodeFacts(host="n0"), runtime=RuntimeFacts(containers=containers))


def test_own_running_ray_turns_its_port_findings_into_warnings() -> None:
    out = explained_by_own_ray(
        BUSY, facts(Container("ray-demo", "sha256:x", "running", "demo")), "demo", judges("docker")
    )
    assert [(f.check, f.severity) for f in out] == [
        ("ports.free", "warning"),
        ("ray.stale", "warning"),
        ("docker.access", "error"),
    ]
    assert "this cluster's own Ray" in out[0].message and "provisioner down" in out[0].fix


def test_host_mode_own_ray_is_a_raylet_naming_this_clusters_temp_dir() -> None:
    short = "  913 raylet /v/raylet --raylet_socket_name=/tmp/prov-demo/session_x/sockets/raylet"
    own = replace(NodeFacts(host="n0"), ray_processes=(short,))
    assert [f.severity for f in explained_by_own_ray(BUSY, own, "demo", judges("host"))] == [
        "warning",
        "warning",
        "error",
    ]
    longer = replace(NodeFacts(host="n0"), ray_processes=(short.replace("-demo/", "-demo2/"),))
    assert [f.severity for f in explained_by_own_ray(BUSY, longer, "demo", judges("host"))] == [
        "error"
    ] * 3
    # a Ray an older provisioner started in the node directory itself is this cluster's too
    ours = (
        "  912 raylet /v/ray/core/src/ray/raylet/raylet "
        "--raylet_socket_name=/home/lab/.provisioner/clusters/demo/ray/session_x/sockets/raylet"
    )
    other = ours.replace("/clusters/demo/", "/clusters/other/")
    own = replace(NodeFacts(host="n0"), ray_processes=(ours,))
    out = explained_by_own_ray(BUSY, own, "demo", judges("host"))
    assert [f.severity for f in out] == ["warning", "warning", "error"]
    foreign = replace(NodeFacts(host="n0"), ray_processes=(other,))
    assert [f.severity for f in explained_by_own_ray(BUSY, foreign, "demo", judges("host"))] == [
        "error"
    ] * 3


def test_other_clusters_or_stopped_containers_stay_errors() -> None:
    for c in (
        Container("ray-other", "x", "running", "other"),
        Container("ray-demo", "x", "exited", "demo"),
    ):
        out: list[Finding] = explained_by_own_ray(BUSY, facts(c), "demo", judges("docker"))
        assert [f.severity for f in out] == ["error"] * 3
