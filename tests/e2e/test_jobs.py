"""`provisioner submit -i INVENTORY` on the lab: a real cluster started by `provisioner up`.

The path is the user's: the inventory's SSH tunnel to the head's dashboard, the token
from the inventory's state directory, the playbook's directory uploaded as the job's
working_dir, env runners on the lab's nodes, results home over SSH from the head's disk.
Budgets are tiny (a few hundred env steps): the lab's nodes share two cores.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from provisioner.inventory import load_inventory
from provisioner.jobs import make_spec, submit
from provisioner.jobs.client import AuthRefused
from provisioner.jobs.link import Target
from provisioner.lab.nodes import LabInfo
from tests.e2e.helpers import TUNE_CHECKPOINTS, TUNE_ON_A_WORKER, cli, ssh

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"


@pytest.fixture(scope="module")
def inventory(cluster_inventory: Path) -> str:
    """The lab cluster, up (idempotent: the first module to need it starts it)."""
    code, _, err = cli("up", "-i", str(cluster_inventory))
    assert code == 0, err[-3000:]
    return str(cluster_inventory)


def submit_json(
    inventory: str, results: Path, playbook: Path, *args: str, verbose: bool = False
) -> tuple[int, Any, str]:
    flags = ["--verbose"] if verbose else []
    code, out, err = cli(
        "submit",
        "-i",
        inventory,
        "--results",
        str(results),
        "--json",
        *flags,
        str(playbook),
        "--",
        *args,
    )
    return code, json.loads(out), err


def test_ppo_small_budget_brings_metrics_checkpoint_and_plot_home(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    # Three runners of one CPU each cannot all fit on the head (2 CPUs): they must spread.
    code, doc, err = submit_json(
        inventory,
        tmp_path,
        PLAYBOOKS / "ppo_cartpole.py",
        "--env-runners",
        "3",
        "--train-batch",
        "300",
        "--max-iterations",
        "2",
        verbose=True,
    )
    assert code == 0, err[-3000:]
    assert doc["status"] == "SUCCEEDED" and doc["results_missing"] is None
    job = tmp_path / doc["job_id"]
    rows = (job / "metrics.csv").read_text().splitlines()
    assert rows[0] == "iteration,env_steps,episode_return_mean,time_s,env_steps_per_s"
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    assert len(json.loads((job / "metrics.json").read_text())) == 2
    final = job / "checkpoints" / "iter-000002"
    assert any(p.is_file() and p.stat().st_size > 0 for p in final.rglob("*"))
    assert doc["summary"]["checkpoint"] == "checkpoints/iter-000002"
    assert list((job / "tensorboard").glob("events.out.tfevents.*"))
    png = job / "training.png"
    assert str(png) in doc["plots"] and png.read_bytes()[:4] == b"\x89PNG"
    runners = json.loads((job / "runners.json").read_text())
    addresses = {node.address for node in lab.nodes}
    used = {r["node_ip"] for r in runners}
    assert len(runners) == 3 and used <= addresses and len(used) >= 2, runners
    assert "iter    2" in err  # the job's output was streamed live (stderr in --json mode)
    # Ray's own client lines on the control machine are held back (the job's are not)
    assert "dashboard_sdk.py" not in err and "WebSocket closed" not in err, err[-3000:]


def test_custom_environment_trains(inventory: str, tmp_path: Path) -> None:
    code, doc, err = submit_json(
        inventory,
        tmp_path,
        PLAYBOOKS / "ppo_cells.py",
        "--env-runners",
        "2",
        "--train-batch",
        "1000",
        "--max-iterations",
        "5",
        "--seed",
        "1",
    )
    assert code == 0, err[-3000:]
    summary = doc["summary"]
    assert summary["iterations"] == 5
    # Its own files only: jobs of the same playbooks/ share a working directory on the head.
    events = list((tmp_path / doc["job_id"] / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    assert summary["episode_return_mean"] > summary["first_return_mean"] + 1.0, summary


def test_a_playbook_that_raises_exits_1_with_its_traceback(inventory: str, tmp_path: Path) -> None:
    bad = tmp_path / "book" / "broken.py"
    bad.parent.mkdir()
    bad.write_text("def train():\n    raise ValueError('reward is NaN')\n\ntrain()\n")
    code, _, err = cli("submit", "-i", inventory, "--results", str(tmp_path / "r"), str(bad))
    assert code == 1
    assert "FAILED" in err and "Traceback (most recent call last):" in err
    assert "ValueError: reward is NaN" in err
    assert (tmp_path / "r").is_dir() and list((tmp_path / "r").glob("broken-*/job.log"))


def job_ids(inventory: str) -> set[str]:
    """The cluster's jobs, as `provisioner jobs list` reads them from Ray's Jobs API."""
    code, out, err = cli("jobs", "list", "-i", inventory, "--json")
    assert code == 0, err[-2000:]
    return {j["job_id"] for j in json.loads(out)["jobs"]}


def test_submit_without_the_token_is_refused(inventory: str, tmp_path: Path) -> None:
    spec = make_spec(PLAYBOOKS / "ppo_cartpole.py")
    wrong = tmp_path / "wrong"
    wrong.write_text(secrets.token_hex(32))
    wrong.chmod(0o600)  # a private file: the refusal must come from the cluster, not the mode check
    inv = load_inventory(Path(inventory))
    with pytest.raises(AuthRefused, match="requires a token"):
        submit(Target(inv, None, None), spec, tmp_path)
    with pytest.raises(AuthRefused, match="refused the token"):
        submit(Target(inv, None, wrong), spec, tmp_path)
    before = job_ids(inventory)
    assert spec.job_id not in before  # neither library call created a job
    results = tmp_path / "results"
    code, _, err = cli(
        "submit", "-i", inventory, "--token-file", str(wrong), "--results", str(results),
        str(spec.playbook),
    )  # fmt: skip
    assert code == 1 and "refused the token" in err
    assert not results.exists() or not list(results.iterdir())  # nothing came home
    after = job_ids(inventory)  # and no job was created
    assert after == before, after - before


def test_ctrl_c_detaches_and_the_job_goes_on_until_jobs_stop(
    inventory: str, tmp_path: Path
) -> None:
    """A real SIGINT to a real `provisioner submit` (started as at a terminal: SIGINT at its
    default), as Ctrl-C sends it: the client stops following and says so (exit 130); the
    job outlives it on the head and completes there; `jobs stop` stops a job."""

    from tests.e2e.faults.lab import interrupt

    book = tmp_path / "book" / "outlives.py"
    book.parent.mkdir()
    book.write_text(
        "import time\nprint('started', flush=True)\ntime.sleep(20)\n"
        "print('outlived the client', flush=True)\n"
    )
    run = interrupt(
        "submit", "-i", inventory, "--verbose", "--results", str(tmp_path / "results"), str(book),
        when="started", watch="stdout", timeout=240,
    )  # fmt: skip
    assert run.code == 130, run.text[-2000:]
    said = re.search(r"job (\S+): RUNNING; it runs on the cluster", run.stdout)
    assert said, run.text[-2000:]
    job = said.group(1)
    assert "stopped following; the job was not stopped" in run.stdout, run.stdout[-2000:]
    assert f"provisioner jobs stop {job}" in run.stdout, run.stdout[-2000:]

    def listed() -> dict[str, Any]:
        code, out, err = cli("jobs", "list", "-i", inventory, "--json")
        assert code == 0, err[-2000:]
        return {j["job_id"]: j for j in json.loads(out)["jobs"]}

    assert listed()[job]["status"] == "RUNNING"  # the head's Jobs API: it runs on
    assert listed()[job]["playbook"] == "outlives.py"
    deadline = time.monotonic() + 180  # until it ends on the head (20 s of sleep), or this
    while listed()[job]["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(2)
    assert listed()[job]["status"] == "SUCCEEDED"
    code, out, err = cli("jobs", "logs", job, "-i", inventory)
    assert code == 0 and "outlived the client" in out, (out + err)[-2000:]
    # and a job that runs on is stopped by `jobs stop`
    forever = tmp_path / "book2" / "forever.py"
    forever.parent.mkdir()
    forever.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    run = interrupt(
        "submit", "-i", inventory, "--verbose", "--results", str(tmp_path / "results2"),
        str(forever),
        when="started", watch="stdout", timeout=240,
    )  # fmt: skip
    assert run.code == 130, run.text[-2000:]
    said = re.search(r"job (\S+): RUNNING; it runs on the cluster", run.stdout)
    assert said, run.text[-2000:]
    assert listed()[said.group(1)]["status"] == "RUNNING"
    code, out, err = cli("jobs", "stop", said.group(1), "-i", inventory, "--json")
    assert code == 0 and json.loads(out)["status"] == "STOPPED", err[-2000:]
    assert listed()[said.group(1)]["status"] == "STOPPED"


def test_resume_of_a_job_unknown_here_and_on_the_head(lab: LabInfo, tmp_path: Path) -> None:
    """`submit --resume ID` of a job neither here nor on the head (reached over SSH): exit 2,
    saying first that no such job is known here, where its results would be, the fix; no
    empty results folder left. No cluster needs to run: the head is asked over SSH."""
    from tests.e2e.faults.lab import edited_inventory

    path = edited_inventory(lab.inventory, tmp_path / "inventory.yaml", cluster="neverjobs")
    results = tmp_path / "results"
    code, out, err = cli(
        "submit", "-i", str(path), "--results", str(results), "--json",
        "--resume", "raysubmit_NOSUCHJOB", str(PLAYBOOKS / "ppo_cartpole.py"),
    )  # fmt: skip
    assert code == 2, err[-3000:]
    error = json.loads(out)["error"]
    assert error["message"].startswith(
        "--resume raysubmit_NOSUCHJOB: no such job is known here"
    ) and error["message"].endswith("nor on the head"), error
    assert error["where"] == str(results / "raysubmit_NOSUCHJOB") and "job id" in error["fix"]
    assert "bringing home what the head holds of raysubmit_NOSUCHJOB" in err  # it was asked
    assert not (results / "raysubmit_NOSUCHJOB").exists()


def test_a_link_planted_on_the_head_does_not_redirect_a_resumes_checkpoint(
    inventory: str, tmp_path: Path
) -> None:
    """`submit --resume PATH` sends the checkpoint from here over the head's real sshd
    (`resume.upload`). A link to a folder outside the results, planted at the checkpoint's
    destination while its files go up (here: as the first one is written, after every
    check the upload makes first), is refused and its target left empty; the same upload
    without it lands the checkpoint where the resumed job reads it (its own control)."""
    from provisioner.errors import ProvisionerError
    from provisioner.jobs.resume import upload
    from provisioner.node import layout
    from provisioner.remote import Session

    inv = load_inventory(Path(inventory))
    ckpt = tmp_path / "iter-000002"
    (ckpt / "learner").mkdir(parents=True)
    (ckpt / "learner" / "state.pkl").write_bytes(secrets.token_bytes(4096))
    (ckpt / "rllib_checkpoint.json").write_text('{"type": "Algorithm"}\n')
    tag = secrets.token_hex(4)
    root = layout.node_results_dir(inv.cluster)
    outside = f'"$HOME"/planted-{tag}'  # beside the node directory, outside the results
    jobs = (f"planted-{tag}", f"clean-{tag}")
    session = Session.connect(inv.head)
    put = session.sftp_put
    planted: list[str] = []

    def plant_then_put(local: Path, remote: str, *, mode: int | None = None) -> None:
        if not planted:  # a job's link; the folders the upload made there go with it
            dest = f"{root}/{jobs[0]}/resume/checkpoint"
            session.run(
                f"if [ -e {dest} ]; then rmdir {outside} && mv -T {dest} {outside}; fi; "
                f"ln -s {outside} {dest}",
                timeout=30,
            ).check()
            planted.append(remote)
        put(local, remote, mode=mode)

    try:
        session.run(f"mkdir -p {outside}", timeout=30).check()
        session.sftp_put = plant_then_put  # type: ignore[method-assign]
        with pytest.raises(
            ProvisionerError, match=r"refused to write \S+/resume/checkpoint on the head"
        ):
            upload(session, inv.cluster, ckpt, f"{jobs[0]}/resume/checkpoint")
        assert planted
        session.sftp_put = put  # type: ignore[method-assign]
        held = session.run(f"find {outside} -mindepth 1 | wc -l", timeout=30).check()
        assert held.stdout.strip() == "0", "the checkpoint went through the planted link"
        link = session.run(f"readlink {root}/{jobs[0]}/resume/checkpoint", timeout=30).check()
        assert link.stdout.strip().endswith(f"/planted-{tag}")  # the link was there all along

        assert upload(session, inv.cluster, ckpt, f"{jobs[1]}/resume/checkpoint") == 2
        where = f"{root}/{jobs[1]}/resume"
        names = session.run(f"ls -A {where}", timeout=30).check().stdout.split()
        assert names == ["checkpoint"]  # the staging folder is gone
        got = session.run(f"sha256sum {where}/checkpoint/learner/state.pkl", timeout=30)
        want = hashlib.sha256((ckpt / "learner" / "state.pkl").read_bytes()).hexdigest()
        assert got.check().stdout.split()[0] == want
    finally:
        session.sftp_put = put  # type: ignore[method-assign]
        words = " ".join(f"{root}/{j}" for j in jobs)
        session.run(f"rm -rf {words} {outside}", timeout=30)
        session.close()


def _tune_script(tmp_path: Path) -> Path:
    book = tmp_path / "tunebook"
    book.mkdir()
    script = book / "tune_ckpt.py"
    script.write_text(TUNE_CHECKPOINTS)
    return script


def test_an_unchanged_tune_script_checkpointing_on_a_worker_succeeds_and_comes_home(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    from tests.e2e.faults.lab import edited_inventory

    script = _tune_script(tmp_path)
    # positive control: Ray's own storage (a folder on each node) fails on a worker
    off = edited_inventory(Path(inventory), tmp_path / "off.yaml", storage={"kind": "none"})
    code, doc, err = submit_json(str(off), tmp_path / "off", script, verbose=True)
    assert code != 0 and doc["status"] == "FAILED", err[-3000:]
    log = (tmp_path / "off" / doc["job_id"] / "job.log").read_text()
    assert "Unable to set up cluster storage" in log, log[-3000:]
    # the default: the head's store
    code, doc, err = submit_json(inventory, tmp_path, script, verbose=True)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    job = tmp_path / doc["job_id"]
    log = (job / "job.log").read_text()
    driver, trial = log.split("DRIVER ", 1)[1].split()[0], log.split("TRIAL_NODE ", 1)[1].split()[0]
    assert driver == lab.nodes[0].address and trial != driver, log[-2000:]
    (experiment,) = (job / "ray_results").iterdir()
    states = sorted(experiment.glob("*/checkpoint_00000*/state.json"))
    assert [json.loads(p.read_text()) for p in states] == [
        {"i": i, "node": trial} for i in range(3)
    ], states
    assert list(experiment.glob("*/result.json")) and list(experiment.glob("*/events.out.*"))
    # what came home is what the store holds, file by file (read on the head's Ray)
    assert all(p.stat().st_size > 0 for p in states)
    # the store may fill the head's disk, not SeaweedFS's default 8 volumes (2 GB here,
    # after which it refused uploads): its master's count of volumes, against the free disk
    from provisioner.cluster.storage import read_store
    from tests.e2e.helpers import ssh

    store = read_store(load_inventory(Path(inventory)))
    assert store is not None
    data = f"$HOME/.provisioner/clusters/{store.cluster}/storage/data"
    url = f"http://{store.address}:{store.port('master')}/dir/status"
    got = ssh(
        lab,
        lab.nodes[0],
        f"df -B1 --output=avail {data} | tail -1; python3 -c "
        + shlex.quote(
            "import json, urllib.request; t = json.load(urllib.request.urlopen("
            f"{url!r}))['Topology']; print(t['Max'], t['Free'])"
        ),
    )
    avail, most, free = (int(w) for w in got.stdout.split())
    assert most > 8 and free >= 1 and most >= avail // (256 << 20) // 2, (avail, most, free)


def test_a_folder_every_node_shares_is_tunes_storage_and_holds_the_checkpoints(
    inventory: str, lab: LabInfo, tmp_path: Path
) -> None:
    """`storage: {path: SHARED}`, SHARED being the folder every lab node has (a site's
    NFS home): the doctor proves it shared, `up` restarts Ray with it mounted, the same
    unchanged Tune script's trial on a worker succeeds, and its checkpoints are both here
    and on the shared folder (read on a worker's disk)."""
    from provisioner.doctor import run_doctor
    from provisioner.runtime.context import cluster_context
    from tests.e2e.faults.lab import edited_inventory, lab_container

    shared = lab.shared_dir
    path = edited_inventory(Path(inventory), tmp_path / "shared.yaml", storage={"path": shared})
    cluster = load_inventory(path).cluster
    head, worker = lab.nodes[0], lab.nodes[1]
    report = run_doctor(cluster_context(load_inventory(path), lenient_pin=True))
    found = [f for f in report.findings if f.check == "storage.shared"]
    assert [f.severity for f in found] == ["ok"], found
    assert found[0].message.startswith(
        f"{shared} is shared: written on {head.name}, read on {len(lab.nodes) - 1} other node(s), "
    ) and found[0].message.endswith(" GiB free"), found[0].message
    try:
        code, _, err = cli("up", "-i", str(path))
        assert code == 0, err[-3000:]
        mounts = ssh(
            lab,
            worker,
            f"docker inspect -f '{{{{range .Mounts}}}}{{{{.Destination}}}} {{{{end}}}}' "
            f"{lab_container(lab)}",
        )
        assert shared in mounts.stdout.split(), mounts.stdout + mounts.stderr
        code, doc, err = submit_json(str(path), tmp_path, _tune_script(tmp_path), verbose=True)
        assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
        job_id = doc["job_id"]
        log = (tmp_path / job_id / "job.log").read_text()
        driver = log.split("DRIVER ", 1)[1].split()[0]
        trial = log.split("TRIAL_NODE ", 1)[1].split()[0]
        assert driver == head.address and trial != driver, log[-2000:]
        (experiment,) = (tmp_path / job_id / "ray_results").iterdir()
        home = {
            str(p.relative_to(experiment)): p.read_text()
            for p in experiment.glob("*/checkpoint_00000*/state.json")
        }
        assert sorted(json.loads(t)["i"] for t in home.values()) == [0, 1, 2], home
        # on the shared folder, where the user would look: a worker node's disk
        root = f"{shared}/{cluster}/{job_id}"
        listed = ssh(lab, worker, f"cd {root}/* && find . -path '*/checkpoint_00000*/state.json'")
        assert listed.returncode == 0, listed.stderr
        there = sorted(line.removeprefix("./") for line in listed.stdout.split())
        assert there == sorted(home), (there, sorted(home))
        for name, text in home.items():
            got = ssh(lab, worker, f"cat {root}/*/{name}")
            assert got.stdout == text, (name, got.stdout, text)
    finally:
        # the module's other tests expect the default store
        code, _, err = cli("up", "-i", inventory)
        assert code == 0, err[-3000:]


# `--resume JOB` of an unchanged Tune script: its first Tuner.fit() restores the earlier
# experiment (jobs.tune_resume), whose trial goes on from its latest checkpoint in the
# store. The script's trial fails at its third iteration when it started afresh.
TUNE_RESUMABLE = (
    TUNE_ON_A_WORKER
    + """

def train(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                start = json.load(f)["i"] + 1
    for i in range(start, 4):
        if i == 2 and start == 0:
            raise RuntimeError("the trial is lost at its third iteration")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"i": i, "start": start}, f)
            tune.report({"i": i, "start": start}, checkpoint=tune.Checkpoint.from_directory(d))

trainable = tune.with_resources(train, {"cpu": 1, f"node:{worker}": 0.01})
results = tune.Tuner(trainable).fit()
if results.errors:
    print("ERRORED", len(results.errors))
    sys.exit(1)
best = results.get_best_result(metric="i", mode="max")
print("LAST", best.metrics["i"], "START", best.metrics["start"])
"""
)


def test_resume_of_an_unchanged_tune_script_goes_on_from_its_trials_checkpoint(
    inventory: str, tmp_path: Path
) -> None:
    book = tmp_path / "resumable"
    book.mkdir()
    script = book / "tune_resumable.py"
    script.write_text(TUNE_RESUMABLE)
    # the first run: its trial fails after two checkpoints (the positive control: started
    # afresh, this script always fails)
    code, first, err = submit_json(inventory, tmp_path, script, verbose=True)
    assert code != 0 and first["status"] == "FAILED", err[-3000:]
    home = tmp_path / first["job_id"]
    assert "ERRORED 1" in (home / "job.log").read_text()
    (experiment,) = (home / "ray_results").iterdir()
    assert len(list(experiment.glob("*/checkpoint_00000*"))) == 2
    # resumed: Tune's experiment restored, the trial goes on from iteration 2
    code, out, err = cli(
        "submit",
        "-i",
        inventory,
        "--results",
        str(tmp_path),
        "--json",
        "--verbose",
        "--resume",
        first["job_id"],
        str(script),
    )
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
    again = tmp_path / doc["job_id"]
    log = (again / "job.log").read_text()
    assert "Tune's experiment restored from" in log, log[-3000:]
    assert "LAST 3 START 2" in log, log[-3000:]
    (resumed,) = (again / "ray_results").iterdir()
    assert resumed.name == experiment.name
    states = [json.loads(p.read_text()) for p in sorted(resumed.glob("*/checkpoint_*/state.json"))]
    assert {"i": 3, "start": 2} in states and {"i": 1, "start": 0} in states, states


def test_down_stops_the_store_keeps_its_data_and_purge_removes_it(
    inventory: str, lab: LabInfo
) -> None:
    from provisioner.cluster.storage import read_store
    from tests.e2e.helpers import ssh

    store = read_store(load_inventory(Path(inventory)))
    assert store is not None
    head = lab.nodes[0]
    data = f"~/.provisioner/clusters/{store.cluster}/storage/data"
    ports = "|".join(str(store.base_port + i) for i in range(10))
    look = (
        f"pgrep -u $(id -u) -fc '[w]eed-.* server' || true; "
        f"ss -Htln | awk '{{print $4}}' | grep -Ec ':({ports})$' || true; "
        f"ls /tmp/seaweedfs-*-{store.port('s3')}.sock /tmp/seaweedfs-*-grpc-{store.base_port}* "
        f"2>/dev/null | wc -l; if [ -d {data} ]; then du -sb {data} | cut -f1; else echo none; fi"
    )
    running = ssh(lab, head, look).stdout.split()
    assert running[0] == "1" and int(running[1]) >= 4, running  # positive control
    try:
        code, _, err = cli("down", "-i", inventory, "--no-logs")
        assert code == 0, err[-3000:]
        after = ssh(lab, head, look).stdout.split()
        assert after[:3] == ["0", "0", "0"] and after[3] != "none", after  # data kept
        code, _, err = cli("down", "-i", inventory, "--no-logs", "--purge")
        assert code == 0, err[-3000:]
        purged = ssh(lab, head, look).stdout.split()
        assert purged == ["0", "0", "0", "none"], purged
    finally:
        code, _, err = cli("up", "-i", inventory)
        assert code == 0, err[-3000:]
