"""SLURM on a lab of its own: Debian's slurmctld, slurmd and munge on real nodes, a login
node, and compute nodes that answer SSH only from inside the cluster.

What a user does: submit with the scheduler's own commands (sbatch, squeue) on the login
node, over real SSH; the cluster's compute nodes run Ray from their own virtualenv.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from provisioner.inventory.allocation import job_ports
from provisioner.lab.config import LabNode, slurm_inventory_document
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo, load_config
from provisioner.runtime.host import runtime as host
from tests.e2e.faults.lab import interrupt
from tests.e2e.helpers import cli, ssh, ssh_args

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def on_login(lab: LabInfo, command: str, timeout: float = 60) -> str:
    done = ssh(lab, lab.nodes[0], command, timeout=timeout)
    assert done.returncode == 0, f"{command!r} on the login node: {done.stderr[-1500:]}"
    return done.stdout


def wait_gone(lab: LabInfo, job_id: str, timeout: float) -> None:
    """Until the job left squeue (bounded: the machine is shared, no timing is asserted)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not on_login(lab, f"squeue -h -j {job_id} -o %T 2>/dev/null || true").strip():
            return
        time.sleep(2)
    raise AssertionError(f"job {job_id} still queued after {timeout:.0f}s")


def test_lab_is_a_slurm_cluster_behind_its_login_node(slurm_lab: LabInfo) -> None:
    login, *compute = slurm_lab.nodes
    nodes = on_login(slurm_lab, "sinfo -h -N -o '%N %t %P'").split("\n")
    assert sorted(line.split()[0] for line in nodes if line) == [n.name for n in compute]
    assert all(line.split()[1] in ("idle", "mix", "alloc") for line in nodes if line), nodes
    conf = on_login(slurm_lab, "scontrol show partition lab")
    assert "OverSubscribe=FORCE:2" in conf
    direct = ssh(slurm_lab, compute[0], "true", timeout=20)
    assert direct.returncode != 0, "a compute node answers SSH from outside the cluster"
    # from the login node, it does (the route `up` takes), with its own sshd
    _, banner = exec_rc(login.container, f"timeout 5 nc -w 3 {compute[0].address} 22 </dev/null")
    assert banner.startswith("SSH-"), banner


def test_rendered_sbatch_script_trains_to_the_end(slurm_lab: LabInfo, tmp_path: Path) -> None:
    script = tmp_path / "train.sbatch"
    code, _, err = cli(
        "render", "-i", str(slurm_lab.inventory), "--slurm", "-o", str(script),
        str(PLAYBOOKS / "ppo_cartpole.py"), "--",
        "--max-iterations", "3", "--train-batch", "400", "--env-runners", "5",
    )  # fmt: skip
    assert code == 0, err
    login, *compute = slurm_lab.nodes
    subprocess.run(
        [*ssh_args(slurm_lab, login), "cat > train.sbatch"],
        input=script.read_bytes(),
        check=True,
        timeout=30,
    )
    out = on_login(slurm_lab, "sbatch --parsable train.sbatch")
    job_id = out.strip().split(";")[0]
    assert job_id.isdigit(), out
    first = compute[0]  # the batch host: the first node of an idle partition
    seen = gcs_handshakes(first, job_id, tmp_path, timeout=240)
    wait_gone(slurm_lab, job_id, timeout=300)
    state = on_login(slurm_lab, f"scontrol show job {job_id} 2>/dev/null || true")
    # Ray's GCS spoke TLS with the job's own CA, and took only a client of that CA
    ours = seen["job's certificate"]
    assert ours.tls and ours.verified and ours.grpc, seen
    assert f"ray job {job_id} CA" in ours.issuer, ours
    assert seen["none"].tls and not seen["none"].grpc, seen  # refused at the handshake
    # the results are where the script says: $HOME/provisioner-results/NAME-JOBID there
    results = f"/home/lab/provisioner-results/{slurm_lab.name}-{job_id}"
    rc, summary = exec_rc(first.container, f"cat {results}/summary.json")
    # the whole output: Ray's own shutdown lines come after the driver's last line (when
    # srun ends the steps, each node may print a traceback of a drain it could not ask for)
    _, log = exec_rc(first.container, f"cat /home/lab/{slurm_lab.name}-{job_id}.out")
    assert rc == 0, f"no summary.json on {first.name}: {summary}\n{state}\n{log[-3000:]}"
    data = json.loads(summary)
    assert data["stopped_by"] == "max_iterations" and data["iterations"] == 3, data
    assert sorted(data["nodes"]) == sorted(n.address for n in compute), data
    assert f"driver exited with 0; results in {results}" in log, log[-3000:]
    for node in compute:  # the job's Ray stopped with it on every node, its dirs removed
        _, left = exec_rc(node.container, f"ps -e -ww -o args= | grep -c '[r]ayjob-{job_id}[.]'")
        assert left.strip() == "0", f"{node.name}: Ray processes of job {job_id} left"
        _, dirs = exec_rc(node.container, f"ls -d /tmp/rayjob-{job_id}.* 2>/dev/null; true")
        assert not dirs.strip(), f"{node.name}: job directories left: {dirs}"
    # each node ran in a directory of its own (positive control for the two checks above)
    _, full = exec_rc(first.container, f"cat /home/lab/{slurm_lab.name}-{job_id}.out")
    assert full.count(f"in /tmp/rayjob-{job_id}.") == len(compute), full[-3000:]


