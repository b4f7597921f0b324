"""The cluster's TLS: a certificate authority of its own, and a certificate per node.

Ray's gRPC channels (GCS, raylets, object managers, agents, drivers) run TLS when every
Ray process has `RAY_USE_TLS=1` and the paths `RAY_TLS_SERVER_CERT`, `RAY_TLS_SERVER_KEY`,
`RAY_TLS_CA_CERT`: each server then requires a client certificate signed by that CA, and
each client checks the server's certificate against the address it dialled. So traffic
between nodes is encrypted (the token crosses the network inside TLS only), and a process
without a certificate of this cluster's CA is refused at the handshake.

The CA's private key stays on this machine (`tls_ca.pem` in the cluster's state dir, 0600,
certificate and key in one file so that it is replaced in one step). Every `up` gives
each node a fresh key and a certificate whose names are the node's Ray address (plus
127.0.0.1 and localhost, which Ray's processes on the node dial each other by), on the
stdin of one SSH command, as the token travels; on the node they are 0600 files in a 0700
folder. `up --rotate-token` makes a new CA beside the old one (`tls_ca.next.pem`); it
becomes the cluster's once every node runs with its certificates.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provisioner.errors import InputError
from provisioner.inventory import Inventory, Node
from provisioner.inventory.address import address_problem
from provisioner.local import private_dir
from provisioner.node import layout

CA_FILE = "tls_ca.pem"
NEXT_CA_FILE = "tls_ca.next.pem"  # a rotation under way: the CA the nodes are being given
CA_DAYS = 3650
NODE_DAYS = 397  # every `up` issues the nodes' certificates again
_NODE_FILES = ("ca.crt", "node.crt", "node.key")  # the order of the PEMs an install sends

# Where Ray's processes find them: in the container, and the environment that names them.
CONTAINER_TLS_DIR = "/run/provisioner/tls"


@dataclass(frozen=True)
class Authority:
    """The cluster's CA: its certificate and its private key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def fingerprint(self) -> str:
        return "sha256:" + self.cert.fingerprint(hashes.SHA256()).hex()[:16]


def ca_path(inventory: Inventory) -> Path:
    """Where this machine keeps the cluster's CA (inside the inventory's state dir)."""
    return Path(inventory.state_dir) / CA_FILE


def next_ca_path(inventory: Inventory) -> Path:
    return Path(inventory.state_dir) / NEXT_CA_FILE


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def new_authority(cluster: str) -> Authority:
    """A new CA for `cluster` (P-256, self-signed, for signing node certificates only)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    name = _name(f"provisioner cluster {cluster} CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Authority(cert, key)


def subject_names(address: str) -> list[x509.GeneralName]:
    """The names a node's certificate holds: its Ray address (an IP as an IP name and as
    text, which gRPC's check of a dialled IP accepts either way; a hostname as a DNS name),
    and the loopback names Ray's processes on the node dial each other by."""
    why = address_problem(address)  # only a checked address names a node (address.py)
    if why:
        raise InputError(
            f"refused to issue a node certificate: {why}",
            "give the node an IP address or a DNS name in the inventory",
        )
    names: list[x509.GeneralName] = []
    with contextlib.suppress(ValueError):  # not an IP: a hostname
        names.append(x509.IPAddress(ipaddress.ip_address(address)))
    names.append(x509.DNSName(address))
    if address != "127.0.0.1":
        names += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("127.0.0.1")]
    if address != "localhost":
        names.append(x509.DNSName("localhost"))
    return names


def issue(ca: Authority, address: str, *more: str) -> tuple[bytes, bytes]:
    """A new key and a certificate for the node at `address` (and at the `more`
    addresses: one certificate for several nodes), signed by `ca`: (cert, key) as PEM.
    Both ends of a channel use it (Ray's servers and clients are the same processes), so
    it serves for server and client authentication."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    names: list[x509.GeneralName] = []
    for each in (address, *more):
        names += [n for n in subject_names(each) if n not in names]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(address))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=NODE_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _write(path: Path, ca: Authority) -> None:
    """The CA at `path`, atomically (a temporary file, mode 0600, renamed)."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(ca.cert_pem() + _key_pem(ca.key))
    tmp.replace(path)


