"""The doctor against the real lab: one test per fault class.

Each test injects one fault, runs the doctor, and asserts that the right check fires on
the right host and that no healthy node is blamed; every fault is undone in `finally`.
Faults the lab does not offer are injected with `docker exec` on the node container.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from provisioner.doctor import DoctorReport, run_doctor
from provisioner.image.pin import Pin, Versions, write_pin
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.flavours import FLAVOURS
from provisioner.lab.nodes import LabInfo
from provisioner.runtime.context import cluster_context
from tests.cli import cli
from tests.e2e.faults.record import scenario


def sh(node: LabNode, script: str) -> str:
    rc, out = exec_rc(node.container, script)
    assert rc == 0, f"{node.name}: {script!r} failed: {out}"
    return out


def doctor(inventory: Path) -> DoctorReport:
    return run_doctor(cluster_context(load_inventory(inventory), lenient_pin=True))


def errors_by_host(report: DoctorReport) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for f in report.errors:
        found.setdefault(f.host, set()).add(f.check)
    return found


def only_on(report: DoctorReport, severity: str, check: str) -> set[str]:
    return {f.host for f in report.findings if f.check == check and f.severity == severity}


# --- one doctor check's fault on a node: the lab's breakages (provisioner/lab/faults.py) ---

RAYENV = "/opt/provisioner-fault-ray"


@contextmanager
def broken(lab: LabInfo, *faulty: tuple[LabNode, str]) -> Iterator[None]:
    """Inject each (node, breakage); mend them all after, whatever happens."""
    done: list[tuple[LabNode, str]] = []
    try:
        for node, name in faulty:
            done.append((node, name))
            faults.break_node(lab, node, name)
        yield
    finally:
        for node, name in reversed(done):
            faults.mend(lab, node, name)


# After SIGHUP sshd re-executes itself: wait until it answers with a banner again.
SSHD_BACK = (
    "for i in $(seq 100); do sleep 0.1; "
    "(exec 3<>/dev/tcp/127.0.0.1/22 && head -c 4 <&3) 2>/dev/null | grep -q SSH && break; done"
)


@contextmanager
def new_host_keys(node: LabNode) -> Iterator[None]:
    """The node's host keys regenerated (as after a reinstall); the old ones restored after."""
    sh(
        node,
        "mkdir -p /root/hostkeys.doctor && cp -p /etc/ssh/ssh_host_* /root/hostkeys.doctor/ && "
        "rm -f /etc/ssh/ssh_host_* && ssh-keygen -A >/dev/null && "
        "kill -HUP $(cat /run/sshd.pid) && " + SSHD_BACK,
    )
    try:
        yield
    finally:
        sh(
            node,
            "cp -p /root/hostkeys.doctor/* /etc/ssh/ && rm -rf /root/hostkeys.doctor && "
            "kill -HUP $(cat /run/sshd.pid) && " + SSHD_BACK,
        )


def edited_inventory(lab: LabInfo, tmp_path: Path, **ssh: object) -> Path:
    """A copy of the lab's inventory with some ssh settings changed (paths made absolute)."""
    document = yaml.safe_load(lab.inventory.read_text())
    document["ssh"]["key"] = str(lab.key)
    document["ssh"]["known_hosts"] = str(lab.known_hosts)
    document["ssh"].update(ssh)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def unpinned(lab: LabInfo, tmp_path: Path) -> Path:
    """The lab's inventory without an image pin, so that the doctor judges the nodes' own
    Python and Ray without the image's. The image tests, later in the suite, write a pin
    into the lab's inventory; this keeps these tests order-proof."""
    path = edited_inventory(lab, tmp_path)
    document = yaml.safe_load(path.read_text())
    document.pop("image", None)
    path.write_text(yaml.safe_dump(document))
    return path


# --- the tests ------------------------------------------------------------------------------


