"""The cluster's CA and the nodes' certificates (provisioner.node.tls), and how the
runtimes hand them to Ray."""

from __future__ import annotations

import ipaddress
import os
import stat
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from provisioner.errors import InputError
from provisioner.node import tls
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.host import runtime as host
from tests.unit.inventories import make_inventory


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))


def _names(cert_pem: bytes) -> tuple[list[str], list[str]]:
    cert = x509.load_pem_x509_certificate(cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in san.get_values_for_type(x509.IPAddress)]
    return ips, san.get_values_for_type(x509.DNSName)


def test_a_node_certificate_is_signed_by_the_cluster_ca_for_its_address() -> None:
    ca = tls.new_authority("demo")
    cert_pem, key_pem = tls.issue(ca, "10.250.9.11")
    cert = x509.load_pem_x509_certificate(cert_pem)
    cert.verify_directly_issued_by(ca.cert)
    ips, dns = _names(cert_pem)
    assert ips == ["10.250.9.11", "127.0.0.1"]
    assert dns == ["10.250.9.11", "127.0.0.1", "localhost"]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert b"PRIVATE KEY" in key_pem
    other = tls.new_authority("other")
    with pytest.raises(Exception):  # noqa: B017 - any failure: another CA did not sign it
        cert.verify_directly_issued_by(other.cert)


def test_a_hostname_gets_a_dns_name_only() -> None:
    ips, dns = _names(tls.issue(tls.new_authority("demo"), "node-1.example")[0])
    assert ips == ["127.0.0.1"] and dns[0] == "node-1.example"
    assert ipaddress.ip_address(ips[0]).is_loopback


def test_the_ca_is_made_once_private_and_kept(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    first = tls.ensure_authority(inv)
    path = tls.ca_path(inv)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tls.ensure_authority(inv).fingerprint() == first.fingerprint()
    path.chmod(0o644)
    with pytest.raises(InputError, match="others can read its key"):
        tls.load(path)


def test_a_rotation_makes_a_new_ca_kept_until_it_finishes(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    current = tls.ensure_authority(inv)
    new = tls.begin_rotation(inv, fresh=True)
    assert new.fingerprint() != current.fingerprint()
    # an unfinished rotation keeps its CA; a fresh one makes another
    assert tls.begin_rotation(inv, fresh=False).fingerprint() == new.fingerprint()
    assert tls.load(tls.ca_path(inv)).fingerprint() == current.fingerprint()
    tls.finish_rotation(inv)
    assert tls.load(tls.ca_path(inv)).fingerprint() == new.fingerprint()
    assert not tls.next_ca_path(inv).exists()


def _install(home: Path, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["bash", "-c", tls.install_command("demo")],
        input=data,
        env={**os.environ, "HOME": str(home)},
        capture_output=True,
        check=False,
    )


def test_the_install_command_splits_the_bundle_into_private_files(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    ca = tls.new_authority("demo")
    data = tls.bundle(ca, inv.workers[0])
    assert _install(tmp_path, data).returncode == 0
    folder = tmp_path / ".provisioner" / "clusters" / "demo" / "tls"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["ca.crt", "node.crt", "node.key"]
    for f in folder.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert (folder / "ca.crt").read_bytes() == ca.cert_pem()
    node = x509.load_pem_x509_certificate((folder / "node.crt").read_bytes())
    node.verify_directly_issued_by(ca.cert)
    assert b"PRIVATE KEY" in (folder / "node.key").read_bytes()
    assert (folder / "ca.crt").read_bytes() + (folder / "node.crt").read_bytes() + (
        folder / "node.key"
    ).read_bytes() == data
    # a bundle that is not three PEMs changes nothing
    kept = (folder / "node.crt").read_bytes()
    assert _install(tmp_path, ca.cert_pem()).returncode != 0
    assert (folder / "node.crt").read_bytes() == kept


def test_docker_mounts_the_tls_folder_and_host_exports_it(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    run = docker.docker_run_command(inv, inv.workers[0], "img")
    assert (
        '--mount type=bind,source="$HOME"/.provisioner/clusters/demo/tls,'
        "target=/run/provisioner/tls,readonly" in run
    )
    assert "-e RAY_USE_TLS=1" in run and "-e RAY_TLS_CA_CERT=/run/provisioner/tls/ca.crt" in run
    start = host.start_command(inv, inv.workers[0], None)
    assert "RAY_USE_TLS=1" in start
    assert 'RAY_TLS_SERVER_KEY="$HOME"/.provisioner/clusters/demo/tls/node.key' in start
    probe = host.HostRuntime(inv).python_command("nodes")
    assert "RAY_TLS_SERVER_CERT=" in probe  # the probe's driver is a client of the GCS too


def test_tls_false_leaves_ray_in_clear(tmp_path: Path) -> None:
    from dataclasses import replace

    inv = replace(make_inventory(tmp_path), tls=False)
    assert "RAY_USE_TLS" not in docker.docker_run_command(inv, inv.head, "img")
    assert "RAY_USE_TLS" not in host.start_command(inv, inv.head, None)
    assert "RAY_USE_TLS" not in host.HostRuntime(inv).python_command("nodes")


def test_a_refused_handshake_in_ray_logs_is_named() -> None:
    from provisioner.cluster import logs

    # as the head's gcs_server.err showed it on the lab (a client without a certificate)
    line = (
        "E1202 14:19:35.296541718      37 ssl_transport_security.cc:1432]       Handshake "
        "failed with fatal error SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
        "PEER_DID_NOT_RETURN_A_CERTIFICATE."
    )
    assert {f.pattern for f in logs.triage_text(line)} == {"tls"}
    assert logs.triage_text("raylet started, listening on port 8077") == []