def load(path: Path) -> Authority:
    """The CA kept at `path`: private (0600), one certificate and its key."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise InputError(
            f"the cluster's CA file {path} has mode {mode:o}; others can read its key",
            f"chmod 600 {path}",
        )
    data = path.read_bytes()
    try:
        cert = x509.load_pem_x509_certificate(data)
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise InputError(
            f"the cluster's CA file {path} is not a certificate and its key ({exc})",
            f"remove {path}; then `provisioner up --rotate-token` makes a new CA",
        ) from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise InputError(
            f"the cluster's CA file {path} holds a key of another kind",
            f"remove {path}; then `provisioner up --rotate-token` makes a new CA",
        )
    return Authority(cert, key)


def ensure_authority(inventory: Inventory) -> Authority:
    """The cluster's CA, made now (and kept, 0600) if there is none."""
    path = ca_path(inventory)
    if path.exists():
        return load(path)
    ca = new_authority(inventory.cluster)
    _write(path, ca)
    return ca


def begin_rotation(inventory: Inventory, *, fresh: bool) -> Authority:
    """The new CA of a rotation: made now when `fresh` (a rotation that begins) or when
    there is none, else the one an unfinished rotation made (nodes given its certificates
    before a failure keep them)."""
    path = next_ca_path(inventory)
    if path.exists() and not fresh:
        return load(path)
    ca = new_authority(inventory.cluster)
    _write(path, ca)
    return ca


def finish_rotation(inventory: Inventory) -> None:
    """The new CA becomes the cluster's (every node was restarted with its certificates)."""
    path = next_ca_path(inventory)
    if path.exists():
        path.replace(ca_path(inventory))


def bundle(ca: Authority, node: Node) -> bytes:
    """What `install_command` reads on the node's stdin: the CA's certificate, the node's
    certificate and the node's key, as PEM, in that order."""
    cert, key = issue(ca, *node.addresses)
    return ca.cert_pem() + cert + key


RENDER_TLS_DIR = "render-tls"  # in the state folder: the files `render`'s cluster.yaml copies


def render_files(inventory: Inventory) -> Path:
    """The TLS files of `render`'s cluster.yaml, made now in the state folder (a 0700
    folder, files 0600): the cluster CA's certificate, and one certificate and key naming
    every node's address. Ray's launcher copies the same files to every node (it has no
    per-node file), as the standalone sbatch script's one certificate does; so a node
    holds the key of every node's name, and a process without these files, or with
    another CA's, is refused as with `up`. Made again at every render."""
    ca = ensure_authority(inventory)
    folder = private_dir(Path(inventory.state_dir) / RENDER_TLS_DIR)
    first, *rest = dict.fromkeys(a for n in inventory.nodes for a in n.addresses)
    cert, key = issue(ca, first, *rest)
    for name, data in zip(_NODE_FILES, (ca.cert_pem(), cert, key), strict=True):
        path = folder / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.replace(path)
    return folder


def install_command(cluster: str) -> str:
    """Shell: split the PEMs on stdin into the node's TLS folder (0700; files 0600, each
    replaced by `mv`), refusing input that is not exactly three PEM blocks."""
    directory = layout.node_tls_dir(cluster)
    names = " ".join(f"{n}.new" for n in _NODE_FILES)
    split = (
        "awk 'BEGIN { split(\"" + names + '", f, " ") } '
        "/^-----BEGIN / { n++ } n >= 1 && n <= 3 { print > f[n] } END { exit n != 3 }'"
    )
    moves = " && ".join(f"mv -f {n}.new {n}" for n in _NODE_FILES)
    return (
        f"umask 077 && mkdir -p {directory} && chmod 700 {directory} && cd {directory} && "
        f"rm -f {names} && {split} && {moves}"
    )


def ray_env(directory: str) -> dict[str, str]:
    """The variables that turn Ray's TLS on, with the node's files in `directory` (the
    container's mount, or the node folder as a shell word)."""
    return {
        "RAY_USE_TLS": "1",
        "RAY_TLS_SERVER_CERT": f"{directory}/node.crt",
        "RAY_TLS_SERVER_KEY": f"{directory}/node.key",
        "RAY_TLS_CA_CERT": f"{directory}/ca.crt",
    }
