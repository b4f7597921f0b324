"""SLURM against the parties it must hold off, on the SLURM lab (real slurmctld, slurmd
and munge): another user on a compute node, and a hostile login node.

- Another (non-root) user on every compute node pre-creates the sbatch script's job
  directories (the predictable names of earlier versions, for the next job ids, and
  Ray's default /tmp/ray), world-writable, with a `sitecustomize.py` that would steal
  the token. Positive control: that planted file does run as the job's user when its
  folder is on PYTHONPATH, as the old script put it. The job trains to the end; the
  planted code never runs; nothing of the job's user lands in the planted folders.
- The login node answers `scontrol` with hostile node names and addresses (a wrapper
  earlier on the SSH user's PATH, removed afterwards): `up` refuses them (exit 2, the
  login node named), cancels its job, records nothing, and nothing is written outside
  the logs folder; a record holding such a name is refused where it is read back.
  Positive control: through the same wrapper, plain names give a cluster whose logs
  land in LOGS/NODE.
- The login node answers a scoped IPv6 address whose scope id is a command substitution
  (`fe80::1%$(touch ...)`, which Python's `ipaddress` accepts): `up` refuses it (exit 2,
  the scope id named), cancels its job and records nothing; the marker file exists on no
  node nor here. The command `up` runs on the head to wait for a port, run by the lab
  user's bash on the login node with that address, runs nothing either. Positive control:
  the same text read as code by that bash does create the marker.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.inventory import load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.engine import exec_rc
from provisioner.lab.nodes import LabInfo
from provisioner.node.commands import wait_for_port_command
from tests.e2e.faults.record import scenario
from tests.e2e.helpers import cli, ssh_args
from tests.e2e.test_slurm import cli_json, inventory_for, on_login, wait_gone

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
OTHER = "mallory"  # the other user on the compute nodes
LOOT = "/tmp/mallory-loot"  # where the planted code reports (writable by all)
VENV_PY = "/home/lab/ray-venv/bin/python"  # the lab's host-mode Ray
PLANTED = f"""import os, pwd
try:
    me = pwd.getpwuid(os.getuid()).pw_name
    path = os.environ.get("RAY_AUTH_TOKEN_PATH", "")
    token = os.environ.get("RAY_AUTH_TOKEN", "")
    if not token and path:
        with open(path) as f:
            token = f.read().strip()
    with open(os.path.join({LOOT!r}, "ran-%s-%d" % (me, os.getpid())), "w") as f:
        f.write("%s token=%r\\n" % (me, token))
except Exception:
    pass
