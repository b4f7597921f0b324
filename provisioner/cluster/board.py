"""Live TensorBoard on the head: `provisioner tunnel` starts it where Ray runs (the pinned
image carries tensorboard; in host mode, the node's own Python), over the cluster's
results directory, so the event files of running jobs are seen as they are written, not
only once they come home. It listens on the head's 127.0.0.1 at the port of the cluster's
block (`tunnel.tensorboard_port`), reached through the SSH tunnel, and is stopped when the
tunnel that started it ends.

TensorBoard has no authentication: another user logged in on the head can read the
scalars at that port while it runs (the dashboard, in contrast, asks for the token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from provisioner.errors import OperationError
from provisioner.remote import Session
from provisioner.runtime.protocol import Runtime

MARK = "PROVISIONER_BOARD "


@dataclass(frozen=True)
class Board:
    """What `serve` found or did on the head."""

    state: str  # started | running (already listening) | missing (no tensorboard) | failed
    port: int
    pid: int | None = None
    logdir: str = ""
    error: str = ""
    fix: str = ""

    @property
    def serving(self) -> bool:
        return self.state in ("started", "running")


def _script() -> bytes:
    return resources.files("provisioner.cluster").joinpath("board_head.py").read_bytes()


def parse_board(stdout: str) -> dict[str, object] | None:
    """Pure: the marked JSON line of board_head.py's output (None when there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            found = json.loads(line[len(MARK) :])
            return found if isinstance(found, dict) else None
    return None


def judge(found: dict[str, object], port: int, *, in_image: bool) -> Board:
    """Pure: the Board of a `serve` answer, with a fix when TensorBoard cannot run."""
    state = str(found.get("state", "failed"))
    pid = found.get("pid")
    board = Board(
        state=state,
        port=port,
        pid=pid if isinstance(pid, int) else None,
        logdir=str(found.get("logdir", "")),
        error=str(found.get("error", "")),
    )
    if state == "missing":
        python = found.get("python", "python3")
        error = (
            "the cluster's image has no tensorboard (built before it was added)"
            if in_image
            else f"tensorboard is not installed in the Python Ray runs with ({python})"
        )
        fix = (
            "rebuild and push the image: `provisioner image build`, then `provisioner up`"
            if in_image
            else f"on the head: `{python} -m pip install tensorboard`"
        )
        return Board(state=state, port=port, error=error, fix=fix)
    if state == "failed":
        return Board(
            state=state,
            port=port,
            error=board.error,
            fix="see the log named above on the head; `provisioner tunnel` tries again",
        )
    return board


def serve(session: Session, runtime: Runtime, port: int, *, timeout: float = 180) -> Board:
    """Start TensorBoard on the head's 127.0.0.1:`port` over the results directory, unless
    something listens there already (`tunnel` then checks whose it is)."""
    result = session.run(
        runtime.python_command("serve", str(port)), timeout=timeout, stdin=_script()
    )
    found = parse_board(result.stdout)
    if found is None:
        raise OperationError(
            f"starting TensorBoard on the head failed: {result.tail(8) or 'no output'}",
            "check that the cluster is up (`provisioner status`)",
            where=runtime.inventory.head.name,
        )
    return judge(found, port, in_image=runtime.caps.needs_image)


def stop(session: Session, runtime: Runtime, board: Board) -> None:
    """Stop the TensorBoard `serve` started (nothing when it found one running)."""
    if board.state != "started" or board.pid is None:
        return
    command = runtime.python_command("stop", str(board.pid), str(board.port))
    session.run(command, timeout=60, stdin=_script())
