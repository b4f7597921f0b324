"""Clusters that share nodes, and membership that follows the inventory, on the lab.

- Two clusters (other names, other port blocks) on the same 3 lab nodes: the session's
  (`cluster_inventory`, Ray's usual ports) and a copy of its inventory with another name
  and `ray: {port_base: 20000}`; a job runs on each; a third whose block overlaps the
  second's is stopped by the doctor (and by `up`, even `--force`), naming the ports and the
  cluster; `down` of the second leaves the first untouched (container start times).
- The same in host mode, on the host-mode lab (two clusters from the nodes' own Python).
- A docker cluster beside a host-mode one on the host-mode lab's nodes: `up` pushes the pin
  there by itself through the forwarding relay (every node lacks it), jobs run on both,
  and `down` of the docker cluster leaves the host-mode one untouched.
- A worker removed from the inventory: `status` names it, `up` removes this cluster's Ray
  and token there, a container restarted without the token cannot start.
Every cluster started here is taken down at the end (the session's by its fixture).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.image.pin import read_pin
from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from provisioner.node import layout
from provisioner.node.token import ray_container
from provisioner.runtime.host.runtime import temp_dir_mark
from tests.e2e.faults.lab import edited_inventory, lab_container
from tests.e2e.helpers import cli, cli_json, ssh

BLOCK_B = 20000

# A job that says which cluster it runs in: the GCS address its driver joined.
WHERE_AM_I = """\
import ray
ray.init()
print("GCS", ray.get_runtime_context().gcs_address, "NODES", len(ray.nodes()), flush=True)
"""


def started_at(lab: LabInfo, cluster: str) -> dict[str, str]:
    """Each node's container of the cluster called CLUSTER (its label): its start time
    (absent: '')."""
    fmt = "{{.State.StartedAt}}"
    found = f"$(docker ps -aq --filter label=provisioner.cluster={cluster})"
    return {
        node.name: ssh(lab, node, f"docker inspect -f '{fmt}' {found} 2>/dev/null").stdout.strip()
        for node in lab.nodes
    }


def wait_until_running(inventory: str, job_id: str, bound: float = 60) -> bool:
    """Poll `jobs list` until the job runs (its supervisor is then a process on the head)."""
    end = time.monotonic() + bound
    while time.monotonic() < end:
        code, doc, _ = cli_json("jobs", "list", "-i", inventory)
        if code == 0 and any(
            j["job_id"] == job_id and j["status"] == "RUNNING" for j in doc["jobs"]
        ):
            return True
        time.sleep(2)
    return False


@pytest.fixture(scope="module")
def cluster_a(cluster_inventory: Path) -> str:
    """The session's cluster, up (idempotent)."""
    code, _, err = cli("up", "-i", str(cluster_inventory))
    assert code == 0, err[-3000:]
    return str(cluster_inventory)