"""


def as_root(node: LabNode, script: str, timeout: float = 60) -> str:
    rc, out = exec_rc(node.container, script, timeout=timeout)
    assert rc == 0, f"{node.name}: {script[:200]!r}: {out[-1500:]}"
    return out


def as_user(node: LabNode, user: str, script: str) -> str:
    return as_root(node, f"su -s /bin/bash {user} -c {shlex.quote(script)}")


@pytest.fixture
def other_user(slurm_lab: LabInfo) -> Iterator[str]:
    """A second unprivileged user on every compute node; removed with its files after."""
    compute = slurm_lab.nodes[1:]
    for node in compute:
        as_root(node, f"id {OTHER} >/dev/null 2>&1 || useradd -m -s /bin/bash {OTHER}")
    yield OTHER
    for node in compute:
        exec_rc(
            node.container,
            f"find /tmp -mindepth 1 -maxdepth 1 -user {OTHER} -exec rm -rf {{}} +; "
            f"userdel -r {OTHER} 2>/dev/null; true",
        )


def plant(node: LabNode, job_ids: range) -> None:
    """As the other user: every name the job might use, made first, open to all."""
    dirs = [f"/tmp/rayjob-{j}" for j in job_ids] + [f"/tmp/rayjob-{j}.XXXXXX" for j in job_ids]
    script = (
        f"umask 000; mkdir -p -m 0777 {LOOT} /tmp/ray; "
        f'for d in {" ".join(dirs)}; do mkdir -p -m 0777 "$d/playbook" "$d/ray"; '
        f'printf %s {shlex.quote(PLANTED)} >"$d/playbook/sitecustomize.py"; done; '
        f"chmod 0777 {' '.join(dirs)}"
    )
    as_user(node, OTHER, script)


def loot(node: LabNode) -> str:
    return as_root(node, f"cat {LOOT}/* 2>/dev/null; true").strip()


def test_another_user_who_pre_creates_job_directories_runs_nothing(
    slurm_lab: LabInfo, other_user: str, tmp_path: Path
) -> None:
    login, *compute = slurm_lab.nodes
    with scenario(
        "another user on a SLURM compute node pre-creates the sbatch script's job directories",
        "the job trains to the end in private directories of its own; the planted "
        "sitecustomize.py never runs and nothing of the job's user lands in the planted "
        "folders; the token is in no process's environment",
        kind="security",
    ) as s:
        # the next job ids, as anyone can read them from the queue: the last one plus 1..10
        last = int(on_login(slurm_lab, "sbatch --parsable -o /dev/null --wrap true").split(";")[0])
        wait_gone(slurm_lab, str(last), timeout=60)
        ids = range(last + 1, last + 11)
        for node in compute:
            plant(node, ids)

        # positive control: what the old script did (`mkdir -p`, then the folder first on
        # PYTHONPATH) runs the planted code as the job's user, with the token in reach
        first = compute[0]
        old = f"/tmp/rayjob-{ids[-1]}"  # one the job will not get (it gets the first)
        as_user(first, "lab", f"mkdir -p {old}/playbook && echo tok >/home/lab/t && chmod 600 "
                f"/home/lab/t && RAY_AUTH_TOKEN_PATH=/home/lab/t PYTHONPATH={old}/playbook "
                f"PYTHONDONTWRITEBYTECODE=1 "
                f"{VENV_PY} -c pass; rm -f /home/lab/t")  # fmt: skip
        control = loot(first)
        s.expect("control", control.startswith("lab token='tok'"), True, control)
        as_root(first, f"rm -f {LOOT}/*")

        script = tmp_path / "train.sbatch"
        code, _, err = cli(
            "render", "-i", str(slurm_lab.inventory), "--slurm", "-o", str(script),
            str(PLAYBOOKS / "ppo_cartpole.py"), "--",
            "--max-iterations", "2", "--train-batch", "400", "--env-runners", "3",
        )  # fmt: skip
        assert code == 0, err
        subprocess.run(
            [*ssh_args(slurm_lab, login), "cat > train.sbatch"],
            input=script.read_bytes(),
            check=True,
            timeout=30,
        )
        job_id = int(on_login(slurm_lab, "sbatch --parsable train.sbatch").split(";")[0])
        assert job_id in ids, (job_id, ids)  # its old, predictable name was planted

        # while it runs: each node's Ray in a directory of the job's user, mode 0700, and
        # its raylet's environment names the token's file, never the token
        seen: dict[str, str] = {}
        deadline = time.monotonic() + 240
        while len(seen) < len(compute) and time.monotonic() < deadline:
            for node in compute:
                if node.name in seen:
                    continue
                rc, out = exec_rc(
                    node.container,
                    f"p=$(pgrep -u lab -f 'raylet.*rayjob-{job_id}[.]' | head -n 1); "
                    '[ -n "$p" ] || exit 1; '
                    f"d=$(find /tmp -maxdepth 1 -name 'rayjob-{job_id}.*' -user lab); "
                    "echo \"dirs: $(stat -c '%U %a' $d | sort -u | tr '\\n' ' ')\"; "
                    "tr '\\0' '\\n' </proc/$p/environ | grep -o '^RAY_AUTH_TOKEN[A-Z_]*=' || true",
                )
                if rc == 0:
                    seen[node.name] = out
            time.sleep(1)
        s.expect("running", len(seen), len(compute), str(seen))
        for name, out in seen.items():
            assert "dirs: lab 700 " in out and "RAY_AUTH_TOKEN_PATH=" in out, (name, out)
            assert "RAY_AUTH_TOKEN=" not in out, (name, out)
        s.saw(dirs="lab 700", env="RAY_AUTH_TOKEN_PATH")

        wait_gone(slurm_lab, str(job_id), timeout=300)
        results = f"/home/lab/provisioner-results/{slurm_lab.name}-{job_id}"
        rc, summary = exec_rc(first.container, f"cat {results}/summary.json")
        _, log = exec_rc(first.container, f"cat /home/lab/{slurm_lab.name}-{job_id}.out")
        assert rc == 0, f"no summary.json: {summary}\n{log[-3000:]}"
        s.expect("iterations", json.loads(summary)["iterations"], 2)
        assert f"driver exited with 0; results in {results}" in log, log[-3000:]
        assert log.count(f"in /tmp/rayjob-{job_id}.") == len(compute), log[-3000:]

        planted = f"/tmp/rayjob-{job_id} /tmp/rayjob-{job_id}.XXXXXX /tmp/ray"
        ran, wrote, kept, left_over = 0, 0, 0, 0
        for node in compute:
            assert loot(node) == "", f"{node.name}: the planted code ran: {loot(node)}"
            ran += loot(node) != ""
            ours = as_root(node, f"find {planted} -user lab")
            assert ours.strip() == "", f"{node.name}: the job wrote into planted folders: {ours}"
            wrote += ours.strip() != ""
            intact = as_root(node, f"ls /tmp/rayjob-{job_id}/playbook")
            assert "sitecustomize.py" in intact  # the planted file was there all along
            kept += "sitecustomize.py" in intact
            left = as_root(node, f"find /tmp -maxdepth 1 -name 'rayjob-{job_id}.*' -user lab")
            assert left.strip() == "", f"{node.name}: job directories left: {left}"
            left_over += left.strip() != ""
        s.saw(ran=ran, wrote=wrote, kept=kept, left=left_over)
        s.observed = (
            "positive control: the planted sitecustomize.py ran as the job's user and read "
            "a token file once its folder was on PYTHONPATH: {control}; the job, whose old "
            "directory name was planted on every node, trained to the end ({iterations} "
            "iterations); Ray seen running on {running} nodes, each in directories of "
            "`{dirs}`, its raylet's environment naming {env}, never the token; the planted "
            "sitecustomize.py still there on {kept} nodes yet ran on {ran}; nodes where the "
            "job wrote into the planted folders: {wrote}; with its directories left: {left}"
        )
        s.measure(ids=len(ids), nodes=len(compute))
        s.measured = "{ids} job ids x 2 names planted on {nodes} nodes"


SCONTROL_WRAPPER = """#!/bin/sh
# e2e test wrapper (tests/e2e/test_slurm_security.py): scontrol's answers through sed
echo "$*" >>/tmp/scontrol-calls
/usr/bin/scontrol "$@" | sed -f /tmp/scontrol.sed
"""


@pytest.fixture
def hostile_login(slurm_lab: LabInfo) -> Iterator[LabNode]:
    """`scontrol` on the login node's PATH (before /usr/bin) edits its answers with the
    sed script /tmp/scontrol.sed; removed afterwards."""
    login = slurm_lab.nodes[0]
    as_root(
        login,
        f"printf %s {shlex.quote(SCONTROL_WRAPPER)} >/usr/local/bin/scontrol && "
        "chmod 0755 /usr/local/bin/scontrol && : >/tmp/scontrol.sed && chmod 0644 /tmp/scontrol.sed"
        " && : >/tmp/scontrol-calls && chmod 0666 /tmp/scontrol-calls",
    )
    yield login
    as_root(login, "rm -f /usr/local/bin/scontrol /tmp/scontrol.sed /tmp/scontrol-calls")


def test_a_login_node_that_answers_hostile_node_names_writes_nothing_outside_the_logs(
    slurm_lab: LabInfo, hostile_login: LabNode, tmp_path: Path
) -> None:
    login = hostile_login
    inventory = inventory_for(slurm_lab, "names", 1)
    cluster = f"{slurm_lab.name}-names"
    record = load_inventory(Path(inventory)).state_dir / "slurm.json"
    logs = tmp_path / "deep" / "logs"
    absolute = tmp_path / "abs-escape"
    with scenario(
        "the SLURM login node answers with hostile node names and addresses",
        "`up` refuses them (exit 2, naming the login node), cancels its job and records "
        "nothing; nothing is written outside the logs folder; a record holding such a name "
        "is refused where it is read back (exit 2); plain names through the same path work",
        kind="security",
    ) as s:
        try:
            # positive control: through the wrapper, plain names make a cluster whose logs
            # land in LOGS/NODE
            code, _, err = cli_json("up", "-i", inventory)
            assert code == 0, err[-3000:]
            assert "show hostnames" in as_root(login, "cat /tmp/scontrol-calls")  # it answered
            node = json.loads(record.read_text())["nodes"][0]["name"]
            code, _, err = cli("logs", "-i", inventory, "-o", str(logs))
            s.expect("control", code, 0, err[-3000:])
            assert [p.name for p in logs.iterdir()] == [node] and (logs / node).is_dir()
            code, down, err = cli_json("down", "-i", inventory, "--no-logs")
            assert code == 0 and down["slurm"]["left_queue"], err[-3000:]

            cases = {
                "../../escape": rf"s|^{node}$|../../escape|",
                "an absolute path": rf"s|^{node}$|{absolute}|",
                "..": rf"s|^{node}$|..|",
                "-oProxyCommand=x as the address": r"s|NodeAddr=[^ ]*|NodeAddr=-oProxyCommand=x|",
            }
            exits, wheres, queued, recorded = set(), set(), 0, 0
            for what, sed in cases.items():
                as_root(login, f"printf '%s\\n' {shlex.quote(sed)} >/tmp/scontrol.sed")
                code, out, err = cli("up", "-i", inventory, "--json")
                assert code == 2, (what, code, err[-3000:])
                exits.add(code)
                error = json.loads(out)["error"]
                assert error["kind"] == "InputError" and error["where"] == login.name, error
                wheres.add("the login node" if error["where"] == login.name else error["where"])
                assert "refused a node of the SLURM allocation" in error["message"], error
                assert "cancelling it" in err, (what, err[-2000:])
                left = on_login(slurm_lab, f"squeue -h -n provisioner-{cluster} -o %i")
                assert not left.strip(), f"{what}: a job left queued: {left}"
                queued += bool(left.strip())
                assert not record.exists(), f"{what}: recorded"
                recorded += record.exists()
                code, _, err = cli("logs", "-i", inventory, "-o", str(logs / "x"))
                assert code == 2 and "has no SLURM allocation" in err, (what, err[-2000:])
            s.saw(hostile=list(cases), exits=exits, where=wheres, queued=queued, recorded=recorded)
            as_root(login, ": >/tmp/scontrol.sed")

            # read back: a record that holds such a name (as an older provisioner wrote it)
            code, _, err = cli_json("up", "-i", inventory)
            assert code == 0, err[-3000:]
            good = record.read_text()
            data = json.loads(good)
            data["nodes"][0]["name"] = "../../escape"
            record.write_text(json.dumps(data))
            code, out, err = cli("logs", "-i", inventory, "-o", str(logs / "y"), "--json")
            s.expect("read_back", code, 2, err[-3000:])
            assert "recorded SLURM allocation" in json.loads(out)["error"]["message"], out
            record.write_text(good)  # positive control: the same record with its own name
            code, _, err = cli("logs", "-i", inventory, "-o", str(logs / "y"))
            node = json.loads(good)["nodes"][0]["name"]
            assert code == 0 and [p.name for p in (logs / "y").iterdir()] == [node], err[-3000:]
            s.saw(own_name=code)
        finally:
            as_root(login, ": >/tmp/scontrol.sed")
            cli("down", "-i", inventory, "--no-logs")
        s.expect("escaped", absolute.exists() or (tmp_path / "escape").exists(), False)
        s.expect("beside", [p.name for p in (tmp_path / "deep").iterdir()], ["logs"])
        assert sorted(p.name for p in logs.iterdir()) == sorted([node, "y"])
        s.observed = (
            "positive control: through the same scontrol wrapper, plain names gave a "
            "cluster whose logs landed in LOGS/NODE (logs exit {control}); as the answer: "
            "{hostile}: each `up` exit {exits} naming {where}, jobs left queued: {queued}, "
            "records written: {recorded}; a record holding such a name refused where it is "
            "read back (exit {read_back}), the same record with its own name collected (exit "
            "{own_name}); in the logs folder's parent only {beside}; a file written at the "
            "escaping paths: {escaped}"
        )
        s.measure(refused=len(cases))
        s.measured = "{refused} hostile answers refused"


PWNED = "/tmp/provisioner-pwned-scope"
# a scope id that `ipaddress` accepts (no '/': `${PWD:0:1}` is one where the shell runs)
SCOPED = "fe80::1%$(touch${IFS}${PWD:0:1}tmp${PWD:0:1}provisioner-pwned-scope)"


def marked(lab: LabInfo) -> list[str]:
    """Where the marker file exists: the lab's nodes and this machine."""
    found = [n.name for n in lab.nodes if exec_rc(n.container, f"test -e {PWNED}")[0] == 0]
    return found + (["here"] if Path(PWNED).exists() else [])


