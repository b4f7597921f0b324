"""Issue 27 (7) on the lab: the token goes only to this cluster's dashboard.

Another user of the head (uid 4242, no account, nothing of ours) runs a plain Python HTTP
server where the cluster's dashboard listens, while the cluster is down, and records every
request it gets. The client refuses before a byte is sent. Positive controls: the real
dashboard (root, in the Ray container) gets the token and a job runs; the same recording
server run as the SSH user does get the token, so the recorder would have seen it.
"""

from __future__ import annotations

import json
from pathlib import Path

from provisioner.inventory import load_inventory
from provisioner.lab.config import LabNode
from provisioner.lab.nodes import LabInfo
from provisioner.node.token import local_token_path, read_token_file
from tests.e2e.faults.lab import cli, on_node
from tests.e2e.faults.record import scenario

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


def test_a_stranger_listening_where_the_dashboard_should_gets_no_token(
    cluster_inventory: Path, lab: LabInfo, tmp_path: Path
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
        "another user of the head listens where the cluster's dashboard should (the "
        "cluster down), and records every request",
        "submit and jobs list refuse (exit 1) naming the stranger's uid; the recorder gets "
        "no request; the real dashboard gets the token and runs the job; the same recorder "
        "run as the SSH user gets it",
        kind="security",
    ) as s:
        up = cli("up", "-i", inv, "--json")
        assert up.code == 0, up.stderr[-3000:]
        owner = on_node(head, f"grep '0100007F:{port:04X} 00000000:0000 0A' /proc/net/tcp")
        assert owner.split()[7] == "0", owner  # the real dashboard: root, in the container
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

        down = cli("down", "-i", inv, "--yes", "--no-logs", "--results", str(tmp_path / "d"))
        assert down.code == 0, down.text[-3000:]
        log = f"{DIR}/stranger.log"
        pid = start_recorder(head, port, STRANGER, log)
        try:
            listed = cli("jobs", "list", "-i", inv, "--json")
            sub = cli("submit", "-i", inv, "--detach", "--json", str(book / "hello.py"))
            got = on_node(head, f"cat {log} 2>/dev/null; true")
        finally:
            stop(head, pid, port)
        assert listed.code == 1, listed.text[-3000:]
        error = json.loads(listed.stdout)["error"]
        assert error["kind"] == "NotThisCluster", error
        assert f"uid {STRANGER}" in error["message"] and "not sent" in error["message"], error
        assert sub.code == 1 and f"uid {STRANGER}" in sub.text, sub.text[-3000:]
        assert got == "", got  # not one request, so no token

        own = f"{DIR}/own.log"
        pid = start_recorder(head, port, int(on_node(head, f"id -u {head.user}")), own)
        try:
            cli("jobs", "list", "-i", inv, "--json")  # fails: the recorder is not Ray
            seen = on_node(head, f"cat {own}")
        finally:
            stop(head, pid, port)
        assert f"Authorization: Bearer {token}" in seen, seen[:300]
        s.observed = (
            "the real dashboard's socket is root's and the job it was sent ran (exit 0); with "
            "the stranger's recorder on the port: jobs list and submit exit 1, error "
            "NotThisCluster naming its uid, the recorder got no request; the same recorder "
            "as the SSH user got the bearer token (positive control)"
        )
        s.measured = f"dashboard port {port}, stranger uid {STRANGER}"
    again = cli("up", "-i", inv, "--json")
    assert again.code == 0, again.stderr[-3000:]