@pytest.fixture(scope="module")
def cluster_b(
    cluster_inventory: Path, lab: LabInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A second cluster on the same nodes: its own name and port block."""
    path = edited_inventory(
        cluster_inventory,
        tmp_path_factory.mktemp("shared") / "b.yaml",
        cluster=f"{lab.name}-b",
        ray={"port_base": BLOCK_B},
    )
    yield str(path)
    cli("down", "-i", str(path), "--no-logs", "--yes", "--results", str(path.parent))


@pytest.fixture(scope="module")
def cluster_c(cluster_b: str) -> Iterator[str]:
    """A third cluster whose block (20500) overlaps B's (20000: workers 20100-20999)."""
    path = Path(cluster_b).with_name("c.yaml")
    document = yaml.safe_load(Path(cluster_b).read_text())
    document["cluster"] = document["cluster"].replace("-b", "-c")
    document["ray"] = {"port_base": BLOCK_B + 500}
    path.write_text(yaml.safe_dump(document))
    yield str(path)
    cli("down", "-i", str(path), "--no-logs")  # nothing to remove, unless a test failed


def test_two_clusters_share_the_nodes_and_down_of_one_leaves_the_other(
    cluster_a: str, cluster_b: str, cluster_c: str, lab: LabInfo, tmp_path: Path
) -> None:
    name_a, name_b = lab.name, f"{lab.name}-b"
    code, up_b, err = cli_json("up", "-i", cluster_b)
    assert code == 0, err[-3000:]
    assert up_b["status"]["alive_nodes"] == 3 and up_b["status"]["address"].endswith(":20000")
    code, st_a, _ = cli_json("status", "-i", cluster_a)
    assert code == 0 and st_a["alive_nodes"] == 3, st_a
    before_a = started_at(lab, name_a)
    assert all(before_a.values()) and all(started_at(lab, name_b).values())

    playbook = tmp_path / "where.py"
    playbook.write_text(WHERE_AM_I)
    for inventory, port in ((cluster_a, 6379), (cluster_b, BLOCK_B)):
        code, doc, err = cli_json(
            "submit", "-i", inventory, "--results", str(tmp_path / str(port)), str(playbook)
        )
        assert code == 0 and doc["status"] == "SUCCEEDED", err[-3000:]
        assert f"{lab.nodes[0].address}:{port} NODES 3" in err, err[-3000:]

    # A third cluster whose block overlaps B's: the doctor names B, the ports and a free
    # block; `up` starts nothing, not even with --force. B runs a job meanwhile.
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text("import time\ntime.sleep(300)\n")
    code, job, err = cli_json(
        "submit", "-i", cluster_b, "--detach", "--results", str(tmp_path / "s"), str(sleeper)
    )
    assert code == 0 and job["job_id"], err[-3000:]
    running = wait_until_running(cluster_b, job["job_id"])
    assert running, f"{job['job_id']} not RUNNING within 60 s"
    code, doc, _ = cli_json("doctor", "-i", cluster_c)
    assert code == 1
    collisions = [f for f in doc["findings"] if f["check"] == "ray.cluster"]
    errors = {f["host"]: f for f in collisions if f["severity"] == "error"}
    assert set(errors) == {n.name for n in lab.nodes}, collisions
    head = errors[lab.nodes[0].name]
    container_b = ray_container(load_inventory(Path(cluster_b)))
    assert f"cluster {name_b}'s Ray (container {container_b}, a job is running)" in head["message"]
    assert "20500-20508" in head["message"] and "20600-20999" in head["message"]
    assert "port_base: 21000" in head["fix"] and "leave it running" in head["fix"]
    assert not any("rm -f" in f["fix"] or "down -i" in f["fix"] for f in collisions)
    others = [f for f in collisions if f["severity"] == "ok"]
    assert len(others) == 3 and all(f"cluster {name_a}'s Ray" in f["message"] for f in others)
    for force in ([], ["--force"]):
        code, out, err = cli("up", "-i", cluster_c, *force)
        said = out + err
        assert code == 1 and f"cluster {name_b}'s Ray" in said, said[-2000:]
        assert "port_base: 21000" in said and "up stopped" in said, said[-2000:]
    assert not any(started_at(lab, f"{lab.name}-c").values())

    code, _, err = cli("down", "-i", cluster_b, "--no-logs", "--yes", "--results", str(tmp_path))
    assert code == 0, err[-3000:]
    assert not any(started_at(lab, name_b).values())
    assert started_at(lab, name_a) == before_a  # not restarted, not touched
    code, st_a, _ = cli_json("status", "-i", cluster_a)
    assert code == 0 and st_a["alive_nodes"] == 3, st_a


def test_a_worker_removed_from_the_inventory_leaves_the_cluster(
    cluster_a: str, lab: LabInfo, tmp_path: Path
) -> None:
    worker = lab.nodes[2]
    smaller = Path(tmp_path / "smaller.yaml")
    document = yaml.safe_load(Path(cluster_a).read_text())
    edited_inventory(
        Path(cluster_a),
        smaller,
        workers=[w for w in document["workers"] if w["name"] != worker.name],
    )
    # Ray still counts the worker: status names it, and is not healthy
    code, st, _ = cli_json("status", "-i", str(smaller))
    assert code == 1 and st["outside_inventory"] == [worker.address], st
    assert st["alive_nodes"] == st["expected_nodes"] == 2
    code, text, _ = cli("status", "-i", str(smaller))
    assert code == 1 and f"does not list: {worker.address}" in text, text

    # up removes this cluster's Ray and its token there, and says so
    code, up_doc, err = cli_json("up", "-i", str(smaller))
    assert code == 0, err[-3000:]
    assert up_doc["departed"]["removed"] == [worker.name], up_doc["departed"]
    assert f"{worker.name} ({worker.address}): this cluster's Ray removed" in err
    assert started_at(lab, lab.name)[worker.name] == ""
    token = f".provisioner/clusters/{lab.name}/auth_token"
    assert ssh(lab, worker, f"test -e {token}").returncode == 1
    # the GCS drops the node after its health checks fail (bound: 60 s, not a target)
    end = time.monotonic() + 60
    while True:
        code, st, _ = cli_json("status", "-i", str(smaller))
        if code == 0 or time.monotonic() > end:
            break
        time.sleep(3)
    assert code == 0 and st["outside_inventory"] == [] and st["alive_nodes"] == 2, st

    # back in the inventory: up brings it back alone
    code, up_doc, err = cli_json("up", "-i", cluster_a)
    assert code == 0 and up_doc["started"] == [worker.name], err[-3000:]
    # a restart without the token (its node left the cluster) cannot start Ray again
    assert ssh(lab, worker, f"rm {token}").returncode == 0
    restart = ssh(lab, worker, f"docker restart {lab_container(lab)}")
    assert restart.returncode != 0 and "auth_token" in restart.stderr, restart
    code, up_doc, err = cli_json("up", "-i", cluster_a)
    assert code == 0 and up_doc["started"] == [worker.name], err[-3000:]


def raylets(lab: LabInfo, cluster: str) -> dict[str, list[str]]:
    """Each node's raylet processes of a host-mode cluster (their command line names the
    cluster's temp dir, as the host runtime's stop finds them): PIDs, which change when Ray
    is restarted."""
    mark = temp_dir_mark(cluster)
    found = {}
    for node in lab.nodes:
        listing = ssh(lab, node, "ps -e -ww -o pid=,comm=,args=").stdout.splitlines()
        found[node.name] = [
            line.split()[0] for line in listing if line.split()[1:2] == ["raylet"] and mark in line
        ]
    return found


def test_host_mode_clusters_share_the_nodes(host_lab: LabInfo, tmp_path: Path) -> None:
    """The same in host mode: two clusters from the nodes' own Python on their own blocks;
    the doctor names the other one by its processes; `down` of one leaves the other."""
    first = str(host_lab.inventory)
    name_b = f"{host_lab.name}-b"
    document = yaml.safe_load(host_lab.inventory.read_text())
    blocks = {}
    for suffix, base in (("b", 22000), ("c", 22500)):
        blocks[suffix] = str(
            edited_inventory(
                host_lab.inventory,
                tmp_path / f"{suffix}.yaml",
                cluster=f"{host_lab.name}-{suffix}",
                ray={**(document.get("ray") or {}), "port_base": base},
            )
        )
    try:
        for inventory in (first, blocks["b"]):
            code, doc, err = cli_json("up", "-i", inventory)
            assert code == 0 and doc["status"]["alive_nodes"] == 3, err[-3000:]
        before = raylets(host_lab, host_lab.name)
        assert all(before.values()) and all(raylets(host_lab, name_b).values())

        code, doc, _ = cli_json("doctor", "-i", blocks["c"])
        assert code == 1
        found = [f for f in doc["findings"] if f["check"] == "ray.cluster"]
        errors = [f for f in found if f["severity"] == "error"]
        assert len(errors) == 3, found
        assert all(
            f"cluster {name_b}'s Ray (processes in the temp dir of cluster {name_b})"
            in f["message"]
            and "22600-22999" in f["message"]  # B's workers, C's workers
            and ("22500-22508" if f["host"] == host_lab.nodes[0].name else "22503-22508")
            in f["message"]  # C's single ports in B's worker range (22500-22502: head only)
            for f in errors
        ), errors
        assert sum(f"cluster {host_lab.name}'s Ray" in f["message"] for f in found) == 3

        code, _, err = cli("down", "-i", blocks["b"], "--no-logs")
        assert code == 0, err[-3000:]
        assert not any(raylets(host_lab, name_b).values())
        assert raylets(host_lab, host_lab.name) == before  # untouched
        code, st, _ = cli_json("status", "-i", first)
        assert code == 0 and st["alive_nodes"] == 3, st
    finally:
        for inventory in (blocks["b"], first):
            cli("down", "-i", inventory, "--no-logs")


def test_host_and_docker_clusters_share_the_nodes_and_up_relays_the_pin(
    host_lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    """On the host-mode lab's nodes (which have Docker too): the host-mode cluster and a
    docker cluster of another name and block. The docker cluster's `up` (push: auto) finds
    no node holding the pin and sends it through the forwarding relay: the control machine
    sends one image for the three nodes. A job runs on each cluster; `down` of the docker
    cluster leaves the host-mode cluster's raylets as they were."""
    first = str(host_lab.inventory)
    name_d = f"{host_lab.name}-d"
    pin = read_pin(image_pin)
    docker_inv = str(
        edited_inventory(
            host_lab.inventory,
            tmp_path / "d.yaml",
            cluster=name_d,
            runtime="docker",
            image={"lock": str(image_pin)},
            ray={"port_base": 24000},
        )
    )
    cli("down", "-i", docker_inv, "--no-logs")  # a kept lab: what an earlier run left
    for node in host_lab.nodes:  # no node holds the pin: up must push it
        ssh(host_lab, node, f"docker rmi -f {pin.image_id} {pin.tag} >/dev/null 2>&1; true")
    try:
        code, doc, err = cli_json("up", "-i", first)
        assert code == 0 and doc["status"]["alive_nodes"] == 3, err[-3000:]
        before = raylets(host_lab, host_lab.name)
        assert all(before.values())

        code, doc, err = cli_json("up", "-i", docker_inv)
        assert code == 0, err[-3000:]
        assert doc["runtime"] == "docker" and doc["status"]["alive_nodes"] == 3, doc["status"]
        assert doc["status"]["address"].endswith(":24000"), doc["status"]
        push = doc["push"]
        assert push["ok"] and push["mode"] == "chain", push
        # One stream left this machine, into the chain's first node; the others got the same
        # bytes from a peer. Plain, that stream is the image; compressed, a fraction of it.
        from_here = [n for n in push["nodes"] if n["via"] == "control"]
        assert len(from_here) == 1 and len(push["nodes"]) == 3, push
        sent = push["control_bytes"]
        assert sent == from_here[0]["bytes_sent"], push
        if from_here[0]["codec"]:
            assert 0.1 * pin.size < sent < 0.95 * pin.size, push
        else:
            assert 0.95 * pin.size < sent < 1.2 * pin.size, push
        for n in push["nodes"]:
            assert 0 < n["bytes_sent"] <= 1.05 * sent, push  # the stream from here, relayed
        assert push["busiest_node_bytes"] < 1.2 * sent, push
        held = [
            ssh(host_lab, n, f"docker image inspect -f '{{{{.Id}}}}' {pin.image_id}").stdout.strip()
            for n in host_lab.nodes
        ]
        assert held == [pin.image_id] * 3, held

        playbook = tmp_path / "where.py"
        playbook.write_text(WHERE_AM_I)
        for inventory, port in ((first, 6379), (docker_inv, 24000)):
            code, job, err = cli_json(
                "submit", "-i", inventory, "--results", str(tmp_path / str(port)), str(playbook)
            )
            assert code == 0 and job["status"] == "SUCCEEDED", err[-3000:]
            assert f"{host_lab.nodes[0].address}:{port} NODES 3" in err, err[-3000:]

        code, _, err = cli("down", "-i", docker_inv, "--no-logs")
        assert code == 0, err[-3000:]
        assert not any(started_at(host_lab, name_d).values())
        assert raylets(host_lab, host_lab.name) == before  # untouched
        code, st, _ = cli_json("status", "-i", first)
        assert code == 0 and st["alive_nodes"] == 3, st
    finally:
        cli("down", "-i", docker_inv, "--no-logs")
        cli("down", "-i", first, "--no-logs")
        for node in host_lab.nodes:  # the lab's disk: the pin is not needed there again
            ssh(host_lab, node, f"docker rmi -f {pin.image_id} >/dev/null 2>&1; true")


def containers(lab: LabInfo, cluster: str, also: str = "") -> dict[str, str]:
    """Each node's containers of the cluster called CLUSTER (its label; and the one
    called ALSO): `NAME ID running cluster-id` lines, sorted ('' when none)."""
    fmt = (
        "{{.Name}} {{.Id}} {{.State.Running}} "
        '{{with index .Config.Labels "provisioner.cluster-id"}}{{.}}{{end}}'
    )
    found = f"$(docker ps -aq --filter label=provisioner.cluster={cluster}"
    found += f"; docker ps -aq --filter name=^{also}$)" if also else ")"
    return {
        node.name: "\n".join(
            sorted(
                set(
                    ssh(lab, node, f"docker inspect -f '{fmt}' {found} 2>/dev/null")
                    .stdout.strip()
                    .splitlines()
                )
            )
        )
        for node in lab.nodes
    }


def test_a_namesake_cluster_from_another_state_folder_is_left_alone_by_our_up_and_down(
    lab: LabInfo,
    cluster_inventory: Path,
    image_pin: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two state folders, one cluster name, the same nodes (as two users of one Docker, or
    one user on two machines): each cluster's containers carry its own id, in their label
    and their name; our `down` leaves theirs, our `up` refuses to start beside them (they
    would share the node folder); their own `down` removes them. A container that carries
    our container's very name but not our id label is not ours either: left alone, said so."""
    from tests.e2e.faults.record import scenario

    name = f"{lab.name}-same"
    # the same name; each on its own port block, as two users sharing nodes would be (clear
    # of the default store's ports on the head, 23300-23309: the doctor names that clash)
    inventories = {
        who: str(
            edited_inventory(
                cluster_inventory, tmp_path / f"{who}.yaml", cluster=name, ray={"port_base": base}
            )
        )
        for who, base in (("ours", 24000), ("theirs", 25000))
    }
    ours, theirs = tmp_path / "ours-state", tmp_path / "theirs-state"
    head = lab.nodes[0]

    def as_(state: Path, verb: str, *args: str) -> tuple[int, object, str]:
        monkeypatch.setenv("PROVISIONER_STATE_DIR", str(state))
        return cli_json(verb, "-i", inventories[state.name.split("-")[0]], *args)

    def cluster_id(state: Path) -> str:
        return (state / "clusters" / name / "cluster_id").read_text().strip()

    with scenario(
        "a cluster of the same name from another state folder on the same nodes; a "
        "container with our container's name but not our id",
        "our `down` leaves its containers running, our `up` refuses to start beside them "
        "(exit 1, saying whose they are); its own `down` removes them; the unlabelled "
        "container is left by our `down` and `up`, each saying so",
        kind="security",
    ) as s:
        try:
            code, _, err = as_(theirs, "up")
            assert code == 0, err[-3000:]
            before = containers(lab, name)
            their_id = cluster_id(theirs)
            their_name = layout.container_name(name, their_id)
            assert all(v == f"/{their_name} " + v.split()[1] + f" true {their_id}"
                       for v in before.values()), before  # fmt: skip
            s.saw(labelled=len(before))

            code, doc, err = as_(ours, "down", "--no-logs")
            s.expect("our_down", code, 0, err[-3000:])
            s.expect("kept", containers(lab, name) == before, True)  # the same, still running

            code, doc, err = as_(ours, "up")
            s.expect("our_up", code, 1, err[-3000:])
            said = err + str(doc)
            assert "another cluster of the same name" in said and their_id in said, said[-3000:]
            s.saw(named_theirs=their_id in said)
            s.expect("untouched", containers(lab, name) == before, True)

            # positive control: their own down does remove them
            code, _, err = as_(theirs, "down", "--no-logs")
            s.expect("their_down", code, 0, err[-3000:])
            s.expect("after_theirs", sorted(set(containers(lab, name).values())), [""])

            # a container with our very name and no id label: not ours, left alone
            our_id = cluster_id(ours)
            assert our_id != their_id
            our_name = layout.container_name(name, our_id)
            planted = ssh(
                lab, head, f"docker create --name {our_name} {read_pin(image_pin).image_id} true"
            )
            assert planted.returncode == 0, planted.stderr
            kept = containers(lab, name, also=our_name)[head.name]
            assert kept.startswith(f"/{our_name} ") and kept.endswith(" false"), kept
            code, doc, err = as_(ours, "down", "--no-logs")
            s.expect("down_planted", code, 0, err[-3000:])
            assert f"{our_name} on this node carries no cluster id" in err, err[-3000:]
            assert "left alone" in err and containers(lab, name, also=our_name)[head.name] == kept
            s.saw(down_said="carries no cluster id ... left alone")
            code, doc, err = as_(ours, "up")
            said = err + str(doc)
            assert code == 1 and "carries no cluster id" in said, said[-3000:]
            s.saw(up_planted=code)
            s.expect("planted_kept", containers(lab, name, also=our_name)[head.name] == kept, True)
            ssh(lab, head, f"docker rm -f {our_name}")

            # positive control: then ours starts, named and labelled with our id
            code, _, err = as_(ours, "up")
            s.expect("ours_up", code, 0, err[-3000:])
            now = containers(lab, name)
            assert all(v.startswith(f"/{our_name} ") and v.endswith(f" true {our_id}")
                       for v in now.values()), now  # fmt: skip
            s.saw(ours=len(now))
        finally:
            if (ours / "clusters" / name / "cluster_id").exists():  # a planted one left
                planted_name = layout.container_name(name, cluster_id(ours))
                ssh(lab, head, f"docker rm -f {planted_name} >/dev/null 2>&1; true")
            for state in (ours, theirs):
                as_(state, "down", "--no-logs")
        assert set(containers(lab, name).values()) == {""}
        s.observed = (
            "the other state folder's containers carried its own cluster id (label and "
            "name) on {labelled} nodes; our `down`: exit {our_down}, the same containers "
            "still running: {kept}; our `up`: exit {our_up} naming the other cluster's id: "
            "{named_theirs}, its containers untouched: {untouched}; its own `down` exit "
            "{their_down} removed them (containers left: [{after_theirs}]); a container "
            "created with our container's name and no id label: our `down` exit "
            "{down_planted} saying `{down_said}`; our `up` exit {up_planted} saying so; the "
            "container untouched by both: {planted_kept}; once it was removed our `up` exit "
            "{ours_up} started ours, named and labelled with our id, on {ours} nodes"
        )
