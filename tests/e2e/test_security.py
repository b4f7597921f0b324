"""Security end to end on the lab: hostile inventories, the token's whereabouts, what other
nodes can reach, and the modes of secret files.

A hostile value either makes the inventory fail to load (exit 2, the field named) or
reaches a node's shell quoted: a marker file that an injected command would create never
appears on any node. Each scenario records what it observed (tests/e2e/faults/record.py).
"""

from __future__ import annotations

import io
import json
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.cli import run
from provisioner.cluster import render
from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import local_token_path, ray_container, read_token
from provisioner.remote import Pool
from provisioner.runtime.docker import runtime as docker
from provisioner.runtime.docker.runtime import DockerRuntime
from tests.e2e.faults.lab import cli, edited_inventory, on_node, probe
from tests.e2e.faults.record import scenario

MARKER = "/tmp/provisioner-pwned"
HOSTILE = [
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"x; touch {MARKER}",
    f"x' ; touch {MARKER}; '",
    f'x" ; touch {MARKER}; "',
    f"x\ntouch {MARKER}",
    f"x && touch {MARKER} #",
    f"x | touch {MARKER}",
    f"-oProxyCommand=touch {MARKER}",
    f"--help; touch {MARKER}",
    "y" * 5000 + f"$(touch {MARKER})",
]
# Every inventory field that reaches a command on a node, and where it sits in the YAML.
REJECTED_FIELDS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "cluster": lambda d, v: d.update(cluster=v),
    "ssh.user": lambda d, v: d["ssh"].update(user=v),
    "ssh.jump": lambda d, v: d["ssh"].update(jump=v),
    "ssh.port": lambda d, v: d["ssh"].update(port=v),
    "head.name": lambda d, v: d["head"].update(name=v),
    "head.address": lambda d, v: d["head"].update(address=v),
    "workers[0].name": lambda d, v: d["workers"][0].update(name=v),
    "workers[0].address": lambda d, v: d["workers"][0].update(address=v),
    "workers[0].user": lambda d, v: d["workers"][0].update(user=v),
    "ray.shm_size": lambda d, v: d.setdefault("ray", {}).update(shm_size=v),
    "ray.object_store_memory": lambda d, v: d.setdefault("ray", {}).update(object_store_memory=v),
    "ray.ports.gcs": lambda d, v: d.setdefault("ray", {}).update(ports={"gcs": v}),
}


def no_marker_anywhere(lab: LabInfo) -> bool:
    """Neither on a node's disk nor in the login user's view of it."""
    return all(probe(n, f"test -e {MARKER}")[0] != 0 for n in lab.nodes)


@pytest.fixture(scope="module")
def inv(cluster_inventory: Path) -> Iterator[str]:
    """The lab cluster, up (idempotent); down at the end."""
    run = cli("up", "-i", str(cluster_inventory), "--json")
    assert run.code == 0, run.stderr[-3000:]
    yield str(cluster_inventory)
    cli("down", "-i", str(cluster_inventory), "--no-logs")


