"""The lab's image build lock: re-entrant in one process, exclusive across processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.lab.images import build_lock
from provisioner.local import state_root

TRY_LOCK = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'a')\n"
    "try:\n"
    "    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    "except BlockingIOError:\n"
    "    sys.exit(3)\n"
)


def other_process_can_lock() -> bool:
    lock = state_root() / "images.lock"
    rc = subprocess.run([sys.executable, "-c", TRY_LOCK, str(lock)], timeout=60).returncode
    assert rc in (0, 3), rc
    return rc == 0


def test_held_through_nesting_and_released_at_the_outer_exit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    with build_lock():
        assert not other_process_can_lock()
        with build_lock():  # re-entrant: ensure_slurm_node_image calls ensure_host_node_image
            assert not other_process_can_lock()
        assert not other_process_can_lock()  # the inner exit does not release it
    assert other_process_can_lock()
