"""Faults end to end on the lab: each scenario of issue 8 with its expected outcome checked.

The tests run in file order on one lab cluster (its inventory points at the pin, which
the `cluster_inventory` fixture pushed once): first the faults that need no running Ray
(changed host key, hung sshd, full disk, Ctrl-C during a push), then those that do (Ctrl-C
during `up`, a node dying during `up`, a worker cut off during a job, Ctrl-C during
`down`). Every fault is undone in a `finally`. Each scenario records what it observed
(tests/e2e/faults/record.py) for docs/reliability.md's table (scripts/reliability_table.py).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.doctor.gather import LISTENER_MARK
from provisioner.image.pin import CLUSTER_TAG, Pin, read_pin, write_pin
from provisioner.inventory import load_inventory
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.engine import client
from provisioner.lab.nodes import LabInfo
from provisioner.node import layout
from provisioner.node.token import read_token
from provisioner.runtime.docker.push import PushOptions, push_image
from tests.e2e.faults.lab import (
    Run,
    cli,
    container_state,
    during,
    edited_inventory,
    image_store,
    interrupt,
    lab_container,
    new_host_keys,
    on_node,
    probe,
)
from tests.e2e.faults.record import scenario

BLOB_TAG = "provisioner-faults/blob:test"


@pytest.fixture(scope="module")
def inv(cluster_inventory: Path) -> Iterator[str]:
    """The lab cluster's inventory; Ray down at the start (a kept lab may hold a cluster)."""
    assert cli("down", "-i", str(cluster_inventory), "--no-logs").code == 0
    yield str(cluster_inventory)


@pytest.fixture(scope="module")
def blob(tmp_path_factory: pytest.TempPathFactory, inv: str) -> Pin:
    """A small one-layer image (48 MB of random bytes) pinned like the real one: cheap to
    push over and over, and held by no node at the start."""
    ctx = tmp_path_factory.mktemp("blob")
    (ctx / "blob").write_bytes(os.urandom(48 << 20))
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY blob /blob\n")
    subprocess.run(["docker", "build", "-q", "-t", BLOB_TAG, str(ctx)], check=True, timeout=300)
    attrs = client().api.inspect_image(BLOB_TAG)
    pin = read_pin(load_inventory(Path(inv)).image_lock)  # type: ignore[arg-type]
    layers = tuple(attrs["RootFS"]["Layers"])
    return replace(
        pin,
        image_id=attrs["Id"],
        layers=layers,
        layer_sizes=(int(attrs["Size"]),),
        size=int(attrs["Size"]),
        tag=BLOB_TAG,
    )


def holding(node: LabNode, pin: Pin) -> set[str]:
    """The IDs of the images on the node that are the pin: by ID on the classic store; on
    the containerd store (which names an image by its manifest's digest) by the layers'
    diff IDs, which are the same in both stores."""
    rc, out = probe(
        node,
        "docker image ls -aq --no-trunc | sort -u | xargs -r docker image inspect "
        "--format '{{.Id}} {{json .RootFS.Layers}}'",
    )
    assert rc == 0, out
    by_layers = image_store(node.container) == "containerd"
    found = set()
    for line in out.splitlines():
        image_id, _, layers = line.strip().partition(" ")
        if image_id == pin.image_id or (by_layers and tuple(json.loads(layers)) == pin.layers):
            found.add(image_id)
    return found


def pin_under(node: LabNode, ref: str, pin: Pin) -> bool:
    """The node's `ref` names the pin (see `holding`)."""
    return image_on(node, ref) in holding(node, pin)


def drop_blob(lab: LabInfo, blob: Pin) -> None:
    for node in lab.nodes:
        ids = " ".join(sorted(holding(node, blob)))
        probe(node, f"docker image rm -f {BLOB_TAG} {ids} >/dev/null 2>&1; true")
        assert not holding(node, blob), node.name


def image_on(node: object, ref: str) -> str:
    rc, out = probe(node, f"docker image inspect --format '{{{{.Id}}}}' {ref}")  # type: ignore[arg-type]
    return out.strip() if rc == 0 else ""