def in_process(*args: str) -> tuple[int, str]:
    """The CLI in this process (a hundred runs in seconds): exit code, stdout + stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue() + err.getvalue()


def test_hostile_values_in_validated_fields_are_rejected(lab: LabInfo, tmp_path: Path) -> None:
    base = edited_inventory(lab.inventory, tmp_path / "base.yaml").read_text()
    with scenario(
        "hostile inventory values in names, addresses, users, ports, sizes, jump host",
        "the inventory is refused (exit 2, the field named) before any connection; "
        "no marker file on any node",
        kind="security",
    ) as s:
        tried, exits = 0, set()
        for field, put in REJECTED_FIELDS.items():
            for value in HOSTILE:
                doc = yaml.safe_load(base)
                put(doc, value)
                path = tmp_path / "inv.yaml"
                path.write_text(yaml.safe_dump(doc))
                for command in ("doctor", "up", "status", "image push", "down", "logs"):
                    code, text = in_process(*command.split(), "-i", str(path))
                    assert code == 2, (field, value[:40], command, text[-500:])
                    assert field.split(".")[-1].split("[")[0] in text, (field, text)
                    assert "Traceback" not in text and "unexpected" not in text
                    tried += 1
                    exits.add(code)
        s.expect("marker", no_marker_anywhere(lab), True)
        s.saw(tried=tried, fields=len(REJECTED_FIELDS), values=len(HOSTILE), exits=exits)
        s.observed = (
            "{tried} runs of doctor, up, status, image push, down and logs with {fields} "
            "fields x {values} hostile values: each exit {exits} naming the field, no "
            "traceback; no marker file on any node: {marker}"
        )


def test_hostile_labels_and_resources_reach_the_node_quoted(
    lab: LabInfo, cluster_inventory: Path
) -> None:
    """Free-text fields (labels, resource names) are accepted, so they must arrive at the
    node's shell as one word each: the exact `docker run` of `up` and the `ray start` of
    cluster.yaml run through the node's real login shell, with `docker`/`ray` as shell
    functions that print the words they receive."""
    inventory = load_inventory(cluster_inventory)
    token = local_token_path(inventory)
    with scenario(
        "hostile inventory values in free-text fields (Ray labels and resource names)",
        "quoted: each reaches the node's shell as one word of `docker run` / `ray start`; "
        "no marker file on any node",
        kind="security",
    ) as s:
        checked = 0
        with Pool(inventory) as pool:
            for value in HOSTILE:
                node = replace(
                    inventory.workers[0], labels={"zone": value}, resources={value[:200]: 1.0}
                )
                inv = replace(inventory, workers=(node,))
                session = pool.session(node)
                shim = "docker() { printf '%s\\0' \"$@\"; }; ray() { printf '%s\\0' \"$@\"; }; "
                run_cmd = docker.docker_run_command(inv, node, "img")
                result = session.run(shim + run_cmd, timeout=30).check()
                words = result.stdout.split("\0")
                assert f"--labels=zone={value}" in words, words[-12:]
                (res,) = [w for w in words if w.startswith("--resources=")]
                assert json.loads(res.removeprefix("--resources=")) == {value[:200]: 1.0}
                runtime = DockerRuntime(inv, None, image="img")
                start = render.build_config(inv, token, runtime)["worker_start_ray_commands"][-1]
                result = session.run(shim + start, timeout=30).check()
                assert f"--labels=zone={value}" in result.stdout.split("\0")
                checked += 2
        s.expect("marker", no_marker_anywhere(lab), True)
        s.saw(checked=checked, values=len(HOSTILE))
        s.observed = (
            "{checked} commands (`up`'s `docker run`, cluster.yaml's `ray start`) with "
            "{values} hostile values run by a node's login shell: each value arrived as one "
            "intact word; no marker file on any node: {marker}"
        )


def test_token_never_shown(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    inventory = load_inventory(Path(inv))
    token = read_token(inventory)
    token_on_node = shlex.quote(f".provisioner/clusters/{inventory.cluster}/auth_token")
    book = tmp_path / "book" / "hello.py"
    book.parent.mkdir()
    book.write_text("print('hello from the job', flush=True)\n")
    with scenario(
        "the cluster token's whereabouts",
        "never in `ps` on any node, cluster.yaml, collected logs, the output of `up` (which "
        "installs it), `submit --json` and the other commands, or the tool's own files; "
        "secret files mode 0600",
        kind="security",
    ) as s:
        for node in lab.nodes:  # this `up` must install the token again
            on_node(node, f"rm -f /home/{node.user}/{token_on_node}")
        runs = {
            "up": cli("up", "-i", inv, "--json"),
            "status": cli("status", "-i", inv, "--json"),
            "doctor": cli("doctor", "-i", inv, "--json"),
            "submit": cli(
                "submit", "-i", inv, "--results", str(tmp_path / "r"), "--json", str(book)
            ),
            "logs": cli("logs", "-i", inv, "-o", str(tmp_path / "logs"), "--json"),
            "render": cli("render", "-i", inv, "-o", str(tmp_path / "cluster.yaml")),
        }
        for name, run in runs.items():
            assert token not in run.text, name
        s.saw(outputs=list(runs))
        assert runs["up"].code == 0 and runs["logs"].code == 0, runs["up"].stderr[-2000:]
        # positive controls: the output searched holds what it should
        assert runs["submit"].code == 0, runs["submit"].stderr[-2000:]
        assert "hello from the job" in runs["submit"].text
        s.expect("job", runs["submit"].json()["status"], "SUCCEEDED")
        assert token not in (tmp_path / "cluster.yaml").read_text()
        assert "ray start" in (tmp_path / "cluster.yaml").read_text()
        files = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
        assert len(files) > 3 and not [p for p in files if token.encode() in p.read_bytes()]
        assert any(p.name == "raylet.out" for p in files), [p.name for p in files][:20]
        shown: set[str] = set()
        for node in lab.nodes:  # every process of the node, its nested containers' included
            ps = on_node(node, "ps auxwwe")
            assert token not in ps, node.name
            # positive control: this `ps` shows Ray's processes and their environments
            assert "raylet" in ps and "RAY_AUTH_TOKEN_PATH=" in ps, (node.name, ps[-2000:])
            shown |= {w for w in ("raylet", "RAY_AUTH_TOKEN_PATH") if w in ps}
            if node == lab.nodes[0]:
                assert "gcs_server" in ps, ps[-2000:]
                shown.add("gcs_server (on the head)")
            # the `up` above installed it: the node's file holds the token, mode 0600
            out = on_node(node, f"stat -c '%a %U' /home/{node.user}/{token_on_node}")
            assert out.split() == ["600", node.user], (node.name, out)
            held = on_node(node, f"cat /home/{node.user}/{token_on_node}").strip()
            assert held == token, node.name
        state = Path(inventory.state_dir)
        holders = [p for p in state.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
        s.expect("holders", len(holders), 1)
        assert holders == [local_token_path(inventory)], holders
        modes = {str(p): oct(p.stat().st_mode & 0o777) for p in (holders[0], lab.key)}
        s.expect("modes", sorted(set(modes.values())), ["0o600"])
        s.saw(nodes=len(lab.nodes), shown=shown)
        s.observed = (
            "absent from `ps` with environments on {nodes} nodes (which shows {shown}), "
            "cluster.yaml, the collected logs (raylet.out among them), the output of {outputs} "
            "(up installed it on every node again; submit --json showed the job's output, the "
            "job {job}), and the state dir but for its own file ({holders} file); the local "
            "token, node tokens and the lab key are mode {modes}"
        )
        s.measure(files=len(files))
        s.measured = "{files} collected log files searched"


REACH = """
import socket, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    s = socket.create_connection((host, port), timeout=3)
except OSError as e:
    print("unreachable", type(e).__name__); sys.exit(0)
