"""Token rotation on the lab: a worker that leaves the inventory while the control machine
cannot reach it keeps its Ray and the token; a new token keeps it out when it comes back.

Up on 3 nodes; the worker drops SSH from the control machine (`lab fault isolate`: Ray's
own traffic goes on); an inventory without it: `up` warns, naming it and the fix;
`up --rotate-token` restarts every node with a new token; the fault undone, the worker's
Ray container restarted on its node (as a reboot would) is refused by the head ("Ray:
InvalidAuthToken", or with TLS the old CA's certificate at the handshake) and the GCS
lists only the 2 inventory nodes; a later `up` removes the old Ray there (the record kept
the node). The same worker unreached by `down`: a warning, exit 0, and the next `up` (a
fresh head) rotates by itself. The session's cluster is whole again at the end of each
test.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from provisioner.lab import faults
from provisioner.lab.nodes import LabInfo
from tests.e2e.faults.lab import container_state, edited_inventory, lab_container, on_node, probe
from tests.e2e.helpers import cli, cli_json, ssh

# Ray 2.60's error for a missing or wrong token; with TLS on (the default) the rotation's
# new CA refuses the old certificates first, at the handshake (gRPC's own message)
REFUSED = ("InvalidAuthToken", "Handshake failed", "CERTIFICATE_VERIFY_FAILED")


def refusal(text: str) -> str | None:
    """The first of Ray's refusals found in `text`."""
    return next((mark for mark in REFUSED if mark in text), None)


def refused_in_logs(lab: LabInfo, worker_index: int, bound: float = 90) -> str:
    """Poll the worker's Ray container log until the head's refusal shows; return the log."""
    node = lab.nodes[worker_index]
    end = time.monotonic() + bound
    text = ""
    while time.monotonic() < end:
        _, text = probe(node, f"docker logs --tail 200 {lab_container(lab)} 2>&1")
        if refusal(text):
            break
        time.sleep(3)
    return text


def inventories(cluster_inventory: Path, lab: LabInfo, tmp_path: Path) -> tuple[str, str]:
    """The session's cluster, and the same without its last worker; both with a short
    connect timeout (the unreached worker costs 3 s per command)."""
    quick = {"connect_timeout": 3}
    full = edited_inventory(cluster_inventory, tmp_path / "full.yaml", ssh=quick)
    document = yaml.safe_load(cluster_inventory.read_text())
    smaller = edited_inventory(
        cluster_inventory,
        tmp_path / "smaller.yaml",
        ssh=quick,
        workers=[w for w in document["workers"] if w["name"] != lab.nodes[2].name],
    )
    return str(full), str(smaller)


def test_a_new_token_keeps_an_unreached_departed_worker_out(
    cluster_inventory: Path, lab: LabInfo, tmp_path: Path
) -> None:
    full, smaller = inventories(cluster_inventory, lab, tmp_path)
    worker = lab.nodes[2]
    code, _, err = cli("up", "-i", full)
    assert code == 0, err[-3000:]
    token_file = f".provisioner/clusters/{lab.name}/auth_token"
    held = f"sha256sum < {token_file}"  # which token the worker holds, not the token
    before = ssh(lab, worker, held).stdout
    assert before.strip(), "no token on the worker after up"
    faults.isolate(lab, worker)
    try:
        assert ssh(lab, worker, "true", timeout=30).returncode != 0
        # up without the worker: it cannot be reached, the head is not restarted: a warning
        code, doc, err = cli_json("up", "-i", smaller)
        assert code == 0, err[-3000:]
        assert doc["started"] == [] and doc["token"]["rotated"] is False, doc["token"]
        assert [e["name"] for e in doc["token"]["exposed"]] == [worker.name]
        assert worker.name in doc["departed"]["errors"], doc["departed"]
        (warning,) = doc["warnings"]
        assert f"{worker.name} ({worker.address}) left the inventory" in warning
        assert "`provisioner up --rotate-token`" in warning and "running jobs stop" in warning
        assert f"warning: {worker.name} ({worker.address})" in err, err[-3000:]

        # --rotate-token: a new token, every inventory node restarted with it
        code, doc, err = cli_json("up", "-i", smaller, "--rotate-token")
        assert code == 0, err[-3000:]
        assert doc["token"]["rotated"] is True and doc["token"]["why"], doc["token"]
        assert sorted(doc["started"]) == sorted(n.name for n in lab.nodes[:2]), doc["started"]
        assert doc["warnings"] == [] and doc["status"]["alive_nodes"] == 2
        code, text, _ = cli("up", "-i", smaller, "--no-doctor")  # nothing left to warn about
        assert code == 0 and "warning" not in text and "rotated" not in text, text
    finally:
        faults.unisolate(lab, worker)
    assert ssh(lab, worker, "true", timeout=30).returncode == 0
    # the worker still holds the old token; its Ray, restarted on the node, is refused
    assert ssh(lab, worker, held).stdout == before
    on_node(worker, f"docker restart {lab_container(lab)}")
    log = refused_in_logs(lab, 2)
    assert refusal(log), log[-2000:]
    code, st, _ = cli_json("status", "-i", smaller)
    alive = sorted(g["ip"] for g in st["gcs_nodes"] if g["alive"])
    assert alive == sorted(n.address for n in lab.nodes[:2]), st["gcs_nodes"]
    assert code == 0 and st["outside_inventory"] == [], st

    # reachable again: the next up removes the old Ray there (the record kept the node)
    code, doc, err = cli_json("up", "-i", smaller)
    assert code == 0 and doc["departed"]["removed"] == [worker.name], err[-3000:]
    assert doc["token"]["rotated"] is False and doc["warnings"] == []
    assert container_state(lab, worker) == "absent"
    assert ssh(lab, worker, f"test -e {token_file}").returncode == 1

    # the session's cluster whole again: the worker rejoins with the new token
    code, doc, err = cli_json("up", "-i", full)
    assert code == 0 and doc["started"] == [worker.name], err[-3000:]


def test_down_warns_and_the_next_up_rotates_by_itself(
    cluster_inventory: Path, lab: LabInfo, tmp_path: Path
) -> None:
    """`down` that cannot reach a departed worker: exit 0 with a warning; the next `up`
    starts a fresh head anyway, so it changes the token by itself."""
    full, smaller = inventories(cluster_inventory, lab, tmp_path)
    worker = lab.nodes[2]
    code, _, err = cli("up", "-i", full)
    assert code == 0, err[-3000:]
    faults.isolate(lab, worker)
    try:
        code, doc, err = cli_json("down", "-i", smaller, "--no-logs")
        assert code == 0 and doc["ok"] is True, err[-3000:]
        assert [e["name"] for e in doc["token"]["exposed"]] == [worker.name], doc
        (warning,) = doc["warnings"]
        assert f"{worker.name} ({worker.address}) left the inventory" in warning
        assert "next `provisioner up`" in warning and f"warning: {worker.name}" in err

        code, doc, err = cli_json("up", "-i", smaller)
        assert code == 0, err[-3000:]
        assert doc["token"]["rotated"] is True, doc["token"]
        assert worker.name in doc["token"]["why"] and "anyway" in doc["token"]["why"]
        assert doc["warnings"] == [] and doc["status"]["alive_nodes"] == 2
    finally:
        faults.unisolate(lab, worker)
    code, doc, err = cli_json("up", "-i", smaller)
    assert code == 0 and doc["departed"]["removed"] == [worker.name], err[-3000:]
    assert container_state(lab, worker) == "absent"
    code, doc, err = cli_json("up", "-i", full)
    assert code == 0 and doc["started"] == [worker.name], err[-3000:]