# Where `docker load` first writes what it receives, made an 8 MiB filesystem, and its
# undo, per image store. The classic store unpacks under Docker's tmp dir. The containerd
# store ingests into containerd's content store and then renames within it, so there the
# fault is an overlay on that store whose upper layer is the small filesystem: what is
# there stays readable, what is new fills 8 MiB.
CONTENT = "/var/lib/docker/containerd/daemon/io.containerd.content.v1.content"
FULL_DISK = {
    "classic": (
        "mount -t tmpfs -o size=8m faults-full /var/lib/docker/tmp",
        "umount /var/lib/docker/tmp || umount -l /var/lib/docker/tmp",
    ),
    "containerd": (
        f"mkdir -p {CONTENT}/ingest /run/faults-full && "
        "mount -t tmpfs -o size=8m faults-full /run/faults-full && "
        "mkdir -p /run/faults-full/u /run/faults-full/w && "
        f"mount -t overlay faults-full -o lowerdir={CONTENT},upperdir=/run/faults-full/u,"
        f"workdir=/run/faults-full/w {CONTENT}",
        f"umount {CONTENT} || umount -l {CONTENT}; "
        "umount /run/faults-full || umount -l /run/faults-full",
    ),
}


def names_node(run: Run, name: str) -> bool:
    return name in run.text


def states_said(run: Run, lab: LabInfo) -> bool:
    """The interrupted command said where every node stood."""
    return "where each node stood" in run.stderr and all(
        f"  {n.name}: " in run.stderr for n in lab.nodes
    )


# --- faults that need no running Ray ----------------------------------------------------


def test_changed_host_key_is_refused_by_push_and_up(inv: str, lab: LabInfo) -> None:
    worker = lab.nodes[2]
    with scenario(
        "changed host key on one node (`image push`, `up`)",
        "refused on that node, nothing run there, the exact `ssh-keygen -R` fix shown; "
        "other nodes served",
    ) as s:
        # The node loses the cluster tag (the image stays, held by another tag): a push
        # that ran anything there would tag it again.
        on_node(worker, f"docker tag {CLUSTER_TAG} faults/hold:1 && docker rmi {CLUSTER_TAG}")
        try:
            with new_host_keys(worker):
                push = cli("image", "push", "-i", inv, "--json")
                up = cli("up", "-i", inv, "--json")
            s.expect("push_exit", push.code, 1, push.stderr[-2000:])
            doc = push.json()
            assert [e["host"] for e in doc["errors"]] == [worker.name], doc["errors"]
            fix = doc["errors"][0]["fix"]
            exact = f"ssh-keygen -f {lab.known_hosts} -R {worker.address}"
            assert exact in fix, fix
            assert {n["host"] for n in doc["nodes"]} == {n.name for n in lab.nodes[:2]}
            s.expect("tag_there", image_on(worker, CLUSTER_TAG), "")  # nothing ran there
            s.expect("up_exit", up.code, 1, up.stderr[-2000:])
            s.expect("stopped_by", up.json()["stopped_by"], "doctor")
            blocking = up.json()["doctor"]["blocking"]
            assert {f["host"] for f in blocking} == {worker.name}, blocking
            assert any(f["check"] == "ssh.hostkey" and exact in f["fix"] for f in blocking)
            s.expect("containers", [container_state(lab, n) for n in lab.nodes], ["absent"] * 3)
            s.saw(refused=len(doc["errors"]), served=len(doc["nodes"]))
            s.observed = (
                "`image push` exit {push_exit}, refused on {refused} node (that one) with the fix "
                "`ssh-keygen -f KNOWN_HOSTS -R ADDRESS`; its image tag there: '{tag_there}' "
                "(nothing ran there); {served} other nodes served; `up` exit {up_exit}, stopped "
                "by the {stopped_by} with the same fix; Ray containers: {containers}"
            )
            s.measure(push=push.seconds, up=up.seconds)
            s.measured = "push refused in {push:.1f} s, up in {up:.1f} s"
        finally:  # re-tag first: untagging the only tag left would delete the image
            again = cli("image", "push", "-i", inv)
            on_node(worker, "docker rmi faults/hold:1 >/dev/null 2>&1; true")
            assert again.code == 0, again.stderr[-2000:]


