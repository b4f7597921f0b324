"""SLURM: the inventory's scheduler section, the lab's slurm.conf, the job's port block and
the rendered sbatch script (pure parts; the lab's real slurmctld runs them in the e2e)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from provisioner.errors import InventoryError
from provisioner.inventory import load_inventory
from provisioner.inventory.allocation import BLOCK_SIZE, job_ports, port_base
from provisioner.inventory.models import Slurm, time_seconds
from provisioner.lab.config import LabConfig, slurm_conf, slurm_inventory_document
from provisioner.slurm.sbatch import SbatchJob, pack_playbook, render_sbatch, sbatch_directives

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"

SLURM_INV = """\
cluster: hpc
ssh:
  user: alice
  key: id_ed25519
scheduler:
  type: slurm
  login: {name: login1, address: 10.1.0.5}
  partition: gpu
  nodes: 4
  time: 2:00:00
  cpus_per_node: 32
  gpus_per_node: 4
  account: rl-lab
  extra_sbatch_args: [--qos=debug, --constraint=ib]
runtime: host
"""


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not checked here\n")
    os.chmod(path, 0o600)
    return path


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return load_inventory(path, openssh=False)


def test_scheduler_section_is_read(tmp_path: Path, key: Path) -> None:
    inv = load(tmp_path, SLURM_INV)
    assert inv.slurm == Slurm(  # type: ignore[attr-defined]
        partition="gpu",
        nodes=4,
        time="2:00:00",  # as written (YAML 1.1 would make it 7200)
        cpus_per_node=32,
        gpus_per_node=4,
        account="rl-lab",
        extra_sbatch_args=("--qos=debug", "--constraint=ib"),
    )
    assert inv.login.name == "login1" and inv.login.role == "login"  # type: ignore[attr-defined]
    assert inv.login.ssh.user == "alice"  # type: ignore[attr-defined]
    assert not inv.allocated and inv.workers == ()  # type: ignore[attr-defined]
    assert time_seconds(inv.slurm.time) == 7200  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("old", "new", "field", "line"),
    [
        ("type: slurm", "type: pbs", "scheduler.type", 6),
        ("nodes: 4", "nodes: 0", "scheduler.nodes", 9),
        ("time: 2:00:00", "time: soon", "scheduler.time", 10),
        ("partition: gpu", "partition: 'gpu; rm -rf ~'", "scheduler.partition", 8),
        ("account: rl-lab", "account: [a]", "scheduler.account", 13),
        ("--constraint=ib", "'--constraint=ib --wrap=x'", "scheduler.extra_sbatch_args[1]", 14),
        ("--qos=debug", "-q", "scheduler.extra_sbatch_args[0]", 14),
        ("  nodes: 4", "  node: 4", "scheduler.node", 9),
        ("gpus_per_node: 4", "gpus_per_node: -1", "scheduler.gpus_per_node", 12),
    ],
)
def test_bad_scheduler_values_name_line_and_field(
    tmp_path: Path, key: Path, old: str, new: str, field: str, line: int
) -> None:
    assert old in SLURM_INV
    with pytest.raises(InventoryError) as exc:
        load(tmp_path, SLURM_INV.replace(old, new))
    assert exc.value.where.endswith(f"inv.yaml:{line}"), exc.value.where
    assert field in exc.value.message and exc.value.fix
    assert exc.value.exit_code == 2


def test_scheduler_with_listed_nodes_is_refused(tmp_path: Path, key: Path) -> None:
    with pytest.raises(InventoryError) as exc:
        load(tmp_path, SLURM_INV + "head: 10.1.0.9\n")
    assert "scheduler allocates them" in exc.value.message
    with pytest.raises(InventoryError) as missing:
        load(tmp_path, SLURM_INV.replace("  login: {name: login1, address: 10.1.0.5}\n", ""))
    assert "scheduler.login" in missing.value.message


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 5400), ("5:30", 330), ("1:00:00", 3600), ("2-3", 2 * 86400 + 3 * 3600),
     ("1-0:30", 86400 + 1800), ("1-00:00:10", 86410)],
)  # fmt: skip
def test_time_limits_as_sbatch_reads_them(text: str, seconds: int) -> None:
    assert time_seconds(text) == seconds


def test_lab_slurm_conf_and_inventory() -> None:
    cfg = LabConfig(name="s", subnet="10.250.9.0/24", nodes=2, runtime="host", slurm=True)
    login, *compute = cfg.lab_nodes()
    assert (login.role, [n.role for n in compute]) == ("login", ["compute", "compute"])
    conf = slurm_conf(cfg)
    assert "SlurmctldHost=provisioner-s-0(10.250.9.10)" in conf
    assert "NodeName=provisioner-s-2 NodeAddr=10.250.9.12 CPUs=2" in conf
    assert "Nodes=provisioner-s-1,provisioner-s-2" in conf and "OverSubscribe=FORCE:2" in conf
    doc = slurm_inventory_document(cfg, cluster="two", nodes=1)
    assert doc["scheduler"]["login"] == {"name": login.name, "address": login.address}
    assert (doc["cluster"], doc["scheduler"]["nodes"], doc["runtime"]) == ("two", 1, "host")


def test_port_blocks_of_jobs_do_not_overlap() -> None:
    blocks = {}
    for job in range(1, 121):
        ports = job_ports(job)
        used = {*ports.named().values(), *ports.worker_range}
        assert min(used) == port_base(job) and max(used) < port_base(job) + BLOCK_SIZE
        assert len(ports.named()) + len(ports.worker_range) == len(used)
        blocks[job] = used
    assert all(not (blocks[1] & blocks[j]) for j in range(2, 121))
    assert max(port_base(j) for j in blocks) + BLOCK_SIZE <= 32768  # below ephemeral ports
    from provisioner.slurm.sbatch import JOB_DIR_MAX, JOB_DIR_NAME, RAY_DIR

    session = "session_2026-12-01_05-45-14_312333_4194304"  # the largest pid
    ray_dir = f"{'x' * JOB_DIR_MAX}/{RAY_DIR}"
    socket = f"{ray_dir}/{session}/sockets/dash_PlatformEventsHead"  # Ray's longest
    assert len(socket) <= 107
    longest_id = JOB_DIR_NAME.replace("$SLURM_JOB_ID", "67043328")  # SLURM's MaxJobId
    assert len(f"/tmp/{longest_id}") <= JOB_DIR_MAX  # /tmp always fits


def job(**changes: object) -> SbatchJob:
    base = SbatchJob(
        name="hpc",
        slurm=Slurm(partition="gpu", nodes=3, time="1:00:00", cpus_per_node=8, account="a"),
        playbook="ppo_cartpole.py",
        args=("--target-return", "450", "--name", "it's"),
        payload="QUJD",
        python=None,
    )
    return SbatchJob(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_directives_ask_for_the_allocation() -> None:
    slurm = Slurm(partition="gpu", nodes=3, time="1:00:00", cpus_per_node=8, gpus_per_node=2,
                  account="a", extra_sbatch_args=("--qos=debug",))  # fmt: skip
    assert sbatch_directives(slurm, "hpc") == [
        "--job-name=hpc",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--gpus-per-node=2",
        "--partition=gpu",
        "--time=1:00:00",
        "--account=a",
        "--qos=debug",
    ]


def test_sbatch_script_quotes_args_and_starts_ray_from_the_job_block() -> None:
    text = render_sbatch(job())
    assert text.startswith("#!/bin/bash -l\n")
    assert "#SBATCH --nodes=3\n" in text and "#SBATCH --partition=gpu\n" in text
    assert "ppo_cartpole.py --target-return 450 --name 'it'\"'\"'s'\n" in text
    assert "BASE=$(( 20000 + ($SLURM_JOB_ID % 120) * 100 ))" in text
    assert "--port=$((BASE + 0))" in text and "--max-worker-port=$((BASE + 99))" in text
    assert "JOB_DIR=$(private_dir)\n" in text and "/tmp/rayjob" not in text
    assert "ray stop" not in text.replace("run\n", "")  # never every Ray on the node
    assert "RAY_AUTH_MODE=token" in text and "export PLAYBOOK_TGZ=QUJD\n" in text
    pinned = render_sbatch(job(python="/opt/venv/bin/python"))
    assert "PY=/opt/venv/bin/python\n" in pinned and "command -v ray" not in pinned


def test_sbatch_script_is_valid_bash(tmp_path: Path) -> None:
    script = tmp_path / "t.sbatch"
    script.write_text(render_sbatch(job(payload=pack_playbook(PLAYBOOKS / "ppo_cartpole.py"))))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_packed_playbook_holds_its_folder(tmp_path: Path) -> None:
    import base64
    import io
    import tarfile

    payload = pack_playbook(PLAYBOOKS / "ppo_cartpole.py")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(payload))) as tar:
        names = tar.getnames()
    assert "ppo_cartpole.py" in names and "rlrun.py" in names
    assert not any("__pycache__" in n for n in names)


def test_verbs_on_nodes_refuse_a_slurm_inventory_without_allocation(
    tmp_path: Path, key: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.cli import run

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    path = tmp_path / "inv.yaml"
    path.write_text(SLURM_INV)
    for verb in (["status"], ["doctor"], ["render"], ["logs"]):
        assert run([*verb, "-i", str(path)]) == 2, verb
        assert "has no SLURM allocation" in capsys.readouterr().err
    assert run(["down", "-i", str(path)]) == 0  # nothing recorded: nothing to give back
    assert "no SLURM job recorded" in capsys.readouterr().out


def test_holding_job_and_queue_commands_are_quoted() -> None:
    from provisioner.slurm import commands

    slurm = Slurm(partition="lab", nodes=3, time="00:30:00", cpus_per_node=2,
                  extra_sbatch_args=("--qos=a b",))  # fmt: skip
    assert commands.submit_command(slurm, "c1") == (
        "sbatch --parsable --job-name=provisioner-c1 --nodes=3 --ntasks-per-node=1 "
        "--cpus-per-task=2 --partition=lab --time=00:30:00 '--qos=a b' --output=/dev/null "
        "--wrap='exec sleep infinity'"
    )
    assert commands.submit_command(slurm, "c1", "ab12").endswith(
        "'--qos=a b' --comment=provisioner-ab12 --output=/dev/null --wrap='exec sleep infinity'"
    )
    assert commands.queue_command(7, "lab") == (
        "id -un; echo ==; squeue -h -j 7 -o '%T|%r|%N|%L|%l|%j|%u|%k' 2>/dev/null; echo ==; "
        "squeue -h -t PD -p lab -o %i --sort=-p,i 2>/dev/null; true"
    )
    owner = commands.Owner("provisioner-c1", "ab12")
    assert commands.cancel_command(7, owner) == (
        'scancel --name=provisioner-c1 --user="$(id -un)" 7'
    )


OURS = "|provisioner-c1|alice|provisioner-ab12"


def test_queue_states_as_squeue_prints_them() -> None:
    from provisioner.slurm.commands import Owner, QueueState, parse_queue, time_seconds_left

    me = Owner("provisioner-c1", "ab12")
    pending = parse_queue(f"alice\n==\nPENDING|Resources|||30:00{OURS}\n==\n9\n7\n", 7, me)
    assert pending == QueueState("PENDING", "Resources", "", "", "30:00", position=2)
    assert pending.describe() == "PENDING (Resources), place 2 in the queue"
    running = parse_queue(f"alice\n==\nRUNNING|None|n-[1-3]|29:41|30:00{OURS}\n==\n", 7, me)
    assert (running.state, running.nodelist, running.describe()) == (
        "RUNNING",
        "n-[1-3]",
        "RUNNING",
    )
    assert parse_queue("alice\n==\n\n==\n", 7, me).gone
    assert time_seconds_left("29:41") == 1781 and time_seconds_left("1-02:00:00") == 93600
    assert time_seconds_left("UNLIMITED") is None


def test_allocated_nodes_are_read_by_name_and_address() -> None:
    from provisioner.inventory.allocation import AllocatedNode
    from provisioner.slurm.commands import nodes_command, parse_nodes

    assert "scontrol show hostnames 'n-[1-3]'" in nodes_command("n-[1-3]")
    text = "n-1 10.0.0.1 10.0.0.1\nn-2 n-2.ib n-2-ip\nn-3 n-3 ?\nnoise\n"
    assert parse_nodes(text) == (
        AllocatedNode("n-1", "10.0.0.1"),
        AllocatedNode("n-2", "n-2-ip"),
        AllocatedNode("n-3", "n-3"),
    )


def test_inventory_with_allocation_reaches_nodes_through_the_login_node(
    tmp_path: Path, key: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.inventory.allocation import (
        AllocatedNode,
        Allocation,
        forget_allocation,
        write_allocation,
    )
    from provisioner.inventory.loader import require_nodes

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    inv = load(tmp_path, SLURM_INV)
    nodes = (AllocatedNode("n-1", "10.1.0.21"), AllocatedNode("n-2", "10.1.0.22"))
    write_allocation(inv, Allocation(42))  # submitted, not running yet: still no nodes
    assert not load(tmp_path, SLURM_INV).allocated  # type: ignore[attr-defined]
    write_allocation(inv, Allocation(42, nodes))
    assert oct((inv.state_dir / "slurm.json").stat().st_mode & 0o777) == "0o600"
    got = require_nodes(load(tmp_path, SLURM_INV))  # type: ignore[arg-type]
    assert [(n.name, n.address, n.role) for n in got.nodes] == [
        ("n-1", "10.1.0.21", "head"),
        ("n-2", "10.1.0.22", "worker"),
    ]
    hop = got.head.ssh.hops[-1]
    assert (hop.address, hop.user, got.head.ssh.jump) == ("10.1.0.5", "alice", "alice@10.1.0.5:22")
    assert got.ports == job_ports(42)
    forget_allocation(inv)
    assert not load(tmp_path, SLURM_INV).allocated  # type: ignore[attr-defined]


def test_another_jobs_ray_on_a_shared_node_is_a_warning_only() -> None:
    from dataclasses import replace

    from provisioner.checks.facts import NodeFacts
    from provisioner.checks.port_checks import check_stale_ray
    from provisioner.inventory import Node, SSHSettings

    node = Node("n-1", "10.1.0.21", "head", SSHSettings(user="alice"))
    other = "2100 raylet /x/raylet --raylet_socket_name=/tmp/rayjob-9/session_x/sockets/raylet"
    facts = replace(NodeFacts(host="n-1"), ray_processes=(other,))
    (alone,) = check_stale_ray(node, facts)
    (shared,) = check_stale_ray(node, facts, shared=True)
    assert (alone.severity, shared.severity) == ("error", "warning")
    assert "rayjob-9" in shared.evidence


def test_sbatch_script_with_tls_off_is_valid_bash_and_makes_no_ca(tmp_path: Path) -> None:
    text = render_sbatch(job(tls=False))
    script = tmp_path / "t.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "openssl" not in text and "RAY_TLS_SERVER_CERT=$JOB_DIR" not in text
    assert "node_input" in render_sbatch(job())  # the control: on by default


def test_the_jobs_tls_files_chain_to_its_own_ca_and_name_every_node(tmp_path: Path) -> None:
    """The script's TLS part, run here with this machine's openssl (scontrol and the
    node addresses stood in): one CA per job, its key gone once it has signed; one node
    certificate naming every node's address; what each node reads on stdin."""
    import base64
    import io
    import ipaddress
    import re
    import tarfile

    from cryptography import x509

    from provisioner.slurm.sbatch import _tls_section

    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    (job_dir / "auth_token").write_text("t0ken\n")
    script = "\n".join(
        [
            "set -euo pipefail",
            'scontrol() { printf "c1\\nc2\\n"; }',
            "node_addr() { case $1 in c1) echo 10.9.0.1 ;; c2) echo 10.9.0.2 ;; esac; }",
            f"JOB_DIR={job_dir} SLURM_JOB_ID=77 SLURM_JOB_NODELIST=c[1-2]",
            f"RAY_AUTH_TOKEN_PATH={job_dir}/auth_token",
            _tls_section(True),
            'echo "$RAY_USE_TLS $RAY_TLS_CA_CERT"',
        ]
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"1 {job_dir}/tls/ca.crt"
    assert sorted(p.name for p in (job_dir / "tls").iterdir()) == ["ca.crt", "node.crt", "node.key"]
    assert (job_dir / "tls" / "node.key").stat().st_mode & 0o077 == 0
    token, files = (job_dir / "node_input").read_text().splitlines()
    assert token == "t0ken"
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(files))) as tar:
        sent = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    assert sorted(sent) == ["ca.crt", "node.crt", "node.key"]
    ca = x509.load_pem_x509_certificate(sent["ca.crt"])
    node = x509.load_pem_x509_certificate(sent["node.crt"])
    node.verify_directly_issued_by(ca)  # raises when it is not the job CA's
    names = node.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(a) for a in names.get_values_for_type(x509.IPAddress)}
    assert ips == {"127.0.0.1", "10.9.0.1", "10.9.0.2"}
    assert ipaddress.ip_address("10.9.0.2") in names.get_values_for_type(x509.IPAddress)
    assert re.search(r"ray job 77 CA", ca.subject.rfc4514_string())
    assert not node.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_one_playbook_packs_to_the_same_bytes_at_another_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = pack_playbook(PLAYBOOKS / "ppo_cartpole.py")
    import time as clock

    later = clock.time() + 3600.0
    monkeypatch.setattr(clock, "time", lambda: later)  # gzip's header would carry this
    assert pack_playbook(PLAYBOOKS / "ppo_cartpole.py") == first
