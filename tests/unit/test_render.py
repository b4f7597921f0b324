from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from provisioner.cluster import render
from provisioner.errors import InputError
from provisioner.inventory import Node
from tests.unit.inventories import docker_runtime, make_inventory


@pytest.fixture
def inv(tmp_path: Path):  # type: ignore[no-untyped-def]
    return make_inventory(tmp_path)


def test_rendered_file_passes_rays_own_validation(inv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    text = render.render(inv, tmp_path / "auth_token", docker_runtime(inv, "sha256:" + "a" * 64))
    config = yaml.safe_load(text)
    prepared = render.validate(config, where="test")
    node_type = prepared["available_node_types"]["local.cluster.node"]
    assert node_type["min_workers"] == node_type["max_workers"] == 2
    assert config["provider"] == {
        "type": "local",
        "head_ip": "10.250.9.10",
        "worker_ips": ["10.250.9.11", "10.250.9.12"],
    }
    assert config["docker"]["pull_before_run"] is False
    assert config["docker"]["image"] == "sha256:" + "a" * 64
    assert config["auth"]["ssh_user"] == "lab"


def test_token_value_never_in_file_only_its_path(inv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    token = tmp_path / "auth_token"
    token.write_text("s3cr3t-token-value")
    text = render.render(inv, token, docker_runtime(inv, "img"))
    assert "s3cr3t-token-value" not in text
    config = yaml.safe_load(text)
    assert config["file_mounts"] == {"/run/provisioner/auth_token": str(token)}
    assert "-e RAY_AUTH_MODE=token" in config["docker"]["run_options"]
    assert "-e RAY_AUTH_TOKEN_PATH=/run/provisioner/auth_token" in config["docker"]["run_options"]


def test_start_commands_use_the_same_ports_as_up(inv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = yaml.safe_load(render.render(inv, tmp_path / "t", docker_runtime(inv, "img")))
    head = config["head_start_ray_commands"][-1]
    worker = config["worker_start_ray_commands"][-1]
    assert "--port=6379" in head and "--dashboard-host=127.0.0.1" in head
    assert "--node-ip-address=10.250.9.10" in head
    assert head.endswith("--autoscaling-config=~/ray_bootstrap_config.yaml")
    assert worker.startswith("ray start --address=10.250.9.10:6379 ")
    for flag in ("--node-manager-port=8077", "--object-manager-port=8076"):
        assert flag in head and flag in worker
    assert "--node-ip-address" not in worker


def test_workers_with_different_resources_are_refused(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    odd = Node("w9", "10.250.9.99", "worker", inv.head.ssh, {"GPU": 1.0})
    inv = type(inv)(inv.path, inv.cluster, inv.head, (*inv.workers, odd))
    with pytest.raises(InputError, match="differ in resources"):
        render.build_config(inv, tmp_path / "t", docker_runtime(inv, "img"))


def test_nodes_behind_a_jump_host_are_refused_not_dropped(tmp_path: Path) -> None:
    from dataclasses import replace

    from provisioner.inventory import Hop

    inv = make_inventory(tmp_path)
    hidden = replace(
        inv.workers[0],
        ssh=replace(inv.head.ssh, hops=(Hop("bastion", "10.250.9.1", "lab"),)),
    )
    inv = type(inv)(inv.path, inv.cluster, inv.head, (hidden, *inv.workers[1:]))
    with pytest.raises(InputError, match="jump host or ProxyCommand") as caught:
        render.build_config(inv, "img", tmp_path / "t")
    assert hidden.name in str(caught.value)


def test_a_ray_address_apart_from_ssh_is_refused_not_dropped(tmp_path: Path) -> None:
    from dataclasses import replace

    inv = make_inventory(tmp_path)
    apart = replace(inv.workers[0], data_address="10.99.0.11")
    inv = type(inv)(inv.path, inv.cluster, inv.head, (apart, *inv.workers[1:]))
    with pytest.raises(InputError, match="apart from the SSH address") as caught:
        render.build_config(inv, tmp_path / "t", docker_runtime(inv, "img"))
    assert apart.name in str(caught.value) and "provisioner up" in (caught.value.fix or "")


def test_ray_rejects_a_bad_config_as_input_error(inv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = render.build_config(inv, tmp_path / "t", docker_runtime(inv, "img"))
    config["docker"]["no_such_field"] = 1
    with pytest.raises(InputError, match="Ray rejects"):
        render.validate(config, where="x")


def test_head_starts_with_autoscaler_v1_and_a_fresh_launcher_state(inv, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = yaml.safe_load(render.render(inv, tmp_path / "auth_token", docker_runtime(inv, "img")))
    head = config["head_start_ray_commands"]
    start = next(c for c in head if "ray start --head" in c)
    # `ray up` exports RAY_enable_autoscaler_v2=1 before our command; ours must win.
    assert start.startswith("RAY_enable_autoscaler_v2=0 ray start --head ")
    forget = head.index("rm -f /tmp/ray/cluster-demo.state /tmp/ray/cluster-demo.lock")
    assert forget < head.index(start)
    assert not any("autoscaler_v2" in c for c in config["worker_start_ray_commands"])


def test_with_tls_every_node_gets_the_clusters_ca_and_a_certificate_naming_every_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`render`'s cluster.yaml runs Ray under TLS as `up` does: the launcher copies the
    TLS files to every node (docker: into the container, with the variables; host: the
    node folder, named in the start commands' environment); without TLS, neither."""
    import stat

    from cryptography import x509

    from provisioner.node import tls
    from provisioner.runtime import runtime_for

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path)
    folder = tls.render_files(inv)
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("ca.crt", "node.crt", "node.key"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    cert = x509.load_pem_x509_certificate((folder / "node.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} == {
        "10.250.9.10", "10.250.9.11", "10.250.9.12", "127.0.0.1"
    }  # fmt: skip
    ca = tls.load(tls.ca_path(inv))  # the cluster's own CA signed it
    assert cert.issuer == ca.cert.subject and (folder / "ca.crt").read_bytes() == ca.cert_pem()
    cert.verify_directly_issued_by(ca.cert)  # raises when it is not

    config = yaml.safe_load(render.render(inv, tmp_path / "t", docker_runtime(inv, "img"), folder))
    assert config["file_mounts"]["/run/provisioner/tls"] == str(folder)
    options = config["docker"]["run_options"]
    assert "-e RAY_USE_TLS=1" in options
    assert "-e RAY_TLS_CA_CERT=/run/provisioner/tls/ca.crt" in options
    plain = yaml.safe_load(render.render(inv, tmp_path / "t", docker_runtime(inv, "img")))
    assert "/run/provisioner/tls" not in plain["file_mounts"]  # positive control: off
    assert not any("RAY_USE_TLS" in o for o in plain["docker"]["run_options"])

    host_inv = make_inventory(tmp_path, runtime="host")
    config = yaml.safe_load(render.render(host_inv, tmp_path / "t", runtime_for(host_inv), folder))
    assert config["file_mounts"]["~/.provisioner/clusters/demo/tls"] == str(folder)
    for start in (config["head_start_ray_commands"][-1], config["worker_start_ray_commands"][-1]):
        assert (
            'RAY_USE_TLS=1 RAY_TLS_SERVER_CERT="$HOME"/.provisioner/clusters/demo/tls/node.crt'
            in (start)
        )


def test_the_pinned_image_goes_by_the_cluster_tag_checked_by_its_layers_on_each_node(
    inv,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Ray's launcher names one image for all nodes, and Docker's containerd image store
    does not know the pin by its ID: the file names the cluster tag, and each node first
    checks that the tag is the pin by its layers (run here against a stand-in docker)."""
    import subprocess

    from provisioner.image.pin import CLUSTER_TAG, Pin, Versions
    from provisioner.runtime.docker.runtime import DockerRuntime

    layers = ("sha256:" + "1" * 64, "sha256:" + "2" * 64)
    pin = Pin(
        image_id="sha256:" + "9" * 64,
        layers=layers,
        base_image="base",
        base_image_id="sha256:" + "3" * 64,
        requirements_sha256="4" * 64,
        versions=Versions(python="3.11", ray="2.60.0", torch="2.13.0", gymnasium="1.0"),
        size=1 << 20,
    )
    config = yaml.safe_load(render.render(inv, tmp_path / "auth_token", DockerRuntime(inv, pin)))
    assert config["docker"]["image"] == CLUSTER_TAG
    check = config["initialization_commands"][-1]

    def on_node(tag_layers: str | None) -> subprocess.CompletedProcess[str]:
        bin_ = tmp_path / "bin"
        bin_.mkdir(exist_ok=True)
        answer = f"echo '{tag_layers}'" if tag_layers is not None else "exit 1"
        (bin_ / "docker").write_text(f'#!/bin/sh\n[ "$5" = "{CLUSTER_TAG}" ] || exit 3\n{answer}\n')
        (bin_ / "docker").chmod(0o755)
        env = {"PATH": f"{bin_}:/usr/bin:/bin"}
        return subprocess.run(["bash", "-c", check], env=env, capture_output=True, text=True)

    assert on_node(" ".join(layers) + " ").returncode == 0  # the pin: both stores say this
    for wrong in (layers[0] + " ", " ".join(reversed(layers)) + " ", None):  # other, or no tag
        done = on_node(wrong)
        assert done.returncode == 1 and "not the pinned image" in done.stderr
        assert "image push" in done.stderr