def test_hung_sshd_bounds_every_command(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    worker = lab.nodes[2]
    others = {n.name for n in lab.nodes[:2]}
    quick = str(edited_inventory(Path(inv), tmp_path / "inv.yaml", ssh={"connect_timeout": 3}))
    limit = 45.0
    with scenario(
        "an sshd that accepts but never answers (doctor, status, up, image push, logs, down)",
        f"each command ends within its deadline (here < {limit:.0f}s, connect timeout 3s) "
        "with exit 1 naming that node; the other nodes served",
    ) as s:
        faults.hang(lab, worker)
        try:
            runs = {
                "doctor": cli("doctor", "-i", quick, "--json"),
                "status": cli("status", "-i", quick, "--json"),
                "up": cli("up", "-i", quick, "--json"),
                "image push": cli("image", "push", "-i", quick, "--json"),
                "logs": cli("logs", "-i", quick, "-o", str(tmp_path / "logs"), "--json"),
                "down": cli("down", "-i", quick, "--no-logs", "--json"),
            }
        finally:
            faults.unhang(lab, worker)
        for name, run in runs.items():
            assert run.code == 1, (name, run.stderr[-1500:])
            assert run.seconds < limit, (name, run.seconds)
            assert names_node(run, worker.name), (name, run.text[-1500:])
        s.expect("exits", sorted({r.code for r in runs.values()}), [1])
        doctor = runs["doctor"].json()
        assert {f["host"] for f in doctor["findings"] if f["severity"] == "error"} == {worker.name}
        status = runs["status"].json()
        assert {n["name"] for n in status["nodes"] if n["ssh_ok"]} == others
        up = runs["up"].json()
        assert {f["host"] for f in up["doctor"]["blocking"]} == {worker.name}
        push = runs["image push"].json()
        assert {n["host"] for n in push["nodes"]} == others
        assert [e["host"] for e in push["errors"]] == [worker.name]
        logs = runs["logs"].json()
        assert set(logs["nodes"]) == others and set(logs["errors"]) == {worker.name}
        down = runs["down"].json()
        assert set(down["removed"]) == others and set(down["errors"]) == {worker.name}
        s.saw(commands=list(runs), limit=limit, connect_timeout=3, served=len(others))
        s.observed = (
            "{commands} each ended within the {limit:.0f} s bound (connect timeout "
            "{connect_timeout} s) with exit {exits} naming that node; the other {served} nodes "
            "served"
        )
        s.measure(times=[f"{k} {r.seconds:.1f} s" for k, r in runs.items()])
        s.measured = "{times}"


def test_disk_filling_during_push(inv: str, lab: LabInfo, blob: Pin, tmp_path: Path) -> None:
    worker = lab.nodes[2]
    inventory = load_inventory(Path(inv))
    drop_blob(lab, blob)
    opts = PushOptions(tag=BLOB_TAG, cache_dir=tmp_path / "cache")
    with scenario(
        "a node's disk fills during `image push`",
        "a clear no-space error for that node with the fix, nothing half-loaded left "
        "tagged there, the other nodes loaded; a push after freeing space completes",
    ) as s:
        # `docker load` writes what it receives to an 8 MiB filesystem (`FULL_DISK`): it
        # fills up part way through the 48 MB layer.
        fill, unfill = FULL_DISK[image_store(worker.container)]
        on_node(worker, fill)
        try:
            report = push_image(inventory, None, print, pin=blob, opts=opts)
        finally:
            on_node(worker, unfill)
        s.expect("failed", len(report.errors), 1)
        assert set(report.errors) == {worker.name}, report.errors
        err = report.errors[worker.name]
        s.expect("kind", getattr(err, "kind", ""), "no-space")
        assert "disk" in str(err) and err.fix and "docker system prune" in err.fix
        assert report.nodes[lab.nodes[0].name].action == "send"
        s.expect("left", len(holding(worker, blob)), 0)
        s.expect("tag", image_on(worker, BLOB_TAG), "")
        loaded = [n.name for n in lab.nodes[:2] if pin_under(n, BLOB_TAG, blob)]
        # the positive control: the same check finds it on the others
        s.expect("loaded", len(loaded), 2)
        t_again = time.monotonic()
        again = push_image(inventory, None, print, pin=blob, opts=opts)
        assert again.ok, again.errors
        s.expect("then", pin_under(worker, BLOB_TAG, blob), True)
        s.observed = (
            "a `{kind}` error on {failed} node (that one) naming the disk, with the fix (free "
            "space, `docker system prune`); {left} image and tag '{tag}' left there; the "
            "{loaded} other nodes loaded; the next push loaded it there: {then}"
        )
        s.measure(again=time.monotonic() - t_again)
        s.measured = "the next push {again:.1f} s (48 MB)"


def test_image_push_through_a_jump_host(inv: str, lab: LabInfo, blob: Pin, tmp_path: Path) -> None:
    """A worker that drops SSH from the control machine, reached through the head: the
    image's bytes travel through the jump host's channel and load whole there."""
    from tests.e2e.helpers import jumped_inventory, ssh_only_through_a_jump

    worker = lab.nodes[2]
    drop_blob(lab, blob)
    inventory = load_inventory(jumped_inventory(Path(inv), tmp_path / "jumped.yaml", lab, worker))
    opts = PushOptions(tag=BLOB_TAG, cache_dir=tmp_path / "cache")
    try:
        with ssh_only_through_a_jump(lab, worker):
            report = push_image(inventory, None, print, pin=blob, opts=opts)
        assert report.ok, report.errors
        sent = report.nodes[worker.name]
        assert sent.action == "send" and sent.bytes_sent > 40 << 20, sent
        assert pin_under(worker, BLOB_TAG, blob)
    finally:
        drop_blob(lab, blob)


LOADING = "pgrep -f '(^|[ /])docker load' >/dev/null"  # a node's `docker load` reads a push
DOCKERD_STOP = "kill -STOP $(cat /var/run/docker.pid)"  # the node's dockerd reads no more
DOCKERD_CONT = "kill -CONT $(cat /var/run/docker.pid)"


def processes(lab: LabInfo, names: list[str]) -> str:
    """The process lists of the named nodes (what a failure shows)."""
    return "\n".join(
        f"== {n.name}\n{probe(n, 'ps -eo pid,ppid,stat,etime,args')[1][-3000:]}"
        for n in lab.nodes
        if n.name in names
    )


def test_ctrl_c_during_image_push(inv: str, lab: LabInfo, blob: Pin, tmp_path: Path) -> None:
    lock = tmp_path / "blob.lock.json"
    write_pin(blob, lock)
    blob_inv = str(edited_inventory(Path(inv), tmp_path / "inv.yaml", image={"lock": str(lock)}))
    drop_blob(lab, blob)
    real = read_pin(load_inventory(Path(inv)).image_lock)  # type: ignore[arg-type]
    loading: list[str] = []  # the nodes whose `docker load` was reading the push at SIGINT

    def ctrl_c_once_a_node_loads(proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 30
        while not loading and time.monotonic() < deadline and proc.poll() is None:
            loading.extend(n.name for n in lab.nodes if probe(n, LOADING)[0] == 0)
        # every node's dockerd stops reading, as a node too busy to keep up: its `docker
        # load` then waits on it and never sees its stream end (the full suite's load
        # left two loads reading 120 s after SIGINT); only the push can end them
        for node in lab.nodes:
            probe(node, DOCKERD_STOP)
        proc.send_signal(signal.SIGINT)

    with scenario(
        "Ctrl-C (SIGINT) during `image push`",
        "stops within seconds, says where each node stood, no half-loaded image tagged; "
        "a re-run completes",
    ) as s:
        try:
            run = during(
                "image", "push", "-i", blob_inv,
                when="sending 1 layer", action=ctrl_c_once_a_node_loads,
            )  # fmt: skip
            # the push had started: a node was loading it when SIGINT came (seen there)
            assert loading, f"no node's docker load ran before SIGINT:\n{run.stderr[-2000:]}"
            s.expect("exit", run.code, 130, run.stderr[-2000:])
            assert run.after_signal is not None and run.after_signal < 10, run.after_signal
            assert states_said(run, lab), run.stderr[-2000:]
            # no `docker load` left: the push ended its own loads on the nodes (by their
            # pids, on connections of their own) before it exited, their dockerd still stopped
            stray = [n.name for n in lab.nodes if probe(n, LOADING)[0] == 0]
            deadline = time.monotonic() + 15
            while stray and time.monotonic() < deadline:
                time.sleep(0.5)
                stray = [n.name for n in lab.nodes if probe(n, LOADING)[0] == 0]
            s.expect("stray", stray, [], processes(lab, stray))
            for node in lab.nodes:  # the nodes' dockerd read again (and drop the cut loads)
                probe(node, DOCKERD_CONT)
            # each node is left either with the whole image under the tag, or as it was:
            # the tag on the old image, no piece of the new one
            whole = {n.name for n in lab.nodes if pin_under(n, CLUSTER_TAG, blob)}
            for node in lab.nodes:
                if node.name not in whole:
                    assert pin_under(node, CLUSTER_TAG, real), node.name
                    assert not holding(node, blob), node.name
            s.saw(bound=10)
            rerun = cli("image", "push", "-i", blob_inv, "--json")
            s.expect("rerun", rerun.code, 0, rerun.stderr[-2000:])
            s.expect("then", [pin_under(n, CLUSTER_TAG, blob) for n in lab.nodes], [True] * 3)
            s.observed = (
                "a node's `docker load` was reading the push at SIGINT; exit {exit} within the "
                "{bound} s bound after it; each node's last step shown; each node left with the "
                "whole image under the tag or with its old image under it and no piece of the "
                "new one; `docker load` left running: "
                "[{stray}]; re-run exit {rerun}, each node holds it: {then}"
            )
            s.measure(
                after=run.after_signal, loading=len(loading), kept=len(lab.nodes) - len(whole)
            )
            s.measured = (
                "exit {after:.1f} s after SIGINT; {loading} node(s) loading at SIGINT; "
                "{kept} node(s) were left without the image"
            )
        finally:
            for node in lab.nodes:
                probe(node, DOCKERD_CONT)
            restore = cli("image", "push", "-i", inv)
            assert restore.code == 0, restore.stderr[-2000:]
            drop_blob(lab, blob)
            assert all(pin_under(n, CLUSTER_TAG, real) for n in lab.nodes)


# --- faults with Ray running --------------------------------------------------------------


def test_ctrl_c_during_up_then_rerun(inv: str, lab: LabInfo) -> None:
    with scenario(
        "Ctrl-C (SIGINT) during `up`",
        "stops within seconds, says where each node stood; a re-run completes",
    ) as s:
        run = interrupt("up", "-i", inv, "--json", when="starting the worker container", delay=0.3)
        s.expect("exit", run.code, 130, run.stderr[-2000:])
        assert run.after_signal is not None and run.after_signal < 10, run.after_signal
        assert states_said(run, lab), run.stderr[-2000:]
        error = run.json()["error"]  # --json: stdout still holds one document
        s.expect("kind", error["kind"], "interrupted")
        s.expect("said", len(error["nodes"]), len(lab.nodes))
        rerun = cli("up", "-i", inv, "--json")
        s.expect("rerun", rerun.code, 0, rerun.stderr[-2000:])
        s.expect("alive", rerun.json()["status"]["alive_nodes"], len(lab.nodes))
        s.saw(bound=10)
        s.observed = (
            "exit {exit} within the {bound} s bound after SIGINT, the last step of each of the "
            "{said} nodes shown (with `--json`: one document, error kind `{kind}`); re-run "
            "exit {rerun}, {alive} nodes alive"
        )
        s.measure(after=run.after_signal, again=rerun.seconds)
        s.measured = "exit {after:.1f} s after SIGINT; re-run {again:.1f} s"


def test_node_dies_during_up(inv: str, lab: LabInfo) -> None:
    head, other, worker = lab.nodes
    with scenario(
        "a node dies during `up`",
        "exit 1 naming it, the others up; after it returns a re-run finishes only that node",
    ) as s:
        on_node(worker, f"docker rm -f {lab_container(lab)}")
        try:
            run = during(
                "up",
                "-i",
                inv,
                "--timeout",
                "30",
                "--json",
                when=f"{worker.name}: starting the worker container",
                action=lambda _: faults.stop(lab, worker),
            )
            s.expect("exit", run.code, 1, run.stderr[-2000:])
            said = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]
            assert said and worker.name in said[0], run.stderr[-3000:]
            assert "did not join" in said[0] or "could not start" in said[0], said
            error = run.json()["error"]  # --json: the error as one document on stdout
            assert worker.name in error["message"] and error["exit_code"] == 1, error
            alive: set[str] = set()
            for _ in range(15):  # the other worker may still be joining
                status = cli("status", "-i", inv, "--json")
                alive = {n["name"] for n in status.json()["nodes"] if n["ray_alive"]}
                if alive == {head.name, other.name}:
                    break
                time.sleep(2)
            assert alive == {head.name, other.name}, alive
            s.saw(others=len(alive))
        finally:
            faults.start(lab, worker)
        rerun = cli("up", "-i", inv, "--json")
        s.expect("rerun", rerun.code, 0, rerun.stderr[-2000:])
        doc = rerun.json()
        assert set(doc["started"]) <= {worker.name}, doc["started"]
        s.expect("unchanged", len({head.name, other.name} & set(doc["unchanged"])), 2)
        s.expect("alive", doc["status"]["alive_nodes"], len(lab.nodes))
        s.observed = (
            "exit {exit} naming the node (did not join / could not start Ray); `status`: the "
            "{others} others alive; the re-run after the node returned: exit {rerun}, {alive} "
            "nodes alive, the {unchanged} others unchanged and nothing started but that node "
            "(nothing at all when its container came back by its restart policy)"
        )
        s.measure(
            first=run.seconds,
            started="that node" if doc["started"] else "nothing (its container came back)",
            again=rerun.seconds,
        )
        s.measured = "exit 1 after {first:.1f} s; the re-run started {started} in {again:.1f} s"


PLAYBOOK = """\
import time
import ray
from ray.exceptions import GetTimeoutError

ray.init()


@ray.remote(num_cpus=0.25, max_retries=5)
def work(i):
    time.sleep(1)
    return ray.util.get_node_ip_address()


# A job written for lost nodes: each round waits a bounded time, and a round that a lost
# node holds up is run again; Ray stops scheduling on a node once it is marked dead.
done = 0
while done < 30:
    refs = [work.options(scheduling_strategy="SPREAD").remote(i) for i in range(3)]
    try:
        nodes = sorted(set(ray.get(refs, timeout=20)))
    except GetTimeoutError:
        for ref in refs:
            ray.cancel(ref, force=True)
        print(f"round {done + 1}: timed out waiting for a lost node; running it again", flush=True)
        continue
    done += 1
    print(f"round {done}: {nodes}", flush=True)
print("all rounds done", flush=True)
"""


def test_worker_cut_off_during_a_job(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    head, worker, _ = lab.nodes
    book = tmp_path / "book" / "spread.py"
    book.parent.mkdir()
    book.write_text(PLAYBOOK)
    up = cli("up", "-i", inv)  # idempotent: the tests before leave it up
    assert up.code == 0, up.stderr[-2000:]
    token = read_token(load_inventory(Path(inv)))
    with scenario(
        "a worker cut off from the head during a job",
        "`status` names the lost node; the job goes on on the rest or fails with a clear "
        "message; logs from every node still collected",
    ) as s:
        ps_clean: list[bool] = []
        lost_after: list[float] = []

        def cut(proc: subprocess.Popen[str]) -> None:
            ps_clean.extend(token not in on_node(n, "ps auxwwe") for n in lab.nodes)
            faults.cut(lab, head, worker)
            t_cut = time.monotonic()
            for _ in range(45):  # while the job runs: status must name the lost node
                st = cli("status", "-i", inv, "--json")
                node = next(n for n in st.json()["nodes"] if n["name"] == worker.name)
                if st.code == 1 and not node["ray_alive"]:
                    lost_after.append(time.monotonic() - t_cut)
                    return
                time.sleep(2)

        try:
            job = during(
                "submit",
                "-i",
                inv,
                "--results",
                str(tmp_path / "results"),
                "--json",
                str(book),
                when="round 3:",
                action=cut,
                timeout=240,
            )
            logs = cli("logs", "-i", inv, "-o", str(tmp_path / "logs"), "--json")
        finally:
            faults.uncut(lab, head, worker)
        assert lost_after, "status never named the lost node"
        s.saw(status_exit=1)  # `cut` returned only on `status` exit 1 naming it not alive
        s.expect("ps_clean", ps_clean, [True] * len(lab.nodes))
        # the playbook is written for a lost node: the job goes on on the other two and
        # succeeds; the client exits 0 and brings its log home
        s.expect("exit", job.code, 0, job.stderr[-2000:])
        doc = job.json()
        s.expect("status", doc["status"], "SUCCEEDED")
        log = Path(doc["results_dir"]) / "job.log"
        assert log.is_file(), doc
        text = log.read_text()
        assert "all rounds done" in text, text[-2000:]
        rounds = [ln for ln in text.splitlines() if ln.startswith("round ") and ": [" in ln]
        last = rounds[-1].split(": ", 1)[1]
        # the rounds after the cut ran on the head and the other worker, not the lost one
        s.expect("last_round_on_lost", worker.address in last, False)
        s.saw(rounds=len(rounds))
        s.expect("logs_exit", logs.code, 0, logs.stderr[-2000:])
        s.expect("logs_from", len(logs.json()["nodes"]), len(lab.nodes))
        assert set(logs.json()["nodes"]) == {n.name for n in lab.nodes}
        for n in lab.nodes:
            assert (tmp_path / "logs" / n.name / "container.log").exists()
        leaked = [
            str(p)
            for p in (tmp_path / "logs").rglob("*")
            if p.is_file() and token.encode() in p.read_bytes()
        ]
        s.expect("leaked", leaked, [])
        repair = cli("up", "-i", inv, "--json")
        s.expect("repair", repair.code, 0, repair.stderr[-2000:])
        s.observed = (
            "while the job ran, `status` (exit {status_exit}) named the worker not alive; the "
            "job went on on the other nodes: the client exit {exit}, the job {status}, its "
            "log home with all {rounds} rounds, the last of them on the lost worker: "
            "{last_round_on_lost}; `logs` exit {logs_exit} with the logs of {logs_from} "
            "nodes, the token in none of them ([{leaked}]) nor in `ps` on any node "
            "({ps_clean}); `up` after the cut was healed: exit {repair}"
        )
        s.measure(lost=lost_after[0])
        s.measured = "`status` named it {lost:.0f} s after the cut"


def jobs_listed(inv: str) -> dict[str, str]:
    """job id -> status, as `provisioner jobs list` reads them from Ray's Jobs API."""
    run = cli("jobs", "list", "-i", inv, "--json")
    assert run.code == 0, run.stderr[-2000:]
    return {j["job_id"]: j["status"] for j in run.json()["jobs"]}


def test_ctrl_c_during_a_foreground_submit(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    """A real SIGINT to `provisioner submit` while the job runs (not a callback raising):
    it stops following, not the job; `jobs stop` stops the job."""
    book = tmp_path / "book" / "forever.py"
    book.parent.mkdir()
    book.write_text("import time\nprint('started', flush=True)\ntime.sleep(600)\n")
    up = cli("up", "-i", inv)  # idempotent: the tests before leave it up
    assert up.code == 0, up.stderr[-2000:]
    limit = 30.0
    with scenario(
        "Ctrl-C (SIGINT) during a foreground `submit`",
        "stops following, not the job: exit 130 naming the job, which runs on; "
        "`jobs stop` stops it",
    ) as s:
        results = tmp_path / "results"
        run = interrupt(
            "submit", "-i", inv, "--results", str(results), "--json", str(book),
            when="started", timeout=240,
        )  # fmt: skip
        s.expect("exit", run.code, 130, run.stderr[-2000:])
        assert run.after_signal is not None and run.after_signal < limit, run.after_signal
        doc = run.json()  # --json: stdout still holds the outcome
        job = doc["job_id"]
        assert doc["interrupted"] is True and doc["detached"] is True, doc
        s.expect("then", jobs_listed(inv)[job], "RUNNING")
        stop = cli("jobs", "stop", job, "-i", inv, "--json")
        assert stop.code == 0 and stop.json()["status"] == "STOPPED", stop.stderr[-2000:]
        s.expect("stopped", jobs_listed(inv)[job], "STOPPED")
        s.saw(bound=limit)
        s.observed = (
            "exit {exit} within the {bound:.0f} s bound after SIGINT, the job named; "
            "`jobs list` (Ray's Jobs API) shows it {then} after the interrupt; `jobs stop` "
            "made it {stopped}"
        )
        s.measure(after=run.after_signal)
        s.measured = "exit {after:.1f} s after SIGINT"


def test_ctrl_c_during_down_then_rerun(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    with scenario(
        "Ctrl-C (SIGINT) during `down`",
        "stops within seconds, says where each node stood; a re-run completes",
    ) as s:
        run = interrupt(
            "down", "-i", inv, "-o", str(tmp_path / "logs"), when="removing the Ray container"
        )
        s.expect("exit", run.code, 130, run.stderr[-2000:])
        assert run.after_signal is not None and run.after_signal < 10, run.after_signal
        assert states_said(run, lab), run.stderr[-2000:]
        rerun = cli("down", "-i", inv, "--no-logs", "--json")
        s.expect("rerun", rerun.code, 0, rerun.stderr[-2000:])
        assert rerun.json()["ok"], rerun.stderr[-2000:]
        s.expect("containers", [container_state(lab, n) for n in lab.nodes], ["absent"] * 3)
        s.saw(bound=10, said=len(lab.nodes))
        s.observed = (
            "exit {exit} within the {bound} s bound after SIGINT, the last step of each of the "
            "{said} nodes shown; re-run exit {rerun}, the Ray containers: {containers}"
        )
        s.measure(after=run.after_signal)
        s.measured = "exit {after:.1f} s after SIGINT"


# --- a hung sshd: only the tool's own lines; Ctrl-C while `up` connects (issue 47) --------

# What paramiko wrote on stderr when a connection to a hung sshd ended (its transport
# thread's records at ERROR, through Python's last-resort handler): none may reach the user.
PARAMIKO_LINES = (
    "Traceback",
    "paramiko",
    "Exception (client)",
    "Socket exception",
    "Error reading SSH protocol banner",
)


def library_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(m in line for m in PARAMIKO_LINES)]


def end_doctor_listeners(lab: LabInfo) -> None:
    """End the listeners on Ray's ports that an interrupted doctor's round left on the nodes
    (each ends by itself after gather.LISTEN_SECONDS; meanwhile `down` finds the ports in
    use and the next doctor finds them busy)."""
    for node in lab.nodes:
        on_node(node, f"pkill -f ' {LISTENER_MARK}$'; true")


def test_a_hung_sshd_shows_only_the_tools_own_lines(
    inv: str, lab: LabInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the tables' findings on one line each
    worker = lab.nodes[2]
    healthy = [n.name for n in lab.nodes[:2]]
    quick = str(edited_inventory(Path(inv), tmp_path / "inv.yaml", ssh={"connect_timeout": 3}))
    faults.hang(lab, worker)
    try:
        runs = {verb: cli(verb, "-i", quick) for verb in ("doctor", "status", "up")}
    finally:
        faults.unhang(lab, worker)
    said = "accepted the connection but its SSH banner and handshake did not come within 3s"
    fix = "sshd on that machine is hung or overloaded"
    for verb, run in runs.items():
        assert run.code == 1, (verb, run.text[-2000:])
        assert library_lines(run.stderr) == [], (verb, run.stderr[-3000:])
        # the tool's own lines name the hung node and what it did
        assert worker.name in run.text and said in run.text, (verb, run.text[-2000:])
    for verb in ("doctor", "up"):  # the doctor's finding carries its fix
        assert fix in runs[verb].text, (verb, runs[verb].text[-2000:])
    assert "up stopped" in runs["up"].text, runs["up"].text[-2000:]
    # positive control: the healthy nodes were reached and reported as such
    rows = {line.split()[0]: line for line in runs["status"].stdout.splitlines() if line.split()}
    for name in healthy:
        assert name in rows and "no SSH" not in rows[name], runs["status"].stdout
    assert "no SSH" in rows[worker.name], runs["status"].stdout
    summary = re.search(r"(\d+) node\(s\): .* (\d+) check\(s\) ok", runs["doctor"].text)
    assert summary is not None, runs["doctor"].text[-2000:]
    assert int(summary[1]) == len(lab.nodes) and int(summary[2]) > 0, summary[0]


def test_ctrl_c_while_up_connects_to_a_hung_node(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    """SIGINT while `up`'s first round waits on a hung node's connection ends `up` at
    once: it waited for the token install beside the doctor's round (the connect timeout,
    here 30 s) before. Nothing half done: the token is whole here and on every node."""
    worker = lab.nodes[2]
    slow = str(edited_inventory(Path(inv), tmp_path / "inv.yaml", ssh={"connect_timeout": 30}))
    faults.hang(lab, worker)
    try:
        run = interrupt("up", "-i", slow, when="gathering facts", delay=1.0, timeout=120)
    finally:
        faults.unhang(lab, worker)
        end_doctor_listeners(lab)
    assert run.code == 130, run.stderr[-2000:]
    assert run.after_signal is not None and run.after_signal < 10, run.after_signal
    assert states_said(run, lab), run.stderr[-2000:]
    assert library_lines(run.stderr) == [], run.stderr[-3000:]
    inventory = load_inventory(Path(inv))
    secret = read_token(inventory)  # whole: present, private, not empty
    for node in lab.nodes:  # the install finished there or never began
        token_file = f"~{node.user}/{layout.node_dir(inventory.cluster)}/auth_token"
        held = on_node(node, f"cat {token_file} 2>/dev/null; true").strip()
        assert held in ("", secret), (node.name, len(held))


# The PIDs of the doctor's listeners holding a TCP port on a node (`ss`, then each one's
# command line, which ends with LISTENER_MARK).
DOCTOR_LISTENERS = (
    "for p in $(ss -Htlnp | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u); do "
    f"tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q ' {LISTENER_MARK} $' && echo $p; "
    "done; true"
)


def test_ctrl_c_during_the_doctors_first_round_leaves_no_listener(
    inv: str, lab: LabInfo, tmp_path: Path
) -> None:
    """SIGINT while the doctor's first round waits on a hung node: the healthy nodes have
    started their listeners on Ray's ports (the positive control, read on each node before
    the signal), and the interrupted doctor ends them before it exits, promptly; before,
    they held the ports until gather.LISTEN_SECONDS (`down` said the ports were in use)."""
    worker, healthy = lab.nodes[2], lab.nodes[:2]
    slow = str(edited_inventory(Path(inv), tmp_path / "inv.yaml", ssh={"connect_timeout": 30}))
    seen: dict[str, list[str]] = {}

    def ctrl_c_once_listening(proc: subprocess.Popen[str]) -> None:
        for _ in range(300):
            seen.update({n.name: on_node(n, DOCTOR_LISTENERS).split() for n in healthy})
            if all(seen.values()):
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)

    faults.hang(lab, worker)
    try:
        run = during(
            "doctor", "-i", slow, when="gathering facts", action=ctrl_c_once_listening, timeout=120
        )
        left = {n.name: on_node(n, DOCTOR_LISTENERS).split() for n in healthy}
    finally:
        faults.unhang(lab, worker)
        for node in healthy:
            on_node(node, f"for p in $({DOCTOR_LISTENERS}); do kill $p; done; true")
    assert all(seen.get(n.name) for n in healthy), seen  # they listened while it waited
    assert run.code == 130, run.stderr[-2000:]
    assert run.after_signal is not None and run.after_signal < 15, run.after_signal
    assert left == {n.name: [] for n in healthy}, (left, seen)