def gcs_handshakes(node: LabNode, job_id: str, tmp_path: Path, timeout: float) -> dict[str, Any]:
    """While the job runs: TLS handshakes with its GCS on the batch host, trusting the
    job's CA (read as root from the job's private directory there), with the job's
    certificate and with none."""
    from tests.e2e.test_tls import handshake

    port = job_ports(int(job_id)).gcs
    deadline = time.monotonic() + timeout
    files: dict[str, Path] = {}
    while time.monotonic() < deadline:
        _, where = exec_rc(node.container, f"ls -d /tmp/rayjob-{job_id}.*/tls | head -n 1")
        for name in ("ca.crt", "node.crt", "node.key"):
            rc, text = exec_rc(node.container, f"cat {where.strip() or '/nonexistent'}/{name}")
            if rc == 0 and text.rstrip().endswith("-----"):
                (tmp_path / name).write_text(text.strip() + "\n")
                files[name] = tmp_path / name
        rc, _ = exec_rc(
            node.container, f"timeout 1 bash -c 'exec 3<>/dev/tcp/{node.address}/{port}'"
        )
        if len(files) == 3 and rc == 0:
            break
        time.sleep(1)
    assert len(files) == 3, f"the job's TLS files never appeared on {node.name}: {files}"
    ca, cert, key = files["ca.crt"], files["node.crt"], files["node.key"]
    return {
        "job's certificate": handshake(node.address, port, ca, cert, key),
        "none": handshake(node.address, port, ca),
    }


def cli_json(*args: str) -> tuple[int, Any, str]:
    code, out, err = cli(*args, "--json")
    return code, json.loads(out) if out.strip() else {}, err


def ray_processes(node: LabNode, cluster: str) -> int:
    """Processes on the compute node that belong to the cluster's Ray (its temp dir)."""
    mark = host.temp_dir_mark(cluster)
    _, listing = exec_rc(node.container, "ps -e -ww -o args=")
    return sum(1 for line in listing.splitlines() if mark in line)


def inventory_for(lab: LabInfo, suffix: str, nodes: int) -> str:
    """Another cluster on the same SLURM lab (its own name, so its own state)."""
    document = slurm_inventory_document(load_config(lab.name), f"{lab.name}-{suffix}", nodes)
    path = lab.state_dir / f"inventory-{suffix}.yaml"  # beside the key and known_hosts
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def test_up_trains_on_the_allocation_and_down_gives_it_back(
    slurm_lab: LabInfo, tmp_path: Path
) -> None:
    up_train_down(slurm_lab, tmp_path)


def test_up_trains_on_the_other_slurm_release_too(slurm_lab_other: LabInfo, tmp_path: Path) -> None:
    """The same path on the other Slurm release (conftest.SLURM_OTHER_FLAVOUR: Slurm 24.11
    from Debian 13 by default): its sbatch, squeue and scontrol as the code reads them."""
    login = slurm_lab_other.nodes[0]
    _, said = exec_rc(login.container, "sinfo --version")
    release = "24.11" if login.flavour == "trixie" else "22.05"
    # "slurm 22.05.8" on Debian 12, "slurm-wlm 24.11.5" on Debian 13
    assert re.match(rf"slurm(-wlm)? {re.escape(release)}\.", said.strip()), said
    up_train_down(slurm_lab_other, tmp_path)


