"""Ray's traffic between nodes runs TLS with the cluster's own CA (`provisioner.node.tls`).

On the lab, after `up`: the head's GCS port answers a TLS handshake with a certificate of
the cluster's CA for the head's address, and speaks gRPC (HTTP/2) only to a client that
presents a certificate of that CA; a client with none, or with one of another CA, is
refused. The same probe against a plain port of Ray (the dashboard agent's HTTP port)
finds no TLS there, so the probe tells the two apart. A Ray driver on a worker node
connects to the GCS with the node's own files and fails with no TLS, with another CA's
certificate, or with another CA's certificate beside the cluster's CA. A raylet started on
a worker (a container of its own, the cluster's token, its own ports) joins with the
cluster's files and never appears alive with no TLS or with another CA's certificate
beside the cluster's CA. PPO then trains
with env runners on every node (the job's driver and workers inherit the node's TLS
settings), `up --rotate-token` gives every node certificates of a new CA (the old CA's are
refused), and `down` removes Ray. Host mode: the same handshake checks on its lab.
"""

from __future__ import annotations

import json
import shlex
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from provisioner.image.pin import read_pin
from provisioner.inventory import Inventory, RayPorts, load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from provisioner.node import layout, tls
from provisioner.node.token import ray_container
from tests.e2e.faults.lab import on_node, probe
from tests.e2e.faults.record import scenario
from tests.e2e.helpers import cli, cli_json

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@dataclass(frozen=True)
class Handshake:
    """What a TLS client saw at a port: the handshake, the peer's certificate checked
    against the CA it was given, and whether the server then spoke HTTP/2 (gRPC)."""

    tls: bool
    verified: bool
    issuer: str
    grpc: bool
    error: str


def handshake(
    address: str, port: int, ca: Path, cert: Path | None = None, key: Path | None = None
) -> Handshake:
    """A TLS client (ALPN h2) at ADDRESS:PORT trusting only `ca`, with `cert` if given; it
    sends HTTP/2's preface and reads the server's first frame (a SETTINGS frame: gRPC)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(ca))
    ctx.set_alpn_protocols(["h2"])
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    raw = socket.create_connection((address, port), timeout=10)
    shook = False
    issuer = ""
    try:
        with ctx.wrap_socket(raw, server_hostname=address) as s:
            shook = True
            peer = s.getpeercert() or {}
            issuer = ", ".join(f"{k}={v}" for part in peer.get("issuer", ()) for k, v in part)
            s.sendall(H2_PREFACE)
            first = s.recv(9)
            grpc = len(first) == 9 and first[3] == 0x04  # frame type SETTINGS
            return Handshake(True, True, issuer, grpc, "" if grpc else f"read {first!r}")
    except ssl.SSLCertVerificationError as exc:
        return Handshake(True, False, issuer, False, f"{exc.verify_message}")
    except (ssl.SSLError, OSError) as exc:
        return Handshake(shook, shook, issuer, False, f"{type(exc).__name__}: {exc}")


def client_files(tmp_path: Path, name: str, ca: tls.Authority, address: str) -> tuple[Path, Path]:
    """A certificate and key of `ca` for a client at `address`, as files."""
    cert, key = tls.issue(ca, address)
    (tmp_path / f"{name}.crt").write_bytes(cert)
    (tmp_path / f"{name}.key").write_bytes(key)
    return tmp_path / f"{name}.crt", tmp_path / f"{name}.key"


def check_gcs(inv: Inventory, tmp_path: Path) -> dict[str, Handshake]:
    """Every handshake of the module's docstring against the head's GCS port, and against
    the dashboard agent's plain HTTP port."""
    ca = tls.load(tls.ca_path(inv))
    ca_file = tmp_path / "cluster-ca.crt"
    ca_file.write_bytes(ca.cert_pem())
    other = tls.new_authority("someone-else")
    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(other.cert_pem())
    ours = client_files(tmp_path, "ours", ca, "127.0.0.1")
    theirs = client_files(tmp_path, "theirs", other, "127.0.0.1")
    head, gcs = inv.head.address, inv.ports.gcs
    return {
        "ours": handshake(head, gcs, ca_file, *ours),
        "none": handshake(head, gcs, ca_file),
        "other CA's cert": handshake(head, gcs, ca_file, *theirs),
        "trusting another CA": handshake(head, gcs, other_ca, *theirs),
        "plain port": handshake(head, inv.ports.dashboard_agent_http, ca_file, *ours),
    }


