"""The podman runtime: its commands (pure strings), its state parser, and the doctor's
judges of its facts section: golden/doctor/podman_*.txt.

podman_head: facts.sh with this runtime's section, captured on the head of the podman lab
after test_podman (rootless Podman 4.3, overlay storage, cgroup v1 with controllers on the
v2 mount, runc, lingering on, the pin loaded, no container). podman_running_head: the same
script on the head of a podman lab (`e2e-podman`) while `provisioner up` had its cluster
running there (Podman 4.3.1: the Ray container "Up 27 seconds ago", Ray's listeners and
processes, rootless as the login user). Other cases are those files with one fact changed.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from provisioner.checks.facts import NodeFacts, parse_facts, split_sections
from provisioner.checks.findings import Finding
from provisioner.checks.intent import PinFacts, Plan
from provisioner.cluster import render
from provisioner.doctor import CATALOGUE
from provisioner.doctor.gather import _script
from provisioner.doctor.run import explained_by_own_ray, node_findings
from provisioner.gpu.assignment import GpuPlan
from provisioner.inventory import Node, RayPorts, SSHSettings
from provisioner.node import layout, tls, token
from provisioner.runtime import judges, runtime_for
from provisioner.runtime.containers import replace_ours
from provisioner.runtime.podman import runtime as podman
from provisioner.runtime.podman.delivery import (
    bare_id,
    full_id,
    has_image_command,
    parse_state,
    podman_reads,
    state_command,
)
from provisioner.runtime.podman.doctor import CHECKS, FACTS, PodmanFacts
from provisioner.runtime.podman.doctor import parse_facts as parse_podman
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin

GOLDEN = Path(__file__).parent / "golden" / "doctor"
PIN_ID = "sha256:" + "d" * 64


def test_the_registry_builds_it_by_name(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="podman")
    runtime = runtime_for(inv, make_pin())
    assert isinstance(runtime, podman.PodmanRuntime) and runtime.name == "podman"
    assert (runtime.caps.containers, runtime.caps.needs_image) == (True, True)
    assert judges("podman") is podman.JUDGES and podman.JUDGES.facts == FACTS


def test_worker_podman_run_mirrors_docker_mode_and_carries_no_token(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, shm_size=2**30, tls=False)
    cmd = podman.run_command(inv, inv.workers[0], PIN_ID, cluster_id=CID)
    guard, _, rest = cmd.partition("; mkdir -p ")
    assert guard.startswith("o=$(podman container inspect --format ")
    assert "exit 3" in guard and "RAY_AUTH_TOKEN=" not in cmd  # by path, never by value
    prepare, _, function = rest.partition(" && run_ray() { ")
    run, _, attempts = function.partition("; } && { run_ray || ")
    assert prepare == (
        '"$HOME"/.provisioner/clusters/demo/ray "$HOME"/.provisioner/clusters/demo/results'
    )
    # a container of this cluster's id in the way (an interrupted `up`'s) is replaced once
    assert attempts == replace_ours(podman.WORDS, OURS, CID, "run_ray") + "; }"
    assert run == (
        f"podman run -d --name {OURS} --network host --pull=never "
        "--restart=unless-stopped --log-driver k8s-file --shm-size=1073741824 "
        '-v "$HOME"/.provisioner/clusters/demo/ray:/tmp/ray '
        '--mount type=bind,source="$HOME"/.provisioner/clusters/demo/auth_token,'
        "target=/run/provisioner/auth_token,readonly "
        '-v "$HOME"/.provisioner/clusters/demo/results:/provisioner/results '
        "-e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH=/run/provisioner/auth_token "
        "-e RAY_USAGE_STATS_ENABLED=0 -e PROVISIONER_RESULTS_ROOT=/provisioner/results "
        "--label provisioner.cluster=demo --label provisioner.role=worker "
        f"--label provisioner.cluster-id={CID} {'d' * 64} ray start --address=10.250.9.10:6379 "
        "--node-ip-address=10.250.9.11 --node-manager-port=8077 --object-manager-port=8076 "
        "--runtime-env-agent-port=8079 --dashboard-agent-grpc-port=8078 "
        "--dashboard-agent-listen-port=52365 --metrics-export-port=8090 "
        "--min-worker-port=10002 --max-worker-port=19999 --disable-usage-stats --block"
    )


def test_gpus_go_through_cdi(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path)
    gpus = GpuPlan(method="cdi", uuids=("GPU-a",), indices=(0,), cdi_names=("0",))
    cmd = podman.run_command(inv, inv.head, PIN_ID, gpus)
    assert "--device nvidia.com/gpu=0 --label provisioner.gpus=cdi:GPU-a " in cmd
    assert podman.gpu_probe_command(PIN_ID, gpus) == (
        f"podman run --rm -i --pull=never --network none --device nvidia.com/gpu=0 "
        f"{'d' * 64} python3 -"
    )


CID = "0123456789abcdef"
OTHER = "fedcba9876543210"
OURS = "ray-demo-01234567"


def _fake_podman(work: Path, containers: dict[str, str], pid: int = 0) -> dict[str, str]:
    """A `podman` run by a real shell, for a user holding `containers` (name -> its
    cluster id label, "" for none, all of cluster `demo`): `container inspect` answers a
    container's label (its state: running; its first process: `pid`), `ps` lists them
    with their ids, `rm` and `run` are logged, `container exists` looks them up."""
    bin_ = work / "bin"
    bin_.mkdir(parents=True)
    table = work / "containers"
    table.write_text("".join(f"{n} {label or '-'}\n" for n, label in containers.items()))
    (bin_ / "podman").write_text(
        "#!/bin/sh\n"
        f"t={table}\n"
        'for a; do n="$a"; done\n'  # the last word: the container's name
        'has() { awk -v n="$1" \'$1 == n {print $2}\' "$t"; }\n'
        'case "$1 $2" in\n'
        '"container inspect") l=$(has "$n"); [ -n "$l" ] || exit 125;'
        f' case "$*" in *State.Running*) echo true;; *State.Pid*) echo {pid};;'
        ' *) echo "$l";; esac;;\n'
        '"container exists") [ -n "$(has "$n")" ];;\n'
        'ps*) awk \'{print $1, ($2 == "-" ? "" : $2)}\' "$t";;\n'
        f'rm*) echo "$n" >> {work}/rm.log; grep -v "^$n " "$t" > "$t.new"; mv "$t.new" "$t";;\n'
        f'run*) echo "$@" >> {work}/run.log;;\n'
        "esac\n"
    )
    (bin_ / "podman").chmod(0o755)
    return {"PATH": f"{bin_}:/usr/bin:/bin", "HOME": str(work)}


def _sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, timeout=30, check=False
    )


def test_the_container_is_named_and_labelled_by_the_clusters_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path, runtime="podman")
    made = token.ensure_cluster_id(inv)
    runtime = runtime_for(inv, make_pin(image_id=PIN_ID))
    name = f"ray-demo-{made[:8]}"
    assert token.ray_container(inv) == name
    assert f" --name {name} " in runtime.start_command(inv.head)
    assert f" --label provisioner.cluster-id={made} " in runtime.start_command(inv.head)
    assert runtime.render_section(tmp_path / "t").config["docker"]["container_name"] == name
    for command in (runtime.state_command(), runtime.runtime_log_command(5)):
        assert f" {name} " in command, command
    assert runtime.python_command("x").startswith(f"podman exec -i {name} python - ")
    # without an id (before the first `up`): no label, the name an older provisioner gave
    assert "provisioner.cluster-id=" not in podman.run_command(inv, inv.head, PIN_ID)
    assert " --name ray-demo " in podman.run_command(inv, inv.head, PIN_ID)


def test_up_never_runs_into_a_container_that_is_not_provably_this_clusters(
    tmp_path: Path,
) -> None:
    inv = make_inventory(tmp_path, runtime="podman")
    run = podman.run_command(inv, inv.head, PIN_ID, cluster_id=CID)
    cases = {
        "empty": ({}, 0, ""),
        "ours-unlabelled": ({OURS: ""}, 3, f"the container {OURS} of this user carries no"),
        "namesake": ({"ray-demo-fedcba98": OTHER}, 3, "another cluster of the same name"),
        "legacy-ours": ({"ray-demo": CID}, 0, ""),  # ours: `up` removes it before
        "legacy-none": ({"ray-demo": ""}, 3, "cluster id none"),
    }
    for case, (containers, code, said) in cases.items():
        work = tmp_path / case
        done = _sh(run, _fake_podman(work, containers))
        assert done.returncode == code, (case, done.stderr)
        assert said in done.stderr, (case, done.stderr)
        assert (work / "run.log").exists() == (code == 0), case  # positive control: runs
        assert not (work / "rm.log").exists(), case  # nothing removed, ever
    assert OTHER in _sh(run, _fake_podman(tmp_path / "again", {"x": OTHER})).stderr


def test_down_removes_only_containers_carrying_this_clusters_id(tmp_path: Path) -> None:
    remove = podman.remove_command("demo", CID)
    assert f"podman rm -f -t 0 {OURS} >/dev/null 2>&1; " in remove  # at once
    cases = {
        "ours": ({OURS: CID}, [OURS], ""),
        "legacy-ours": ({"ray-demo": CID, OURS: CID}, [OURS, "ray-demo"], ""),
        "ours-unlabelled": ({OURS: ""}, [], f"{OURS} of this user carries no cluster id"),
        "namesake": ({"ray-demo": OTHER}, [], f"belongs to another cluster (cluster id {OTHER})"),
        "legacy-none": ({"ray-demo": ""}, [], "ray-demo of this user carries no cluster id"),
        "nothing": ({}, [], ""),
    }
    for case, (containers, removed, said) in cases.items():
        work = tmp_path / case
        done = _sh(remove, _fake_podman(work, containers))
        assert done.returncode == 0, (case, done.stderr)
        log = work / "rm.log"
        assert (log.read_text().split() if log.exists() else []) == removed, case
        assert said in done.stderr and ("left alone" in done.stderr) == bool(said), case
    # before the first `up` (no id): nothing is this cluster's, even a bare `ray-demo`
    done = _sh(podman.remove_command("demo"), _fake_podman(tmp_path / "x", {"ray-demo": ""}))
    assert done.returncode == 0 and not (tmp_path / "x" / "rm.log").exists()
    assert "left alone" in done.stderr


def test_this_clusters_sockets_are_those_of_its_labelled_containers_processes(
    tmp_path: Path,
) -> None:
    """Read from this machine's /proc, as on a node (no `podman exec`): with the fake
    container's first process this test's own, its PID namespace is this machine's, so a
    socket this test holds is listed when the container carries this cluster's id, and
    nothing is listed otherwise (no label, another's, gone, not running)."""
    command = podman.sockets_command("demo", CID)
    assert "podman exec" not in command and 'readlink "/proc/$p/ns/pid"' in command
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        inode = os.fstat(held.fileno()).st_ino
        ours = _sh(command, _fake_podman(tmp_path / "ours", {OURS: CID}, pid=os.getpid()))
        assert str(inode) in ours.stdout.split(), ours  # positive control
        for case, containers, pid in (
            ("none", {OURS: ""}, os.getpid()),
            ("other", {OURS: OTHER}, os.getpid()),
            ("gone", {}, os.getpid()),
            ("stopped", {OURS: CID}, 0),
        ):
            theirs = _sh(command, _fake_podman(tmp_path / case, containers, pid))
            assert theirs.returncode == 0 and theirs.stdout == "", (case, theirs)


def test_a_process_outside_the_containers_pid_namespace_is_not_listed(tmp_path: Path) -> None:
    """The awk filter of `sockets_command` keeps the fd folders of processes in the
    container's PID namespace only: given `ls -l` lines of two namespaces, one."""
    listing = (
        "lrwxrwxrwx 1 lab lab 0 Dec  3 09:00 /proc/7/ns/pid -> pid:[4026532900]\n"
        "lrwxrwxrwx 1 lab lab 0 Dec  3 09:00 /proc/8/ns/pid -> pid:[4026531836]\n"
        "lrwxrwxrwx 1 root root 0 Dec  3 09:00 /proc/1/ns/pid\n"  # unreadable: another's
        "lrwxrwxrwx 1 lab lab 0 Dec  3 09:00 /proc/12/ns/pid -> pid:[4026532900]\n"
    )
    awk = podman._NS_FDS.split(" | ")[1]
    done = subprocess.run(
        ["sh", "-c", f"ns='pid:[4026532900]'; {awk}"],
        input=listing,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == ["/proc/7/fd/", "/proc/12/fd/"]


def test_the_runtime_gives_its_commands_this_clusters_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path, runtime="podman")
    cid = token.ensure_cluster_id(inv)
    runtime = runtime_for(inv, make_pin(image_id=PIN_ID))
    assert runtime.sockets_command() == podman.sockets_command("demo", cid)
    assert runtime.stop_command(inv.head) == podman.remove_command("demo", cid)
    assert runtime.running_test() == podman.running_test("demo", cid)


def test_other_commands() -> None:
    assert podman.log_command("demo", 50, CID) == (
        f"podman logs --timestamps --tail 50 {OURS} 2>&1"
    )
    assert podman.exec_python_command("demo", "--x", "a b", cluster_id=CID) == (
        f"podman exec -i {OURS} python - --x 'a b'"
    )
    assert podman.running_test("demo", CID) == (
        f"n={OURS}; o=$(podman container inspect --format "
        "'{{with index .Config.Labels \"provisioner.cluster-id\"}}{{.}}{{else}}-{{end}}' "
        f'{OURS} 2>/dev/null); [ -n "$o" ] && [ "$o" = {CID} ] && '
        '[ "$(podman container inspect --format \'{{.State.Running}}\' "$n" 2>/dev/null)" '
        "= true ]"
    )
    assert has_image_command(PIN_ID) == (
        f"podman image inspect --format '{{{{.Id}}}}' {'d' * 64} 2>/dev/null || true"
    )
    assert bare_id(PIN_ID) == "d" * 64 and full_id("d" * 64) == PIN_ID and full_id("") == ""


def test_the_running_test_is_true_only_for_this_clusters_running_container(
    tmp_path: Path,
) -> None:
    test = podman.running_test("demo", CID)
    assert _sh(test, _fake_podman(tmp_path / "ours", {OURS: CID})).returncode == 0
    for case, containers in (("none", {OURS: ""}), ("other", {OURS: OTHER}), ("gone", {})):
        assert _sh(test, _fake_podman(tmp_path / case, containers)).returncode != 0, case


def test_state_parses_podmans_inspect_with_the_pins_id(tmp_path: Path) -> None:
    line = (
        '{"running": true, "status": "running", "image": "' + "d" * 64 + '", '
        '"started_at": "2026-12-03T06:40:01.5Z", "restarts": 1, "exit_code": 0, '
        '"oom_killed": false, "cluster_id": "c1", "gpus": ""}'
    )
    state = podman.parse_state(line, "c1")
    assert state.running and state.runs == PIN_ID and state.restarts == 1
    runtime = runtime_for(make_inventory(tmp_path, runtime="podman"), make_pin(image_id=PIN_ID))
    assert runtime.is_current(state) is True
    assert podman.parse_state(line, "c2").status == "absent"  # another cluster's namesake
    assert podman.parse_state(line).status == "absent"  # no id here yet: not provably ours
    unlabelled = line.replace('"cluster_id": "c1"', '"cluster_id": null')
    assert podman.parse_state(unlabelled, "c1").status == "absent"
    assert podman.parse_state("null").status == "absent"
    assert f" {OURS} 2>/dev/null || echo null" in podman.state_command("demo", CID)


def test_render_uses_rays_podman_switch(tmp_path: Path) -> None:
    inv = make_inventory(tmp_path, runtime="podman")
    section = runtime_for(inv, make_pin(image_id=PIN_ID)).render_section(tmp_path / "token")
    docker = section.config["docker"]
    assert docker["use_podman"] is True and docker["image"] == "d" * 64
    assert (
        docker["container_name"] == layout.container_name("demo", token.read_cluster_id(inv))
        and docker["pull_before_run"] is False
    )
    assert section.config["file_mounts"] == {"/run/provisioner/auth_token": str(tmp_path / "token")}
    assert not any("RAY_USE_TLS" in o for o in docker["run_options"])  # without TLS files


def test_render_runs_ray_under_tls_with_the_clusters_ca(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As docker mode's: the launcher copies the TLS files into the container, and the
    variables make Ray use them; the whole cluster.yaml passes Ray's own validation."""
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = make_inventory(tmp_path, runtime="podman")
    cid = token.ensure_cluster_id(inv)
    folder = tls.render_files(inv)
    runtime = runtime_for(inv, make_pin(image_id=PIN_ID))
    config = yaml.safe_load(render.render(inv, tmp_path / "t", runtime, folder))
    assert config["file_mounts"]["/run/provisioner/tls"] == str(folder.resolve())
    docker = config["docker"]
    assert docker["use_podman"] is True and docker["container_name"] == f"ray-demo-{cid[:8]}"
    options = docker["run_options"]
    for k, v in tls.ray_env(tls.CONTAINER_TLS_DIR).items():
        assert f"-e {k}={v}" in options, k
    assert f"--label provisioner.cluster-id={cid}" in options


# --- the doctor's judges, on facts captured on lab nodes

SSH = SSHSettings(user="lab")
HEAD = Node("provisioner-e2e-podman-0", "10.250.103.10", "head", SSH)
PIN = PinFacts(PIN_ID, "3.11.2", "2.60.0", "amd64")


def plan(pin: PinFacts | None = PIN) -> Plan:
    return Plan(
        ports=RayPorts(),
        head=HEAD.name,
        pin=pin,
        runtime="podman",
        cluster="e2e-podman",
        caps=podman.CAPS,
    )


def section(name: str) -> str:
    """The runtime's own section of a golden file, as captured."""
    return split_sections((GOLDEN / f"{name}.txt").read_text())["runtime"]


def golden(name: str, runtime: str | None = None) -> NodeFacts:
    """A golden file parsed as the doctor parses it (`runtime`: another runtime section)."""
    text = (GOLDEN / f"{name}.txt").read_text()
    facts = parse_facts(HEAD.name, text, runtime=podman.JUDGES.parse)
    return facts if runtime is None else replace(facts, runtime=parse_podman(runtime))


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


def found(facts: NodeFacts, p: Plan | None = None) -> dict[str, Finding]:
    result = podman.JUDGES.node(HEAD, facts, p or plan())
    assert all(f.check in CATALOGUE or f.check in CHECKS for f in result)
    return {f.check: f for f in result if f.check.startswith(("podman.", "image."))}


def test_the_facts_section_runs_in_the_doctors_script() -> None:
    script = _script("facts.sh").decode()
    for helper in ("lookup()", "with_timeout()", "image=$3"):
        assert helper in script.replace(" image=$3", "\nimage=$3")  # FACTS uses these


def test_a_healthy_node() -> None:
    facts = golden("podman_head")
    p = parse_podman(section("podman_head"))
    assert facts.runtime == p
    assert p.version.startswith("4.") and p.rootless and p.graph_driver == "overlay"
    assert p.subuid == ((100000, 65536),) and p.subgid == ((100000, 65536),)
    assert p.linger and not p.systemd and p.oci_runtime == "runc"
    checks = found(facts)
    assert {c: f.severity for c, f in checks.items()} == {
        "podman.version": "ok",
        "podman.rootless": "ok",
        "podman.storage": "ok",
        "podman.cgroups": "warning",  # cgroup v1 here: no limits, but it runs
        "podman.subids": "ok",
        "podman.linger": "ok",
        "image.present": "ok",
    }
    assert "unified hierarchy" in checks["podman.cgroups"].fix


def test_without_lingering_the_fix_is_loginctl() -> None:
    text = edited(section("podman_head"), "%%linger=yes", "%%linger=no")
    finding = found(golden("podman_head", text))["podman.linger"]
    assert finding.severity == "warning"  # no systemd on this node: nothing ends it yet
    assert finding.fix == f"sudo loginctl enable-linger lab on {HEAD.name}"
    with_systemd = golden("podman_head", edited(text, "%%systemd=no", "%%systemd=yes"))
    finding = found(with_systemd)["podman.linger"]
    assert finding.severity == "error" and "dies when the SSH session" in finding.message
    assert finding.fix == f"sudo loginctl enable-linger lab on {HEAD.name}"


def test_missing_subordinate_ids_name_usermod() -> None:
    text = section("podman_head")
    lines = [ln for ln in text.splitlines() if not ln.startswith("%%subgid=")]
    no_gids = golden("podman_head", "\n".join(lines))
    finding = found(no_gids)["podman.subids"]
    assert finding.severity == "error" and "no subordinate GIDs" in finding.message
    assert finding.fix.startswith("sudo usermod --add-subuids 100000-165535 --add-subgids")
    narrow = edited(text, "%%subuid=lab:100000:65536", "%%subuid=lab:100000:1000")
    assert found(golden("podman_head", narrow))["podman.subids"].severity == "warning"
    no_map = golden("podman_head", text.replace("%%newuidmap=", "%%gone="))
    assert found(no_map)["podman.subids"].fix == "sudo apt-get install -y uidmap"


def test_vfs_storage_and_crun_on_a_hybrid_layout() -> None:
    text = section("podman_head")
    vfs = edited(text, '"graphDriverName": "overlay"', '"graphDriverName": "vfs"')
    finding = found(golden("podman_head", vfs))["podman.storage"]
    assert finding.severity == "warning" and 'driver = "overlay"' in finding.fix
    crun = edited(text, '"name": "runc"', '"name": "crun"')
    finding = found(golden("podman_head", crun))["podman.cgroups"]
    assert finding.severity == "error" and 'runtime = "runc"' in finding.fix


def test_no_podman_and_a_failing_podman() -> None:
    absent = golden("podman_head", "%%user=lab 1000\n%%linger=yes\n")
    (only,) = found(absent).values()
    assert only.check == "podman.version" and only.severity == "error"
    assert "apt-get install -y podman uidmap" in only.fix
    broken = parse_podman(
        "%%podman=/usr/bin/podman\n%%info_rc=125\n%%info=\n"
        "%%info_msg=Error: cannot set up namespace using newuidmap: exit status 1\n"
    )
    assert not broken.info and broken.info_rc == 125
    text = "%%podman=/usr/bin/podman\n%%info_rc=125\n%%info=\n%%info_msg=Error: newuidmap\n"
    checks = found(golden("podman_head", text))
    assert checks["podman.rootless"].severity == "error"
    assert "newuidmap" in checks["podman.rootless"].evidence


def test_the_pin_absent_from_the_users_podman() -> None:
    lines = [ln for ln in section("podman_head").splitlines() if not ln.startswith("%%image=")]
    finding = found(golden("podman_head", "\n".join(lines)))["image.present"]
    assert finding.severity == "warning" and "podman load" in finding.fix


def test_own_ray_is_this_clusters_running_container() -> None:
    running = golden("podman_running_head")
    assert podman.JUDGES.own_ray(running, "e2e-podman")
    assert not podman.JUDGES.own_ray(running, "another")
    assert not podman.JUDGES.own_ray(golden("podman_head"), "e2e-podman")
    # the busy ports and Ray processes there are this cluster's own: warnings, not errors
    judged = node_findings(HEAD, running, plan(), judges(plan().runtime))
    kept = explained_by_own_ray(judged, running, "e2e-podman", judges("podman"))
    assert any(f.check == "ray.stale" and f.severity == "error" for f in judged)
    assert not [f for f in kept if f.severity == "error"], [
        f for f in kept if f.severity == "error"
    ]


def test_empty_section_parses_to_nothing() -> None:
    assert parse_podman("") == PodmanFacts()


def test_the_section_names_podmans_graph_root_for_the_disk_check() -> None:
    p = golden("podman_head").runtime
    assert isinstance(p, PodmanFacts) and p.usable and p.remove == "podman rm -f"
    assert p.data_root == p.graph_root and p.data_root.endswith("/containers/storage")
    assert p.image.startswith("sha256:")  # as the pin writes it (Podman says bare hex)
    assert "runtime_root=${BASH_REMATCH[1]}" in FACTS and "graphRoot" in FACTS
    assert PodmanFacts().usable is False  # no `podman info`: not usable as it is


def test_both_container_runtimes_guard_with_one_builder_in_their_own_words() -> None:
    from provisioner.runtime.docker import runtime as docker
    from provisioner.runtime.podman import runtime as podman

    cid = "0123456789abcdef"
    d, p = docker.remove_container_command("demo", cid), podman.remove_command("demo", cid)
    assert "docker rm -f" in d and "podman" not in d
    assert "podman rm -f -t 0" in p and "docker" not in p
    assert "on this node" in d and "of this user" in p  # where each says the container is


def test_which_compressed_streams_each_podman_loads() -> None:
    """As tried in the lab with the pin's stream: 4.3.1 loads zstd and refuses gzip, 5.4.2
    loads both; an unreadable version gets no compressed stream."""
    assert podman_reads("4.3.1") == ("zst",)
    assert podman_reads("4.9.3") == ("zst",)
    assert podman_reads("5.4.2") == ("zst", "gz")
    assert podman_reads("4.2.0") == ()
    assert podman_reads("") == ()
    assert podman_reads("podman") == ()


def test_the_state_round_tells_the_held_id_and_the_version() -> None:
    cmd = state_command("sha256:" + "ab" * 32)
    assert cmd.startswith(has_image_command("sha256:" + "ab" * 32))
    assert "podman version --format '{{.Client.Version}}'" in cmd
    assert parse_state("ab12\n5.4.2\n") == ("ab12", "5.4.2")
    assert parse_state("\n4.3.1\n") == ("", "4.3.1")  # not held
    assert parse_state("") == ("", "")