def up_train_down(slurm_lab: LabInfo, tmp_path: Path) -> None:
    inventory = str(slurm_lab.inventory)
    compute = slurm_lab.nodes[1:]
    try:
        code, up, err = cli_json("up", "-i", inventory)
        assert code == 0, err[-3000:]
        job_id = up["slurm_job"]
        assert isinstance(job_id, int) and "SLURM job" in err and "RUNNING on" in err
        code, st, err = cli_json("status", "-i", inventory)
        assert code == 0 and st["alive_nodes"] == 3, err[-3000:]
        assert st["slurm"]["state"] == "RUNNING" and st["slurm"]["time_left_s"] > 0
        assert sorted(n["host"] for n in st["nodes"]) == sorted(n.address for n in compute)
        gcs_port = int(st["address"].rsplit(":", 1)[1])
        assert gcs_port == job_ports(job_id).gcs  # the job's own port block

        code, out, err = cli(
            "submit", "-i", inventory, "--results", str(tmp_path), "--json",
            str(PLAYBOOKS / "ppo_cartpole.py"),
            "--", "--train-batch", "300", "--max-iterations", "2", "--env-runners", "5",
        )  # fmt: skip
        assert code == 0, err[-3000:]
        job = json.loads(out)
        assert job["status"] == "SUCCEEDED"
        runners = json.loads((tmp_path / job["job_id"] / "runners.json").read_text())
        assert {r["node_ip"] for r in runners} == {n.address for n in compute}, runners
        assert (
            json.loads((tmp_path / job["job_id"] / "summary.json").read_text())["iterations"] == 2
        )

        assert all(ray_processes(node, slurm_lab.name) > 0 for node in compute)
        code, down, err = cli_json("down", "-i", inventory)
        assert code == 0 and down["ok"], err[-3000:]
        assert down["slurm"] == {"job_id": job_id, "left_queue": True}
        assert not on_login(slurm_lab, f"squeue -h -j {job_id} 2>/dev/null || true").strip()
        assert [ray_processes(node, slurm_lab.name) for node in compute] == [0, 0, 0]
        assert any((Path(down["logs"]["directory"]) / n.name).is_dir() for n in compute)
    finally:
        cli("down", "-i", inventory, "--no-logs")


def test_two_allocations_share_nodes_and_a_third_waits_until_cancelled(
    slurm_lab: LabInfo,
) -> None:
    """A and B each hold all 3 nodes (OverSubscribe=FORCE:2 lets two jobs share a core):
    both run, on their own ports; C then finds the partition full, waits PENDING with
    SLURM's reason, and Ctrl-C cancels its job. Taking A down leaves B healthy."""
    a, b, c = (inventory_for(slurm_lab, s, n) for s, n in (("a", 3), ("b", 3), ("c", 1)))
    try:
        jobs = {}
        for inv in (a, b):
            code, up, err = cli_json("up", "-i", inv)
            assert code == 0, err[-3000:]
            jobs[inv] = up["slurm_job"]
        statuses = {}
        for inv in (a, b):
            code, statuses[inv], err = cli_json("status", "-i", inv)
            assert code == 0 and statuses[inv]["alive_nodes"] == 3, err[-3000:]
        assert jobs[a] != jobs[b]  # two SLURM jobs
        hosts = [sorted(n["host"] for n in statuses[inv]["nodes"]) for inv in (a, b)]
        assert hosts[0] == hosts[1]  # the same nodes
        assert statuses[a]["address"] != statuses[b]["address"]  # on other ports
        for node in slurm_lab.nodes[1:]:
            assert ray_processes(node, f"{slurm_lab.name}-a") > 0
            assert ray_processes(node, f"{slurm_lab.name}-b") > 0

        # the partition is full: C waits; SIGINT (Ctrl-C) cancels its job
        run = interrupt("up", "-i", c, when="PENDING (Resources)", timeout=180)
        assert run.code == 130, run.stderr[-3000:]
        (submitted,) = [x for x in run.stderr.splitlines() if "submitted" in x]
        c_job = int(submitted.split("SLURM job ")[1].split()[0])
        assert f"SLURM job {c_job}: cancelling it" in run.stderr, run.stderr[-3000:]
        assert not on_login(slurm_lab, f"squeue -h -j {c_job} 2>/dev/null || true").strip()

        code, down, err = cli_json("down", "-i", a, "--no-logs")
        assert code == 0 and down["slurm"]["left_queue"], err[-3000:]
        code, st, err = cli_json("status", "-i", b)  # B did not notice
        assert code == 0 and st["alive_nodes"] == 3 and st["slurm"]["state"] == "RUNNING", err
        assert [ray_processes(n, f"{slurm_lab.name}-a") for n in slurm_lab.nodes[1:]] == [0, 0, 0]
    finally:
        for inv in (a, b, c):
            cli("down", "-i", inv, "--no-logs")