def assert_gcs_tls(inv: Inventory, seen: dict[str, Handshake]) -> None:
    ours = seen["ours"]
    assert ours.tls and ours.verified and ours.grpc, ours
    assert f"provisioner cluster {inv.cluster} CA" in ours.issuer, ours
    for name in ("none", "other CA's cert"):
        assert seen[name].tls and not seen[name].grpc, (name, seen[name])
    # the client that trusts another CA does not accept the GCS's certificate
    assert not seen["trusting another CA"].verified, seen["trusting another CA"]
    assert not seen["plain port"].tls, seen["plain port"]  # the control: no TLS there


def driver(node: LabNode, container: str, head: str, env: dict[str, str]) -> tuple[int, str]:
    """A Ray driver in the node's Ray container (its env, `env` over it) connecting to the
    GCS at `head`; prints CONNECTED and the node count when it got in."""
    script = (
        f"import ray; ray.init(address={head!r}, logging_level='ERROR'); "
        "print('CONNECTED', len(ray.nodes()))"
    )
    words = " ".join(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items())
    return probe(
        node,
        f"docker exec {words} {container} timeout 40 python -c {shlex.quote(script)} 2>&1 "
        "| tail -n 5",
    )


def foreign_files_on(node: LabNode, cluster: str, other: tls.Authority) -> str:
    """Another CA's certificate and a key for the node, in its Ray folder (mounted at
    /tmp/ray in the container); returns that folder inside the container."""
    cert, key = tls.issue(other, node.address)
    folder = f"/home/{node.user}/.provisioner/clusters/{cluster}/ray/foreign"
    files = {"ca.crt": other.cert_pem(), "node.crt": cert, "node.key": key}
    lines = [f"mkdir -p {folder}"]
    lines += [f"printf %s {shlex.quote(v.decode())} > {folder}/{k}" for k, v in files.items()]
    on_node(node, " && ".join(lines))
    return "/tmp/ray/foreign"


ALIVE = (
    "import json, ray; ray.init(address={head!r}, logging_level='ERROR'); "
    "print('ROGUES', json.dumps(sorted(k for n in ray.nodes() if n['Alive'] "
    "for k in n['Resources'] if k.startswith('rogue_'))))"
)


def alive_rogues(head: LabNode, container: str, address: str) -> set[str]:
    """The `rogue_*` resources of the nodes the GCS lists alive (asked from the head's Ray
    container, with its own files)."""
    rc, out = driver_script(head, container, ALIVE.format(head=address))
    found = [ln for ln in out.splitlines() if ln.startswith("ROGUES ")]
    assert rc == 0 and found, out
    return set(json.loads(found[-1].removeprefix("ROGUES ")))


def driver_script(node: LabNode, container: str, script: str) -> tuple[int, str]:
    return probe(
        node, f"docker exec {container} timeout 60 python -c {shlex.quote(script)} 2>&1 | tail -n 5"
    )


def rogue_command(
    name: str, image: str, head: str, node: LabNode, base: int, mounts: dict[str, str],
    env: dict[str, str],
) -> str:  # fmt: skip
    """`docker run` on NODE of a container of `image` whose `ray start` joins the GCS at
    HEAD as a worker raylet: its own ports (a block at `base`), no CPUs, a resource
    `rogue_NAME`, the cluster's token, and the given TLS files and settings (`mounts`:
    node path -> container path)."""
    ports = RayPorts.from_base(base)
    words = [
        "docker run -d", f"--name rogue-{name}", "--net=host", "--shm-size=256m",
        *(f"-v {src}:{dst}:ro" for src, dst in mounts.items()),
        *(f"-e {shlex.quote(f'{k}={v}')}" for k, v in env.items()),
        image, "ray start --block", f"--address={head}", f"--node-ip-address={node.address}",
        f"--node-manager-port={ports.node_manager}",
        f"--object-manager-port={ports.object_manager}",
        f"--dashboard-agent-grpc-port={ports.dashboard_agent_grpc}",
        f"--dashboard-agent-listen-port={ports.dashboard_agent_http}",
        f"--runtime-env-agent-port={ports.runtime_env_agent}",
        f"--metrics-export-port={ports.metrics_export}",
        f"--min-worker-port={ports.min_worker}", f"--max-worker-port={ports.max_worker}",
        "--num-cpus=0", "--object-store-memory=100000000", "--temp-dir=/tmp/rogue",
        "--disable-usage-stats", shlex.quote(f'--resources={{"rogue_{name}": 1}}'),
    ]  # fmt: skip
    return " ".join(words)


REFUSED = "Failed to connect to GCS"  # what a raylet's `ray start` logs when it cannot get in