def test_a_login_node_that_answers_a_scoped_address_runs_nothing(
    slurm_lab: LabInfo, hostile_login: LabNode
) -> None:
    login = hostile_login
    inventory = inventory_for(slurm_lab, "scoped", 1)
    cluster = f"{slurm_lab.name}-scoped"
    record = load_inventory(Path(inventory)).state_dir / "slurm.json"
    with scenario(
        "the SLURM login node answers a scoped IPv6 address whose scope id is a command",
        "`up` refuses it (exit 2, naming the login node and the scope id), cancels its job "
        "and records nothing; the command runs nowhere, nor does it when the wait-for-port "
        "command `up` runs on a head is given that address",
        kind="security",
    ) as s:
        try:
            for node in slurm_lab.nodes:
                exec_rc(node.container, f"rm -f {PWNED}")
            Path(PWNED).unlink(missing_ok=True)
            # positive control: that text, read as code by the lab user's bash, runs
            as_user(login, "lab", f"cd /tmp && bash -c {shlex.quote('echo ' + SCOPED)}")
            assert marked(slurm_lab) == [login.name]
            s.saw(control=["the login node" if m == login.name else m for m in marked(slurm_lab)])
            as_root(login, f"rm -f {PWNED}")
            assert marked(slurm_lab) == []

            # the command `up` runs on the head to wait for a port, given that address,
            # run by the same bash: the address is an argument, never code
            wait = wait_for_port_command(SCOPED, 9, 0.2, "true")
            rc, out = exec_rc(login.container, f"su -s /bin/bash lab -c {shlex.quote(wait)}")
            s.expect("wait", rc, 1, out[-1500:])  # it timed out: port 9 never answers
            s.expect("after_wait", len(marked(slurm_lab)), 0, "the wait-for-port command ran it")

            sed = f"s|NodeAddr=[^ ]*|NodeAddr={SCOPED}|"
            as_root(login, f"printf '%s\\n' {shlex.quote(sed)} >/tmp/scontrol.sed")
            code, out, err = cli("up", "-i", inventory, "--json")
            s.expect("exit", code, 2, err[-3000:])
            assert "show node" in as_root(login, "cat /tmp/scontrol-calls")  # it answered
            error = json.loads(out)["error"]
            assert error["kind"] == "InputError" and error["where"] == login.name, error
            assert "refused a node of the SLURM allocation" in error["message"], error
            s.expect(
                "scope",
                "scope id that is not an interface's name" in error["message"],
                True,
                str(error),
            )
            assert "Traceback" not in err and "cancelling it" in err, err[-2000:]
            left = on_login(slurm_lab, f"squeue -h -n provisioner-{cluster} -o %i")
            s.expect("queued", left.strip(), "", "a job left queued")
            s.expect("recorded", record.exists(), False)
            s.expect("marked", marked(slurm_lab), [], "the scope id ran")
        finally:
            as_root(login, ": >/tmp/scontrol.sed")
            cli("down", "-i", inventory, "--no-logs")
            for node in slurm_lab.nodes:
                exec_rc(node.container, f"rm -f {PWNED}")
        s.observed = (
            "positive control: the address read as code by the lab user's bash on the login "
            "node created the marker file on {control}; the wait-for-port command given that "
            "address exited {wait} (timed out), the marker then on {after_wait} nodes; `up` "
            "with the login node answering it: exit {exit} naming the login node and the "
            "scope id as not an interface's name: {scope}, its job cancelled (queued: "
            "`{queued}`), a record written: {recorded}; the marker on no node nor here: "
            "[{marked}]"
        )
