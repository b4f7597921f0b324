"""SLURM on a lab of its own: Debian's slurmctld, slurmd and munge on real nodes, a login
node, and compute nodes that answer SSH only from inside the cluster.

What a user does: submit with the scheduler's own commands (sbatch, squeue) on the login
node, over real SSH; the cluster's compute nodes run Ray from their own virtualenv.
"""

from __future__ import annotations

import io
import json
import subprocess
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from provisioner.cli import run
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from tests.e2e.helpers import ssh, ssh_args

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue(), err.getvalue()


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
    wait_gone(slurm_lab, job_id, timeout=300)
    state = on_login(slurm_lab, f"scontrol show job {job_id} 2>/dev/null || true")
    first = compute[0]  # the batch host: the first node of an idle partition
    # the results are where the script says: $HOME/provisioner-results/NAME-JOBID there
    results = f"/home/lab/provisioner-results/{slurm_lab.name}-{job_id}"
    rc, summary = exec_rc(first.container, f"cat {results}/summary.json")
    _, log = exec_rc(first.container, f"tail -n 30 /home/lab/{slurm_lab.name}-{job_id}.out")
    assert rc == 0, f"no summary.json on {first.name}: {summary}\n{state}\n{log}"
    data = json.loads(summary)
    assert data["stopped_by"] == "max_iterations" and data["iterations"] == 3, data
    assert sorted(data["nodes"]) == sorted(n.address for n in compute), data
    assert f"driver exited with 0; results in {results}" in log, log
    for node in compute:  # the job's Ray stopped with it on every node
        _, left = exec_rc(node.container, f"ps -e -ww -o args= | grep -c '[r]ayjob-{job_id}/'")
        assert left.strip() == "0", f"{node.name}: Ray processes of job {job_id} left"