def rogue_raylets(
    inv: Inventory, lab: LabInfo, worker: LabNode, image: str, head: str, *, other_folder: str
) -> dict[str, bool]:
    """Start three raylets on `worker`, each in a container of its own, that differ only
    in their TLS settings (each with the cluster's token): the cluster's own files, no
    TLS, and another CA's certificate beside the cluster's CA. Wait (bound: 180 s, not a
    target) until the one with the cluster's files is alive in the GCS and the others
    have logged that they could not reach the GCS, then say which are alive and which
    were refused; the raylets are removed in any case (the joined one with `ray stop` first,
    so that the GCS marks it dead)."""
    home = f"/home/{worker.user}/.provisioner/clusters/{inv.cluster}"
    token = {f"{home}/auth_token": layout.CONTAINER_TOKEN_PATH}
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": layout.CONTAINER_TOKEN_PATH}
    ours = {f"{home}/tls": tls.CONTAINER_TLS_DIR}
    foreign = "/run/foreign"
    variants = {
        "ours": (31000, {**token, **ours}, {**auth, **tls.ray_env(tls.CONTAINER_TLS_DIR)}),
        "notls": (32000, token, {**auth, "RAY_USE_TLS": "0"}),
        "otherca": (
            33000,
            {**token, **ours, f"{home}/ray/{other_folder.rsplit('/', 1)[-1]}": foreign},
            {**auth, **tls.ray_env(foreign), "RAY_TLS_CA_CERT": f"{tls.CONTAINER_TLS_DIR}/ca.crt"},
        ),
    }
    names = " ".join(f"rogue-{n}" for n in variants)
    head_node = lab.nodes[0]
    container = ray_container(inv)
    on_node(worker, f"docker rm -f {names} >/dev/null 2>&1; true")
    try:
        for name, (base, mounts, env) in variants.items():
            on_node(worker, rogue_command(name, image, head, worker, base, mounts, env))
        seen: set[str] = set()
        end = time.monotonic() + 180
        while "rogue_ours" not in seen and time.monotonic() < end:
            time.sleep(3)
            seen = alive_rogues(head_node, container, head)
        # the others: until each says the GCS did not let it in (bound: 120 s, not a target)
        logs: dict[str, str] = {}
        end = time.monotonic() + 120
        while time.monotonic() < end:
            logs = {n: probe(worker, f"docker logs rogue-{n} 2>&1")[1] for n in variants}
            if all(REFUSED in logs[n] for n in variants if n != "ours"):
                break
            time.sleep(3)
        states = on_node(worker, f"docker inspect -f '{{{{.Name}}}} {{{{.State.Status}}}}' {names}")
        seen |= alive_rogues(head_node, container, head)  # once more, after that
    finally:
        probe(worker, "docker exec rogue-ours ray stop >/dev/null 2>&1; true")
        on_node(worker, f"docker rm -f {names} >/dev/null 2>&1; true")
    print("rogue raylets:", states.strip(), {n: v[-300:] for n, v in logs.items()})
    return {
        "ours": "rogue_ours" in seen,
        "no TLS": "rogue_notls" in seen,
        "another CA's cert, our CA": "rogue_otherca" in seen,
        "no TLS refused": REFUSED in logs.get("notls", ""),
        "another CA refused": REFUSED in logs.get("otherca", ""),
    }


