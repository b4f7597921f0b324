"""The podman runtime on a lab of its own: rootless Podman for a login user who is in no
docker group, has no sudo, and has no Docker at all (`lab up --runtime podman`).

The inventory says `runtime: podman` and names the pin. The path is the user's: doctor,
up (the pin loaded into every node's Podman with `podman load` and checked by ID), PPO
with env runners on every node, status, logs, down; then no container and no Ray process
of the cluster is left. And the doctor's lingering finding, with its fix, on a node
without lingering (the others, with it, have none).

Issue 27 (7) under rootless Podman: the dashboard's socket is the SSH user's (the
container's root is that uid), so the owner alone proves nothing; the sockets of the
processes in this cluster's container (read from the node's /proc) hold it while it runs,
and the same user's own process outside the container, on that port, is refused.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.cluster.tunnel import listeners_command, parse_listeners_output, refusal
from provisioner.image.pin import read_pin, write_pin
from provisioner.inventory import load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.engine import client, exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.delivery import DeliveryReport
from provisioner.remote import Pool
from provisioner.runtime import runtime_for
from provisioner.runtime.podman.delivery import LoadOptions, deliver
from tests.e2e.faults.lab import edited_inventory
from tests.e2e.faults.record import scenario
from tests.e2e.helpers import RECORDER, cli, cli_json, ssh, tune_checkpoints_come_home

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
LINGER = "/var/lib/systemd/linger/lab"  # what `loginctl enable-linger lab` records


def as_root(node: LabNode, script: str) -> str:
    rc, out = exec_rc(node.container, script)
    assert rc == 0, f"{node.name}: {script!r} failed: {out[-2000:]}"
    return out


def podman_containers(lab: LabInfo, node: LabNode) -> list[str]:
    """The login user's containers of this lab's cluster (any state), as `podman ps` says."""
    out = ssh(lab, node, f"podman ps -a -q --filter label=provisioner.cluster={lab.name}")
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def ray_processes(lab: LabInfo, node: LabNode) -> list[str]:
    """Every raylet and GCS on the node (ps sees the container's processes too)."""
    listing = ssh(lab, node, "ps -e -ww -o pid=,comm=").stdout
    return [
        line for line in listing.splitlines() if line.split()[1:2] in (["raylet"], ["gcs_server"])
    ]


@pytest.fixture(scope="module")
def inventory(podman_lab: LabInfo) -> str:
    return str(podman_lab.inventory)


def test_the_login_user_has_rootless_podman_and_no_docker(podman_lab: LabInfo) -> None:
    for node in podman_lab.nodes:
        out = ssh(
            podman_lab,
            node,
            "id -nG; command -v docker || echo no-docker; sudo -n true 2>/dev/null || "
            "echo no-sudo; podman info --format '{{.Host.Security.Rootless}}'",
        )
        assert out.returncode == 0, out.stderr
        groups, docker, sudo, rootless = out.stdout.split("\n")[:4]
        assert "docker" not in groups.split() and docker == "no-docker" and sudo == "no-sudo"
        assert rootless == "true"


def test_doctor(inventory: str, podman_lab: LabInfo) -> None:
    code, doc, err = cli_json("doctor", "-i", inventory)
    assert code == 0, err[-3000:]
    assert [f for f in doc["findings"] if f["severity"] == "error"] == []
    names = {n.name for n in podman_lab.nodes}
    by_check: dict[str, dict[str, str]] = {}
    for f in doc["findings"]:
        by_check.setdefault(f["check"], {})[f["host"]] = f["severity"]
    for check in ("podman.version", "podman.rootless", "podman.storage", "podman.subids"):
        assert by_check.get(check) == dict.fromkeys(names, "ok"), (check, by_check.get(check))
    assert by_check.get("podman.linger") == dict.fromkeys(names, "ok")
    assert set(by_check.get("podman.cgroups", {})) == names  # judged on every node
    assert not any(f["check"].startswith("docker.") for f in doc["findings"])


def test_a_node_without_lingering_gets_the_finding_and_its_fix(
    inventory: str, podman_lab: LabInfo
) -> None:
    odd = podman_lab.nodes[2]
    as_root(odd, f"rm {LINGER}")
    try:
        code, doc, err = cli_json("doctor", "-i", inventory, "--no-reachability")
    finally:
        as_root(odd, f"touch {LINGER}")
    assert code == 0, err[-3000:]  # a warning here: the lab's nodes run no systemd
    linger = {f["host"]: f for f in doc["findings"] if f["check"] == "podman.linger"}
    assert set(linger) == {n.name for n in podman_lab.nodes}
    assert linger[odd.name]["severity"] == "warning"
    assert "lingering is off for lab" in linger[odd.name]["message"]
    assert linger[odd.name]["fix"] == f"sudo loginctl enable-linger lab on {odd.name}"
    # the others, with lingering on, have no such finding
    assert {n: f["severity"] for n, f in linger.items() if n != odd.name} == {
        n.name: "ok" for n in podman_lab.nodes if n != odd
    }


def podman_version(lab: LabInfo, node: LabNode) -> str:
    out = ssh(lab, node, "podman version --format '{{.Client.Version}}' 2>/dev/null")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_pin_goes_into_each_podmans_load_in_a_stream_it_reads(
    inventory: str, podman_lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    """Compression forced, each node loaded once: with only gzip on this machine, Podman
    5.4 loads the gzip stream and Podman 4.3 (which refuses gzip) gets the image plain;
    with zstd, the other Podman 4.3 node loads the zstd stream. Each node then holds the
    pin under its ID, from a fraction of the plain bytes where compressed. The nodes keep
    the pin: `up` (next) finds it there and sends nothing."""
    pin = read_pin(image_pin)
    bare = pin.image_id.removeprefix("sha256:")
    versions = {n.name: podman_version(podman_lab, n) for n in podman_lab.nodes}
    old, new, other = podman_lab.nodes
    assert versions[old.name].startswith("4.") and versions[other.name].startswith("4.")
    assert versions[new.name].startswith("5."), versions
    inv = load_inventory(Path(inventory))

    def holds(node: LabNode) -> str:
        out = ssh(podman_lab, node, f"podman image inspect --format '{{{{.Id}}}}' {bare}")
        return out.stdout.strip()

    for node in podman_lab.nodes:
        ssh(podman_lab, node, f"podman rmi -f {bare} >/dev/null 2>&1; true")
        assert holds(node) == "", node.name
    rounds = {"gz": (("pigz", "zlib"), [old, new]), "zst": ((), [other])}
    with scenario(
        "the pin into each node's Podman, compression forced",
        "each Podman gets a stream it loads (gzip only on 5.x, zstd on 4.3 and 5.x, else "
        "plain) and holds the pin under its ID",
        kind="behaviour",
    ) as s:

        def run(cache: str) -> DeliveryReport:
            codecs, nodes = rounds[cache]
            by_name = {n.name for n in nodes}
            with Pool(inv) as pool:
                return deliver(
                    pool,
                    [n for n in inv.nodes if n.name in by_name],
                    pin,
                    print,
                    LoadOptions(compress="always", codecs=codecs, cache_dir=tmp_path / cache),
                )

        got: dict[str, tuple[str, int]] = {}
        with ThreadPoolExecutor(len(rounds)) as pool_of_rounds:  # every node loads at once
            for report in pool_of_rounds.map(run, rounds):
                assert not report.errors, report.errors
                got.update({n: (p.codec, p.bytes_sent) for n, p in report.nodes.items()})
        held = 0
        for node in podman_lab.nodes:
            assert holds(node) == bare, node.name  # loaded and verified by ID
            held += holds(node) == bare
        s.saw(held=held)
        assert got[old.name][0] == "" and got[old.name][1] >= pin.size, got  # 4.3: no gzip
        assert got[new.name][0] == "gz" and got[new.name][1] < 0.5 * pin.size, got
        assert got[other.name][0] == "zst" and got[other.name][1] < 0.4 * pin.size, got
        s.saw(
            gzip_only=[
                f"Podman {versions[n.name]}: {got[n.name][0] or 'plain'}" for n in (old, new)
            ],
            with_zstd=f"Podman {versions[other.name]}: {got[other.name][0]}",
        )
        s.expect(
            "kept",
            (tmp_path / "zst" / f"{bare}.tar.zst").stat().st_size < 0.4 * pin.size,
            True,
        )
        s.observed = (
            "gzip only on this machine: {gzip_only} (plain: every byte; gz: under half the "
            "bytes); with zstd: {with_zstd} (under 0.4 of them), the zstd stream kept in the "
            "cache under 0.4 of the bytes: {kept}; {held} nodes then held the pin under its ID"
        )
        s.measure(
            sent=[
                f"Podman {versions[n]}: {c or 'plain'} {b / 1e6:,.0f} MB"
                for n, (c, b) in got.items()
            ]
        )
        s.measured = "{sent}"


SMALL_TAG = "provisioner-podman/small:test"


def small_pin(inventory: str, work: Path) -> Path:
    """A lock naming a small one-layer image (16 MB of random bytes) pinned as the real pin
    is: `image push` delivers it as it delivers the real one, without 2.4 GB per node
    (the real pin's delivery is the test before and `up`'s, after)."""
    ctx = work / "small"
    ctx.mkdir()
    (ctx / "blob").write_bytes(os.urandom(16 << 20))
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY blob /blob\n")
    subprocess.run(["docker", "build", "-q", "-t", SMALL_TAG, str(ctx)], check=True, timeout=300)
    attrs = client().api.inspect_image(SMALL_TAG)
    pin = read_pin(load_inventory(Path(inventory)).image_lock)  # type: ignore[arg-type]
    small = replace(
        pin,
        image_id=attrs["Id"],
        layers=tuple(attrs["RootFS"]["Layers"]),
        layer_sizes=(int(attrs["Size"]),),
        size=int(attrs["Size"]),
        tag=SMALL_TAG,
    )
    lock = work / "small.lock.json"
    write_pin(small, lock)
    return lock


def test_image_push_loads_the_pin_into_podman(
    inventory: str, podman_lab: LabInfo, tmp_path: Path
) -> None:
    """`image push` delivers as `up` does: on this inventory, through each node's `podman
    load` (the nodes have no Docker). Every node gets the pin, under its ID; then one
    node's Podman loses it: it gets it again, and the others, holding it, are sent nothing."""
    lock = small_pin(inventory, tmp_path)
    small = read_pin(lock)
    bare = small.image_id.removeprefix("sha256:")
    inv = str(edited_inventory(Path(inventory), tmp_path / "inv.yaml", image={"lock": str(lock)}))
    target = podman_lab.nodes[-1]

    def holds(node: LabNode) -> str:
        out = ssh(podman_lab, node, f"podman image inspect --format '{{{{.Id}}}}' {bare}")
        return out.stdout.strip()

    try:
        assert {holds(node) for node in podman_lab.nodes} == {""}  # the control: none has it
        code, doc, err = cli_json("image", "push", "-i", inv)
        assert code == 0, (doc, err)
        assert {n["host"]: n["action"] for n in doc["nodes"]} == {
            n.name: "send" for n in podman_lab.nodes
        }, doc
        ssh(podman_lab, target, f"podman rmi -f {bare} >/dev/null 2>&1; true")
        before = {node.name: holds(node) for node in podman_lab.nodes}
        assert before[target.name] == ""  # the control: this node lacks it now
        code, doc, err = cli_json("image", "push", "-i", inv)
        assert code == 0, (doc, err)
        for node in podman_lab.nodes:
            assert holds(node) == bare, node.name  # in the user's Podman, by its ID
        actions = {n["host"]: n["action"] for n in doc["nodes"]}
        assert actions == {
            name: "none" if held == bare else "send" for name, held in before.items()
        }, (actions, before)
    finally:
        for node in podman_lab.nodes:
            ssh(podman_lab, node, f"podman rmi -f {bare} >/dev/null 2>&1; true")
        subprocess.run(["docker", "image", "rm", "-f", SMALL_TAG], capture_output=True)


def test_up_train_status_logs_down(
    inventory: str, podman_lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    pin = read_pin(image_pin)
    try:
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        assert up["runtime"] == "podman" and up["totals"]["nodes"] == 3
        pushed = {n["host"]: n["action"] for n in up["push"]["nodes"]}
        assert set(pushed) == {n.name for n in podman_lab.nodes} and up["push"]["ok"]
        assert sorted(p["ip"] for p in up["placement"] if p["ok"]) == sorted(
            n.address for n in podman_lab.nodes
        )
        for node in podman_lab.nodes:
            # the pin in the user's own Podman, under the pin's ID
            held = ssh(
                podman_lab, node, f"podman image inspect --format '{{{{.Id}}}}' {pin.image_id[7:]}"
            )
            assert held.stdout.strip() == pin.image_id.removeprefix("sha256:"), held.stderr
            # Ray runs on after the SSH sessions of `up` ended
            assert len(podman_containers(podman_lab, node)) == 1
            assert ray_processes(podman_lab, node), node.name
        code, again, err = cli_json("up", "-i", inventory)
        assert code == 0 and again["changed"] is False, err[-3000:]
        assert {n["action"] for n in again["push"]["nodes"]} == {"none"}  # nothing sent again

        code, st, err = cli_json("status", "-i", inventory)
        assert code == 0, err[-3000:]
        assert st["runtime"] == "podman" and st["alive_nodes"] == 3 and st["healthy"]

        # the dashboard listens as the SSH user (rootless), and its socket is among those of
        # the processes in this cluster's container: the listener check passes on the head
        loaded = load_inventory(Path(inventory))
        port = loaded.ports.dashboard
        sockets = runtime_for(loaded).sockets_command()
        probe = ssh(podman_lab, podman_lab.nodes[0], listeners_command(sockets))
        seen = parse_listeners_output(probe.stdout)
        assert seen.uid is not None and seen.ours, probe
        assert {x.uid for x in seen.listeners if x.port == port} == {seen.uid}, seen
        assert refusal(port, seen.uid, seen.listeners, seen.ours) is None, seen

        # PPO with the default env runners (the cluster's CPUs minus one): every node
        code, out, err = cli(
            "submit", "-i", inventory, "--results", str(tmp_path), "--json",
            str(PLAYBOOKS / "ppo_cartpole.py"), "--", "--train-batch", "300",
            "--max-iterations", "2",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = json.loads(out)
        assert job["status"] == "SUCCEEDED"
        runners = json.loads((tmp_path / job["job_id"] / "runners.json").read_text())
        assert {r["node_ip"] for r in runners} == {n.address for n in podman_lab.nodes}, runners

        # an unchanged Tune script checkpointing on a worker: the head's store, the same
        # user process as under Docker (issue 44, item 3), its checkpoints home
        tune_checkpoints_come_home(inventory, tmp_path, [n.address for n in podman_lab.nodes[1:]])

        code, collected, err = cli_json("logs", "-i", inventory, "-o", str(tmp_path / "logs"))
        assert code == 0 and sorted(collected["nodes"]) == sorted(n.name for n in podman_lab.nodes)
        for node in podman_lab.nodes:
            got = tmp_path / "logs" / node.name
            assert (got / "ray" / "raylet.out").stat().st_size > 0
            assert (got / "container.log").stat().st_size > 0

        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]
        for node in podman_lab.nodes:
            assert podman_containers(podman_lab, node) == []
            assert ray_processes(podman_lab, node) == []
        code, down, err = cli_json("down", "-i", inventory, "--no-logs")
        assert code == 0 and down["ok"], err[-3000:]  # twice is fine
    finally:
        cli("down", "-i", inventory, "--no-logs")


def test_the_users_own_listener_outside_the_container_gets_no_token(
    inventory: str, podman_lab: LabInfo
) -> None:
    """The cluster down, the SSH user's own process (the uid of the container's Ray) listens
    where the dashboard should and records every request: `jobs list` refuses it before a
    byte is sent. Positive control: a request sent to it on the node is recorded."""
    port = load_inventory(Path(inventory)).ports.dashboard
    head = podman_lab.nodes[0]
    log = "/tmp/podman-listener-e2e.log"
    listening = f"grep -q '0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp"
    started = ssh(
        podman_lab,
        head,
        f"rm -f {log}; nohup python3 -c {shlex.quote(RECORDER)} {port} {log} "
        f">/dev/null 2>&1 </dev/null & echo $!; "
        f"for i in $(seq 100); do {listening} && exit 0; sleep 0.1; done; exit 1",
    )
    assert started.returncode == 0, started.stderr
    pid = started.stdout.split()[0]
    try:
        code, out, err = cli("jobs", "list", "-i", inventory, "--json")
        got = ssh(podman_lab, head, f"cat {log} 2>/dev/null; true").stdout
        ssh(
            podman_lab,
            head,
            f"python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:{port}/probe\")'",
        )
        control = ssh(podman_lab, head, f"cat {log}").stdout
        uid = ssh(podman_lab, head, "id -u").stdout.strip()
    finally:
        ssh(podman_lab, head, f"kill {pid}")
    assert code == 1, (out, err[-3000:])
    error = json.loads(out)["error"]
    assert error["kind"] == "NotThisCluster", error
    assert f"uid {uid} that is not this cluster's Ray" in error["message"], error
    assert got == "", got  # not one request: no token
    assert "GET /probe" in control, control  # positive control: it records what it gets