def test_clean_lab_has_no_errors(lab: LabInfo) -> None:
    result = cli("doctor", "-i", str(lab.inventory), "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = result.json()
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert report["round_trips_per_node"] == 3
    hosts = {f["host"] for f in report["findings"] if f["check"] == "docker.access"}
    assert hosts == {n.name for n in lab.nodes}
    assert any(
        f["check"] == "net.reachability" and f["severity"] == "ok" for f in report["findings"]
    )


def test_occupied_port_names_the_holder(lab: LabInfo) -> None:
    head = lab.nodes[0]
    faults.occupy(lab, head, 6379)
    try:
        report = doctor(lab.inventory)
    finally:
        faults.release(lab, head, 6379)
    assert errors_by_host(report) == {head.name: {"ports.free"}}
    (finding,) = report.errors
    assert "6379" in finding.message and "python3" in finding.message


def test_stopped_node(lab: LabInfo) -> None:
    worker = lab.nodes[2]
    faults.stop(lab, worker)
    try:
        report = doctor(lab.inventory)
    finally:
        faults.start(lab, worker)
    assert errors_by_host(report) == {worker.name: {"ssh.connect"}}
    assert report.elapsed_s < 30


def test_traffic_cut_between_two_workers(lab: LabInfo) -> None:
    a, b = lab.nodes[1], lab.nodes[2]
    faults.cut(lab, a, b)
    try:
        report = doctor(lab.inventory)
    finally:
        faults.uncut(lab, a, b)
    assert errors_by_host(report) == {a.name: {"net.reachability"}, b.name: {"net.reachability"}}
    messages = {f.host: f.message for f in report.errors}
    assert b.name in messages[a.name] and a.name in messages[b.name]


def test_clock_off_on_one_node_is_named(lab: LabInfo) -> None:
    """`clock.offset` end to end: one worker's clock 300 s ahead (libfaketime in its SSH
    sessions), the other nodes' as the machine's; undone after, and then the doctor finds
    every clock in agreement again (the positive control)."""
    worker = lab.nodes[1]
    with scenario(
        "one node's clock 300 s ahead (`doctor`)",
        "`clock.offset` warns on that node only, naming the offset and time synchronisation",
    ) as s:
        faults.clock(lab, worker, 300)
        try:
            report = doctor(lab.inventory)
        finally:
            faults.unclock(lab, worker)
        warned = {f.host: f for f in report.findings if f.check == "clock.offset"}
        flagged = {h for h, f in warned.items() if f.severity != "ok"}
        assert flagged == {worker.name}, warned
        s.saw(flagged=len(flagged), checked=len(warned))
        finding = warned[worker.name]
        s.expect("severity", finding.severity, "warning", str(finding))
        s.expect("ahead", "ahead of" in finding.message, True, str(finding))
        said = re.search(r"offset ([+-][\d.]+)s", finding.evidence)
        assert said is not None, finding.evidence
        offset = float(said.group(1))
        s.expect("near_300", 295 < offset < 305, True, finding.evidence)
        s.expect("chrony", "chrony" in finding.fix, True, finding.fix)
        s.expect("errors", len(report.errors), 0, str(report.errors))
        after = doctor(lab.inventory)
        s.expect(
            "after",
            sorted({f.severity for f in after.findings if f.check == "clock.offset"}),
            ["ok"],
        )
        s.observed = (
            "the doctor's `clock.offset` not ok on {flagged} of {checked} nodes, that worker: "
            "severity {severity}, its message saying ahead of: {ahead}, the offset in its "
            "evidence within 5 s of 300: {near_300}, the fix naming chrony: {chrony}; "
            "{errors} errors; once undone, every node's `clock.offset`: {after}"
        )
        s.measure(offset=offset, doctor=report.elapsed_s)
        s.measured = "offset {offset:+.3f} s measured; doctor {doctor:.1f} s"


def test_ray_only_in_login_shell(lab: LabInfo, tmp_path: Path) -> None:
    worker = lab.nodes[1]
    with broken(lab, (worker, "ray-login-only")):
        report = doctor(unpinned(lab, tmp_path))
    # docker runtime: Ray runs in the image, so a `ray` on the login PATH only is a warning
    # about the node's own commands (host mode runs Ray through a login shell: also fine)
    assert only_on(report, "warning", "shell.env") == {worker.name}
    (finding,) = [f for f in report.findings if f.check == "shell.env" and f.severity != "ok"]
    assert "command not found" in finding.message and RAYENV in finding.fix


def test_python_versions_differ(lab: LabInfo, tmp_path: Path) -> None:
    worker = lab.nodes[2]
    with broken(lab, (worker, "python-3.10")):
        report = doctor(unpinned(lab, tmp_path))
    # docker runtime: the nodes' own Python only matters to commands on the host (host
    # mode's version errors: tests/e2e/test_host_mode.py, on nodes with a real virtualenv).
    # On the mixed lab a node of another Debian release than the head's differs already.
    head = FLAVOURS[lab.nodes[0].flavour].suite
    other = {n.name for n in lab.nodes if FLAVOURS[n.flavour].suite != head}
    assert only_on(report, "warning", "python.version") == other | {worker.name}
    assert errors_by_host(report) == {}


def test_docker_unusable_without_sudo(lab: LabInfo) -> None:
    worker = lab.nodes[1]
    with broken(lab, (worker, "docker-group")):
        report = doctor(lab.inventory)
    assert errors_by_host(report) == {worker.name: {"docker.access"}}
    (finding,) = report.errors
    assert "usermod -aG docker lab" in finding.fix


def test_hostname_resolving_to_loopback(lab: LabInfo) -> None:
    worker = lab.nodes[2]
    with broken(lab, (worker, "hostname-loopback")):
        report = doctor(lab.inventory)
    assert only_on(report, "warning", "net.hostname") == {worker.name}
    assert "127.0.1.1" in next(
        f.message for f in report.findings if f.check == "net.hostname" and f.severity == "warning"
    )
    assert report.errors == []


def test_changed_host_key_is_refused_and_nothing_runs(lab: LabInfo) -> None:
    worker = lab.nodes[1]
    with new_host_keys(worker):
        report = doctor(lab.inventory)
    assert errors_by_host(report) == {worker.name: {"ssh.hostkey"}}
    (finding,) = report.errors
    assert "CHANGED" in finding.message
    assert re.search(rf"ssh-keygen -f \S*known_hosts -R {re.escape(worker.address)}", finding.fix)
    assert [f for f in report.findings if f.host == worker.name] == [finding]


def test_unknown_host_keys_refused_then_recorded_with_accept_new(
    lab: LabInfo, tmp_path: Path
) -> None:
    fresh = tmp_path / "known_hosts"
    strict = edited_inventory(lab, tmp_path, known_hosts=str(fresh))
    report = run_doctor(
        cluster_context(load_inventory(strict), lenient_pin=True), reachability=False
    )
    assert {f.host for f in report.errors if f.check == "ssh.hostkey"} == {
        n.name for n in lab.nodes
    }
    assert not fresh.exists()
    tofu = edited_inventory(lab, tmp_path, known_hosts=str(fresh), host_key_policy="accept-new")
    report = run_doctor(cluster_context(load_inventory(tofu), lenient_pin=True), reachability=False)
    assert report.errors == []
    recorded = fresh.read_text().splitlines()
    assert {line.split()[0] for line in recorded} == {n.address for n in lab.nodes}


def test_wrong_key_is_an_auth_error(lab: LabInfo, tmp_path: Path) -> None:
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inventory = edited_inventory(lab, tmp_path, key=str(key))
    report = run_doctor(
        cluster_context(load_inventory(inventory), lenient_pin=True), reachability=False
    )
    assert {f.host for f in report.errors} == {n.name for n in lab.nodes}
    assert {f.check for f in report.errors} == {"ssh.auth"}
    assert str(key) in report.errors[0].fix


def test_hung_sshd_is_bounded(lab: LabInfo, tmp_path: Path) -> None:
    worker = lab.nodes[2]
    inventory = edited_inventory(lab, tmp_path, connect_timeout=2)
    faults.hang(lab, worker)
    try:
        report = run_doctor(
            cluster_context(load_inventory(inventory), lenient_pin=True), reachability=False
        )
    finally:
        faults.unhang(lab, worker)
    assert errors_by_host(report) == {worker.name: {"ssh.connect"}}
    assert report.elapsed_s < 15
    (finding,) = report.errors
    assert "banner" in finding.message or "timed out" in finding.message


def test_a_worker_reached_only_through_a_jump_host(lab: LabInfo, tmp_path: Path) -> None:
    """The worker drops SSH from the control machine; with `jump` set to the head in the
    inventory, the doctor reaches it through the head (host keys checked on both hops)."""
    from tests.e2e.helpers import jumped_inventory, ssh_only_through_a_jump

    worker = lab.nodes[2]
    direct = edited_inventory(lab, tmp_path, connect_timeout=3)
    jumped = jumped_inventory(lab.inventory, tmp_path / "jumped.yaml", lab, worker)
    with ssh_only_through_a_jump(lab, worker):
        refused = cli("doctor", "-i", str(direct), "--json")
        through = cli("doctor", "-i", str(jumped), "--json")
    blocked = {f["host"] for f in refused.json()["findings"] if f["severity"] == "error"}
    assert refused.exit_code == 1 and blocked == {worker.name}, refused.stdout[-2000:]
    assert through.exit_code == 0, through.stdout[-3000:] + through.stderr[-2000:]
    findings = through.json()["findings"]
    assert [f for f in findings if f["severity"] == "error"] == []
    assert any(f["check"] == "docker.access" and f["host"] == worker.name for f in findings)


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch /tmp/pwned", "a;b", "a\nb"])
def test_hostile_address_is_exit_2(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(yaml.safe_dump({"cluster": "x", "head": {"address": bad}}))
    result = cli("doctor", "-i", str(path))
    assert result.exit_code == 2
    assert "head.address" in result.stderr


def test_every_node_check_faulted_in_one_doctor_run(lab: LabInfo, tmp_path: Path) -> None:
    """One fault per check of the doctor's table (docs/guide.md) that the tests above do not
    fault, spread over the nodes so that one doctor run (one round trip per node) judges them all.
    The pin names an image no node holds, built for arm64."""
    head, one, two = lab.nodes
    lock = tmp_path / "arm64.lock.json"
    zeros = "sha256:" + "0" * 64
    versions = Versions(python="3.11.2", ray="2.60.0", torch="2.13.0", gymnasium="1.2.2")
    pin = Pin(zeros, (zeros,), "base", zeros, "0", versions, 1, extra={"architecture": "arm64"})
    write_pin(pin, lock)
    path = edited_inventory(lab, tmp_path)
    document = yaml.safe_load(path.read_text())
    document["image"] = {"lock": str(lock)}
    document.setdefault("ray", {})["shm_size"] = "4TiB"  # more than any lab node's memory
    path.write_text(yaml.safe_dump(document))
    worker_port = 15000
    faults.occupy(lab, head, worker_port)
    try:
        with broken(
            lab,
            (head, "stale-raylet"),
            (head, "low-memory"),
            (one, "docker-stopped"),
            (one, "one-cpu"),
            (one, "no-rsync"),
            (two, "docker-group"),
            (two, "sudo-password"),
            (two, "ray-2.59"),
            (two, "small-tmp"),
            (two, "other-source"),
        ):
            report = run_doctor(
                cluster_context(load_inventory(path), lenient_pin=True), ray_up=True
            )
    finally:
        faults.release(lab, head, worker_port)
    found: dict[tuple[str, str], set[str]] = {}
    for f in report.findings:
        if f.severity != "ok":
            found.setdefault((f.check, f.severity), set()).add(f.host)
    every = {n.name for n in lab.nodes}
    expected = {
        ("ray.stale", "error"): {head.name},
        ("resources.memory", "warning"): {head.name},
        ("ports.worker_range", "warning"): {head.name},
        ("docker.daemon", "error"): {one.name},
        ("resources.cpu", "warning"): {one.name},
        ("tools.rsync", "error"): {one.name},
        ("docker.access", "error"): {two.name},
        ("sudo", "warning"): {two.name},
        ("ray.version", "warning"): {two.name},  # a warning: Ray runs inside the pinned image
        ("resources.disk", "error"): {two.name},
        ("net.address", "warning"): {two.name},
        ("image.present", "warning"): every,
        ("image.arch", "error"): every,
        ("resources.shm", "error"): every,
    }
    for key, hosts in expected.items():
        assert found.get(key) == hosts, (key, found.get(key), sorted(found.items()))
    said = {(f.check, f.host): f.message for f in report.findings if f.severity != "ok"}
    assert "raylet" in next(
        f.evidence for f in report.findings if f.check == "ray.stale" and f.severity == "error"
    )
    assert "2.0 GiB" in said[("resources.memory", head.name)]
    assert str(worker_port) in next(
        f.evidence
        for f in report.findings
        if f.check == "ports.worker_range" and f.severity != "ok"
    )
    assert "does not answer" in said[("docker.daemon", one.name)]
    assert said[("resources.cpu", one.name)] == "1 CPU"
    assert any(  # the machine's own disk may add warnings: the error is /tmp's
        f.check == "resources.disk"
        and f.host == two.name
        and f.severity == "error"
        and "/tmp" in f.message
        for f in report.findings
    )
    assert "2.59.0" in said[("ray.version", two.name)]
    assert "password" in said[("sudo", two.name)]
    assert (
        head.address in said.get(("net.address", two.name), "")
        or "sends from" in said[("net.address", two.name)]
    )
    assert "arm64" in said[("image.arch", head.name)]


def test_a_storage_path_the_nodes_do_not_share_is_named_on_each_with_its_fix(
    lab: LabInfo, tmp_path: Path
) -> None:
    # The lab's nodes share no filesystem: each has its own /tmp. The head writes the
    # file; each worker, reading its own folder, cannot find it and is named.
    path = tmp_path / "inventory.yaml"
    document = yaml.safe_load(unpinned(lab, tmp_path).read_text())
    document["storage"] = {"path": "/tmp/provisioner-e2e-shared"}
    path.write_text(yaml.safe_dump(document))
    report = doctor(path)
    head, *workers = lab.nodes
    assert only_on(report, "error", "storage.shared") == {w.name for w in workers}
    (finding,) = [
        f for f in report.errors if f.host == workers[0].name and f.check == "storage.shared"
    ]
    assert f"mount the filesystem {head.name} has at /tmp/provisioner-e2e-shared" in finding.fix
    # the head wrote it (its folder is there) and removed its file after the reads
    assert sh(head, "ls -A /tmp/provisioner-e2e-shared | wc -l").strip() == "0"
    assert "storage" in report.timings