def test_ray_traffic_runs_tls_with_the_cluster_ca(
    cluster_inventory: Path, lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    inventory = str(cluster_inventory)
    inv = load_inventory(cluster_inventory)
    pin = read_pin(image_pin).image_id
    with scenario(
        "Ray's traffic between nodes, on the wire",
        "TLS with the cluster's own CA: the GCS port speaks gRPC only to a client with a "
        "certificate of that CA; a client, driver or raylet with none, or with another "
        "CA's, is refused (the raylet never appears alive; with the cluster's files it "
        "joins); `up --rotate-token` moves every node to a new CA",
        kind="security",
    ) as s:
        t0 = time.monotonic()
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        s.expect("alive", up["status"]["alive_nodes"], len(lab.nodes), str(up["status"]))
        seen = check_gcs(inv, tmp_path)
        assert_gcs_tls(inv, seen)
        s.saw(probes=sorted(seen))

        # A driver on a worker: the node's own files get in; no TLS, another CA's
        # certificate (with its CA, or beside the cluster's CA) do not.
        worker = lab.nodes[1]
        head = f"{inv.head.address}:{inv.ports.gcs}"
        other = tls.new_authority("someone-else")
        folder = foreign_files_on(worker, lab.name, other)
        container = ray_container(inv)
        own_rc, own_out = driver(worker, container, head, {})
        assert own_rc == 0 and f"CONNECTED {len(lab.nodes)}" in own_out, own_out
        s.saw(own=f"CONNECTED {len(lab.nodes)}")
        refused = {
            "no TLS": {"RAY_USE_TLS": "0"},
            "another CA": tls.ray_env(folder),
            "another CA's cert, our CA": {
                **tls.ray_env(folder),
                "RAY_TLS_CA_CERT": f"{tls.CONTAINER_TLS_DIR}/ca.crt",
            },
        }
        # side by side: a refused driver retries until `timeout` ends it
        with ThreadPoolExecutor(len(refused)) as pool:
            tries = {n: pool.submit(driver, worker, container, head, e) for n, e in refused.items()}
            for name, future in tries.items():
                rc, out = future.result()
                assert "CONNECTED" not in out, (name, rc, out)
        s.saw(drivers=list(refused))

        # A raylet joining from a worker: with the cluster's files it joins; with no TLS,
        # or another CA's certificate beside the cluster's CA, it never appears alive
        joined = rogue_raylets(inv, lab, worker, pin, head, other_folder=folder)
        assert joined["ours"], joined  # positive control: the cluster's files get in
        assert joined["no TLS refused"] and joined["another CA refused"], joined
        assert not joined["no TLS"] and not joined["another CA's cert, our CA"], joined
        s.saw(raylets=[f"{k}: {v}" for k, v in joined.items()])

        # PPO with an env runner on every node: the job's driver and workers have TLS too
        code, out, err = cli(
            "submit", "-i", inventory, "--results", str(tmp_path / "results"), "--json",
            str(PLAYBOOKS / "ppo_cartpole.py"), "--",
            "--env-runners", "5", "--train-batch", "300", "--max-iterations", "2",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = json.loads(out)
        s.expect("job", job["status"], "SUCCEEDED", str(job))
        runners = json.loads((tmp_path / "results" / job["job_id"] / "runners.json").read_text())
        assert {r["node_ip"] for r in runners} == {n.address for n in lab.nodes}, runners
        s.saw(runner_nodes=len({r["node_ip"] for r in runners}))

        # rotation: a new CA on every node; a client of the old CA is refused
        before = tls.load(tls.ca_path(inv))
        code, rotated, err = cli_json("up", "-i", inventory, "--rotate-token")
        assert code == 0 and rotated["token"]["rotated"], err[-3000:]
        after = tls.load(tls.ca_path(inv))
        s.expect("new_ca", after.fingerprint() != before.fingerprint(), True)
        assert not tls.next_ca_path(inv).exists()
        old_ca = tmp_path / "old-ca.crt"
        old_ca.write_bytes(before.cert_pem())
        old = client_files(tmp_path, "old", before, "127.0.0.1")
        gcs = inv.ports.gcs
        old_seen = handshake(inv.head.address, gcs, old_ca, *old)
        s.expect("old_verified", old_seen.verified, False, str(old_seen))
        s.expect("old_grpc", old_seen.grpc, False, str(old_seen))
        (tmp_path / "after").mkdir()
        new_seen = check_gcs(inv, tmp_path / "after")  # the new CA's certificate works
        assert_gcs_tls(inv, new_seen)
        s.saw(after=sorted(new_seen))
        s.observed = (
            "after `up` ({alive} nodes alive), TLS clients at the head's GCS port ({probes}): "
            "with a certificate of the cluster's CA, that CA's certificate for the head's "
            "address and an HTTP/2 SETTINGS frame; without a certificate, or with another "
            "CA's, closed at the handshake, nothing served; the dashboard agent's HTTP port "
            "(the control) without TLS; a driver on a worker with the node's files: "
            "{own}; refused (no CONNECTED): {drivers}; raylets started on a worker: {raylets}; "
            "PPO {job} with env runners on {runner_nodes} nodes; after `up --rotate-token` a "
            "new CA: {new_ca}, the old CA's certificate verified: {old_verified}, served gRPC: "
            "{old_grpc}; the same clients against the new CA: {after}"
        )
        s.measure(
            seconds=time.monotonic() - t0,
            refused=[
                f"{k}: {v.error[:60]}" for k, v in seen.items() if k in ("none", "other CA's cert")
            ],
        )
        s.measured = "{seconds:.0f} s in all; refused: {refused}"
    code, down, err = cli_json("down", "-i", inventory, "--no-logs")
    assert code == 0 and down["ok"], err[-3000:]


def test_host_mode_ray_runs_tls_too(host_lab: LabInfo, tmp_path: Path) -> None:
    inventory = str(host_lab.inventory)
    inv = load_inventory(host_lab.inventory)
    try:
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        assert up["runtime"] == "host" and up["totals"]["nodes"] == len(host_lab.nodes)
        assert_gcs_tls(inv, check_gcs(inv, tmp_path))
    finally:
        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
    assert code == 0 and down["ok"], err[-3000:]