s.sendall(f"GET {path} HTTP/1.0\\r\\nHost: {host}\\r\\n\\r\\n".encode())
s.settimeout(5)
try:
    print((s.recv(200).decode(errors="replace").splitlines() or ["(no answer)"])[0])
except OSError as e:
    print("no-answer", type(e).__name__)
"""


def test_dashboard_and_jobs_api_not_reachable_from_another_node(inv: str, lab: LabInfo) -> None:
    inventory = load_inventory(Path(inv))
    head, worker = lab.nodes[0], lab.nodes[1]
    ports = inventory.ports
    with scenario(
        "dashboard and Jobs API from another node, without the tunnel",
        "the dashboard (Jobs API) port is closed to other nodes; the dashboard agent's "
        "HTTP port refuses a call without the token",
        kind="security",
    ) as s:
        seen = {}
        targets = {
            "dashboard /api/jobs/": (worker, head.address, ports.dashboard, "/api/jobs/"),
            "agent /api/job_agent/jobs/": (
                worker, head.address, ports.dashboard_agent_http, "/api/job_agent/jobs/"
            ),
            # positive controls: the worker does reach the head (its GCS port), and the
            # dashboard is up, answering on the head's own loopback
            "GCS": (worker, head.address, ports.gcs, "/"),
            "dashboard on the head's 127.0.0.1": (head, "127.0.0.1", ports.dashboard, "/api/jobs/"),
        }  # fmt: skip
        for what, (node, host, port, path) in targets.items():
            script = f"python3 -c {shlex.quote(REACH)} {host} {port} {path}"
            seen[what] = on_node(node, script).strip()
        s.expect("dashboard", seen["dashboard /api/jobs/"].split()[0], "unreachable")
        assert " 401 " in seen["agent /api/job_agent/jobs/"], seen
        s.saw(agent=401)
        s.expect("gcs", not seen["GCS"].startswith("unreachable"), True)
        s.expect("on_head", seen["dashboard on the head's 127.0.0.1"][:5], "HTTP/")
        s.observed = (
            "from a worker: the dashboard port {dashboard} (bound to the head's 127.0.0.1) "
            "while the head's GCS port accepts the same worker's connection: {gcs}; on the "
            "head itself the dashboard answers ({on_head}...); the dashboard agent's HTTP port "
            "answers {agent} without the token"
        )
        s.measure(
            seen=[
                f"{k}: {v if v.isprintable() else 'connected (a binary answer)'}"
                for k, v in seen.items()
            ]
        )
        s.measured = "{seen}"


NODE_LABELS = """
import json, ray
ray.init(address="auto", logging_level="ERROR")
alive = [[n["NodeManagerAddress"], n["Labels"]] for n in ray.nodes() if n["Alive"]]
print("NODES=" + json.dumps(alive))
"""


def labelled(inventory: Path, target: Path, labels: dict[str, str]) -> Path:
    """A copy of the inventory whose first worker has `labels`."""
    path = edited_inventory(inventory, target)
    document = yaml.safe_load(path.read_text())
    first = document["workers"][0]
    document["workers"][0] = {
        **(first if isinstance(first, dict) else {"address": first}),
        "labels": labels,
    }
    path.write_text(yaml.safe_dump(document))
    return path


def test_labels_reach_ray_as_one_label_each(inv: str, lab: LabInfo, tmp_path: Path) -> None:
    """Ray reads `--labels=k=v,k=v`: a value holding `,` or `=` would become other labels.
    Such a value is refused before any connection; one that Ray's syntax allows arrives as
    exactly that label, in Ray's own node list on the live cluster. Last in the module: the
    worker keeps its labels until the module's `down`."""
    inventory = load_inventory(Path(inv))
    worker = lab.nodes[1]
    with scenario(
        "Ray labels with `,` and `=` in their values",
        "refused (exit 2, the field named) before any connection, since Ray would read them "
        "as several labels; a label Ray's syntax allows reaches Ray as exactly that one label",
        kind="security",
    ) as s:
        refused = {}
        for value in ("a,b=c", "a=b", "gpu,zone=x"):
            hostile = labelled(Path(inv), tmp_path / "hostile.yaml", {"zone": value})
            code, text = in_process("up", "-i", str(hostile))
            assert code == 2 and "labels.zone" in text and "Traceback" not in text, text[-800:]
            refused[value] = code
        labels = {"example.com/zone": "rack-1.row_2", "tier": "a-b"}
        with_labels = labelled(Path(inv), tmp_path / "labelled.yaml", labels)
        on_node(worker, f"docker rm -f {ray_container(inventory)}")  # `up` starts it again
        up = cli("up", "-i", str(with_labels), "--json")
        assert up.code == 0, up.stderr[-3000:]
        head = lab.nodes[0]
        # The removed container's raylet left without a goodbye: the GCS lists it alive (with
        # no labels) until its health checks fail, beside the new one. Wait for one per node.
        deadline = time.monotonic() + 120
        while True:
            # Ray may log warnings (a lagging raylet's heartbeats) on the same output: the
            # answer is the one line that carries the marker.
            printed = on_node(
                head, f"docker exec {ray_container(inventory)} python -c {shlex.quote(NODE_LABELS)}"
            )
            marked = [line for line in printed.splitlines() if line.startswith("NODES=")]
            assert marked, printed[-2000:]
            listed = json.loads(marked[-1].removeprefix("NODES="))
            addresses = [address for address, _ in listed]
            if len(addresses) == len(set(addresses)) or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert sorted(addresses) == sorted(n.address for n in lab.nodes), listed
        own = {
            address: {k: v for k, v in node_labels.items() if not k.startswith("ray.io/")}
            for address, node_labels in listed
        }
        assert own == {n.address: (labels if n == worker else {}) for n in lab.nodes}, own
        s.saw(
            refused=[f"`{v}`" for v in refused],
            exits=sorted(set(refused.values())),
            labels=sorted(f"`{k}: {v}`" for k, v in own[worker.address].items()),
            others=sorted({len(v) for a, v in own.items() if a != worker.address}),
        )
        s.observed = (
            "`up` with the values {refused}: exit {exits} naming the label, nothing started; "
            "{labels}: Ray's node list shows exactly these labels on that worker and {others} "
            "on the others"
        )
        s.measure(up=up.seconds)
        s.measured = "up with the labels {up:.1f} s"
