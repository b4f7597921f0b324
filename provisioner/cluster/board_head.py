"""Runs on the HEAD where Ray runs (sent on stdin to the runtime's `python_command`: inside
the Ray container, or the node's own Python in host mode); not imported locally. Standard
library only, besides TensorBoard itself.

`python - serve PORT` -> TensorBoard over the cluster's results directory
    ($PROVISIONER_RESULTS_ROOT: every job's RESULTS/JOB/tensorboard/ event files, running
    jobs' too) on 127.0.0.1:PORT, started detached unless something listens there already
`python - stop PID PORT [GRACE]` -> stop the TensorBoard that `serve` started as PID
    (only when PID is a TensorBoard on PORT), and wait until it is gone (SIGKILL after
    GRACE seconds, default STOP_SECONDS)

Prints one line `PROVISIONER_BOARD <json>` on stdout: {"state": "started" | "running" |
"missing" | "failed" | "stopped" | "killed" | "gone", ...}; `stop` answers once the
process has exited and nothing listens on PORT any more.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MARK = "PROVISIONER_BOARD "
RESULTS_ROOT_ENV = "PROVISIONER_RESULTS_ROOT"
START_SECONDS = 120  # TensorBoard imports a lot; on a busy head it may take a while
STOP_SECONDS = 15  # after SIGTERM, before SIGKILL


def _emit(**document: Any) -> int:
    sys.stdout.write(MARK + json.dumps(document) + "\n")
    sys.stdout.flush()
    return 0


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def board_args(python: str, logdir: str, port: int) -> list[str]:
    """TensorBoard on the head's loopback only (the SSH tunnel is the way in)."""
    return [
        python,
        "-m",
        "tensorboard.main",
        "--logdir",
        logdir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def serve(port: int) -> int:
    root = os.environ.get(RESULTS_ROOT_ENV, "")
    if not root:
        return _emit(state="failed", error=f"${RESULTS_ROOT_ENV} is not set where Ray runs")
    if _listening(port):
        return _emit(state="running", logdir=root)
    if importlib.util.find_spec("tensorboard") is None:
        return _emit(state="missing", python=sys.executable)
    Path(root).mkdir(parents=True, exist_ok=True)
    log = Path(root).resolve().parent / f"tensorboard-{port}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            board_args(sys.executable, root, port),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this script and the SSH session
            close_fds=True,
        )
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return _emit(
                state="failed", error=f"exit {proc.returncode}: {_tail(log)}", log=str(log)
            )
        if _listening(port):
            return _emit(state="started", pid=proc.pid, logdir=root, log=str(log))
        time.sleep(0.5)
    proc.kill()
    return _emit(state="failed", error=f"not listening after {START_SECONDS} s: {_tail(log)}")


def _ended(pid: int) -> bool:
    """Whether PID has exited (gone, or a zombie its new parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()
    return not fields or fields[0] == "Z"


def _wait_ended(pid: int, port: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _ended(pid) and not _listening(port):
            return True
        time.sleep(0.1)
    return False


def stop(pid: int, port: int, grace: float = STOP_SECONDS) -> int:
    """SIGTERM, and wait until it has exited and its port is free (then the tunnel's end
    means the port is free for the next one), SIGKILL after `grace` seconds."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _emit(state="gone")
    if b"tensorboard.main" not in words or str(port).encode() not in words:
        return _emit(state="gone")  # the pid is another process's now
    os.kill(pid, signal.SIGTERM)
    if _wait_ended(pid, port, grace):
        return _emit(state="stopped")
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    ended = _wait_ended(pid, port, 5)
    return _emit(state="killed" if ended else "failed", error="" if ended else "still there")


def main(argv: list[str]) -> int:
    if argv[0] == "serve":
        return serve(int(argv[1]))
    grace = float(argv[3]) if len(argv) > 3 else STOP_SECONDS
    return stop(int(argv[1]), int(argv[2]), grace)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
