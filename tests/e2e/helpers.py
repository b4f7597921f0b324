"""Helpers for end-to-end tests: reach lab nodes through the real OpenSSH client."""

from __future__ import annotations

import io
import json
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.cli import run
from provisioner.lab import faults
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo


def ssh_args(lab: LabInfo, node: LabNode, *extra: str) -> list[str]:
    """OpenSSH client arguments with STRICT host key checking against the lab's known_hosts."""
    return lab.ssh_command(node, *extra)


def ssh(
    lab: LabInfo, node: LabNode, command: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run a command on a lab node through the real OpenSSH client."""
    return subprocess.run(
        [*ssh_args(lab, node), command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def ssh_only_through_a_jump(lab: LabInfo, node: LabNode) -> Iterator[None]:
    """`node` drops SSH from the control machine (`lab fault isolate`); other nodes still
    reach it. Undone when the block ends (and by `lab fault clear` after an aborted run)."""
    faults.isolate(lab, node)
    try:
        direct = ssh(lab, node, "true")
        assert direct.returncode != 0, f"{node.name} still answers SSH from the control machine"
        yield
    finally:
        faults.unisolate(lab, node)


def jumped_inventory(source: Path, target: Path, lab: LabInfo, node: LabNode) -> Path:
    """A copy of the inventory `source` (paths made absolute) where `node` is reached
    through the head (`jump: USER@HEAD:22`), with a short connect timeout."""
    from tests.e2e.faults.lab import edited_inventory

    edited_inventory(source, target, ssh={"connect_timeout": 3})
    document = yaml.safe_load(target.read_text())
    head = lab.nodes[0]
    (entry,) = [w for w in document["workers"] if w["name"] == node.name]
    entry["jump"] = f"{head.user}@{head.address}:22"
    target.write_text(yaml.safe_dump(document))
    return target


def cli(*args: str) -> tuple[int, str, str]:
    """The CLI in-process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run(list(args))
    return code, out.getvalue(), err.getvalue()


def cli_json(*args: str) -> tuple[int, Any, str]:
    """The CLI with --json: exit code, the parsed stdout, stderr."""
    code, out, err = cli(*args, "--json")
    return code, json.loads(out), err


# Every resume test's return before and after its resume point, one JSON line per resume,
# for the notes (the lead quotes them): the path resumed, the fresh policy's return, the
# mean of the iterations up to the resume point and of the first ones after it.
RETURNS_RECORD = Path(__file__).resolve().parents[2] / "build" / "resume-returns.jsonl"


def record_returns(
    path: str, at: int, fresh: float, before: float | None, after: float | None
) -> None:
    """Append one resume's figures to build/resume-returns.jsonl (None: no episode)."""

    def fig(value: float | None) -> float | None:
        return None if value is None else round(value, 2)

    row: dict[str, Any] = {"path": path, "at": at, "fresh": fig(fresh)}
    row["before"], row["after"] = fig(before), fig(after)
    row["test"] = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    row["when"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    RETURNS_RECORD.parent.mkdir(parents=True, exist_ok=True)
    with open(RETURNS_RECORD, "a") as f:
        f.write(json.dumps(row) + "\n")


# An HTTP server that appends every request it gets (request line and headers) to the file
# named by its 2nd argument and answers 200 "{}": run as `python3 -c RECORDER PORT LOG` or
# from a file, where the token must not go (a stranger's listener on a dashboard port).
RECORDER = """
import http.server, sys
class Recorder(http.server.BaseHTTPRequestHandler):
    def answer(self):
        with open(sys.argv[2], "a") as f:
            f.write(self.requestline + "\\n" + str(self.headers) + "\\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")
    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = answer
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Recorder).serve_forever()
"""


# An unchanged Tune script's start: Ray, and a worker (a node other than the driver's, the
# head) its trial is pinned to, where only storage every node shares takes its checkpoints.
TUNE_ON_A_WORKER = """\
import json, os, sys, tempfile
import ray
from ray import tune

ray.init()
here = ray.util.get_node_ip_address()
worker = next(
    n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] != here
)
"""
# Its trial checkpoints three times (issue 44, item 3): Ray refuses a local path there
# ("Unable to set up cluster storage"); with the head's store it succeeds.
TUNE_CHECKPOINTS = (
    TUNE_ON_A_WORKER
    + """
def train(config):
    for i in range(3):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"i": i, "node": ray.util.get_node_ip_address()}, f)
            tune.report(
                {"it": i, "node": ray.util.get_node_ip_address()},
                checkpoint=tune.Checkpoint.from_directory(d),
            )

trainable = tune.with_resources(train, {"cpu": 1, f"node:{worker}": 0.01})
result = tune.Tuner(trainable).fit().get_best_result(metric="it", mode="max")
print("DRIVER", here, "TRIAL_NODE", result.metrics["node"])
"""
)


def tune_checkpoints_come_home(inventory: str, results: Path, workers: list[str]) -> None:
    """Submit TUNE_CHECKPOINTS unchanged: SUCCEEDED, its three checkpoints home, written on
    the `workers` (addresses)."""
    book = results / "tunebook"
    book.mkdir()
    (book / "tune_ckpt.py").write_text(TUNE_CHECKPOINTS)
    code, out, err = cli(
        "submit", "-i", inventory, "--results", str(results), "--json", str(book / "tune_ckpt.py")
    )
    assert code == 0, err[-3000:]
    tune = json.loads(out)
    assert tune["status"] == "SUCCEEDED", err[-3000:]
    states = sorted((results / tune["job_id"]).glob("ray_results/*/*/checkpoint_*/state.json"))
    nodes = {json.loads(p.read_text())["node"] for p in states}
    assert len(states) == 3 and nodes <= set(workers), states


# A module on the two-network lab (conftest.data_lab: SSH on one network, Ray's traffic on the
# other) imports these two: its tests' `lab`, and its `inventory` with the cluster up for the
# module and down at its end (the data network's own tests start from no cluster).
@pytest.fixture(scope="module", name="lab")
def data_lab_for_module(data_lab: LabInfo) -> LabInfo:
    return data_lab


@pytest.fixture(scope="module", name="inventory")
def data_cluster_for_module(data_lab: LabInfo) -> Iterator[str]:
    path = str(data_lab.inventory)
    code, _, err = cli("up", "-i", path)
    assert code == 0, err[-3000:]
    yield path
    cli("down", "-i", path, "--no-logs")
