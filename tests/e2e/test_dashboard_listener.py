"""Issue 27 (7) on the lab: the token goes only to this cluster's dashboard.

A plain Python HTTP server that records every request it gets listens where the cluster's
dashboard should, while the cluster is down: as root (in docker mode the dashboard is
root's too, so the owner alone proves nothing), as another user of the head (uid 4242, no
account) and as the SSH user. The client refuses each before a byte is sent: none of this
cluster's Ray processes holds that socket. Positive controls: the real dashboard (root, in
the Ray container) gets the token and a job runs; the same recorder run in a container
named and labelled as this cluster's gets the token, so the recorder would have seen it.
"""

from __future__ import annotations

import json
from pathlib import Path

from provisioner.image.pin import read_pin
from provisioner.inventory import load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import (
    local_token_path,
    ray_container,
    read_cluster_id,
    read_token_file,
)
from tests.e2e.faults.lab import cli, on_node
from tests.e2e.faults.record import scenario
from tests.e2e.helpers import RECORDER

DIR = "/tmp/listener-e2e"
STRANGER = 4242


def listening(port: int) -> str:
    """Shell: true while something listens on 127.0.0.1:PORT (read from the socket table,
    so the probe itself sends no request)."""
    return f"grep -q '0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp"


def start_recorder(head: LabNode, port: int, uid: int, log: str) -> str:
    """The recorder on the head's 127.0.0.1:PORT as `uid`; its pid once it listens."""
    on_node(head, f"mkdir -p {DIR} && chmod 1777 {DIR} && rm -f {log}")
    on_node(head, f"cat > {DIR}/recorder.py <<'EOF'\n{RECORDER}\nEOF\nchmod 644 {DIR}/recorder.py")
    pid = on_node(
        head,
        f"setpriv --reuid={uid} --regid={uid} --clear-groups "
        f"python3 {DIR}/recorder.py {port} {log} >/dev/null 2>&1 </dev/null & echo $!",
    ).strip()
    on_node(head, f"for i in $(seq 100); do {listening(port)} && exit 0; sleep 0.1; done; exit 1")
    owner = on_node(head, f"stat -c %u /proc/{pid}").strip()
    assert owner == str(uid), owner  # positive control: it runs as that user
    return pid


def stop(head: LabNode, pid: str, port: int) -> None:
    on_node(
        head, f"kill {pid}; for i in $(seq 100); do {listening(port)} || exit 0; sleep 0.1; done"
    )


def refused(inv: str, head: LabNode, port: int, uid: int, book: Path) -> str:
    """The recorder on the port as `uid`, the cluster down: `jobs list` and `submit` must
    refuse, naming the uid, before a byte is sent. What the recorder got ('' expected)."""
    log = f"{DIR}/stranger-{uid}.log"
    pid = start_recorder(head, port, uid, log)
    try:
        listed = cli("jobs", "list", "-i", inv, "--json")
        sub = cli("submit", "-i", inv, "--detach", "--json", str(book / "hello.py"))
        got = on_node(head, f"cat {log} 2>/dev/null; true")
    finally:
        stop(head, pid, port)
    assert listed.code == 1, listed.text[-3000:]
    error = json.loads(listed.stdout)["error"]
    assert error["kind"] == "NotThisCluster", error
    message = error["message"]
    assert f"uid {uid} that is not this cluster's Ray" in message, message
    assert "not sent" in message, message
    assert sub.code == 1 and f"uid {uid}" in sub.text, sub.text[-3000:]
    return got


def test_a_stranger_listening_where_the_dashboard_should_gets_no_token(
    cluster_inventory: Path, lab: LabInfo, image_pin: Path, tmp_path: Path
) -> None:
    inv = str(cluster_inventory)
    inventory = load_inventory(cluster_inventory)
    port = inventory.ports.dashboard
    token = read_token_file(local_token_path(inventory))
    head = lab.nodes[0]
    book = tmp_path / "book"
    book.mkdir()
    (book / "hello.py").write_text("print('the real dashboard ran this')\n")
    with scenario(
        "another process of the head listens where the cluster's dashboard should (the "
        "cluster down), and records every request: root's (as any process in docker mode "
        "would be), another user's, the SSH user's own",
        "submit and jobs list refuse (exit 1) naming its uid, as not this cluster's Ray; the "
        "recorder gets no request; the real dashboard gets the token and runs the job; the "
        "same recorder in a container named and labelled as this cluster's gets it",
        kind="security",
    ) as s:
        up = cli("up", "-i", inv, "--json")
        assert up.code == 0, up.stderr[-3000:]
        owner = on_node(head, f"grep '0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp")
        s.expect("owner", owner.split()[7], "0", owner)  # the real dashboard: root's
        ran = cli(
            "submit",
            "-i",
            inv,
            "--verbose",
            "--results",
            str(tmp_path / "r"),
            str(book / "hello.py"),
        )
        assert ran.code == 0 and "the real dashboard ran this" in ran.text, ran.text[-3000:]
        s.saw(ran=ran.code)

        down = cli("down", "-i", inv, "--yes", "--no-logs", "--results", str(tmp_path / "d"))
        assert down.code == 0, down.text[-3000:]
        own_uid = int(on_node(head, f"id -u {head.user}"))
        got = {uid: refused(inv, head, port, uid, book) for uid in (0, STRANGER, own_uid)}
        assert got == {0: "", STRANGER: "", own_uid: ""}, got  # not one request, no token
        # (refused() asserted each: jobs list and submit exit 1, NotThisCluster, the uid)
        s.saw(
            listeners=["root", "another user", "the SSH user"],
            exit=1,
            kind="NotThisCluster",
            requests=sum(len(v) for v in got.values()),
        )

        # positive control: the same recorder where this cluster's Ray would run (a
        # container with its name and id label, the node's network) does get the token
        name = ray_container(inventory)
        cluster_id = read_cluster_id(inventory)
        own = f"{DIR}/own.log"
        on_node(head, f"rm -f {own}")
        on_node(
            head,
            f"docker run -d --name {name} --net=host --label provisioner.cluster-id={cluster_id} "
            f"-v {DIR}:{DIR} {read_pin(image_pin).image_id} python3 {DIR}/recorder.py "
            f"{port} {own} && for i in $(seq 100); do {listening(port)} && exit 0; "
            "sleep 0.1; done; exit 1",
        )
        try:
            labelled = cli("jobs", "list", "-i", inv, "--json")  # fails: the recorder is not Ray
            seen = on_node(head, f"cat {own}")
        finally:
            on_node(head, f"docker rm -f {name} >/dev/null")
        s.expect(
            "bearer",
            f"Authorization: Bearer {token}" in seen,
            True,
            seen[:300] + labelled.text[-2000:],
        )
        s.observed = (
            "the real dashboard's socket is uid {owner}'s and the job it was sent ran (exit "
            "{ran}); with the recorder on the port as {listeners}: jobs list and submit exit "
            "{exit}, error {kind} naming its uid, the recorder got {requests} bytes of "
            "request; the same recorder in a container named and labelled as this cluster's "
            "got the bearer token (positive control): {bearer}"
        )
        s.measure(port=port, uids=[0, STRANGER, own_uid])
        s.measured = "dashboard port {port}, uids {uids}"
    again = cli("up", "-i", inv, "--json")
    assert again.code == 0, again.stderr[-3000:]
