"""The image build lock: re-entrant in one process, exclusive across processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.local import build_lock, state_root

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
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    said: list[str] = []
    with build_lock(said.append):
        assert not other_process_can_lock()
        with build_lock(said.append):  # re-entrant: the SLURM image's build nests the host's
            assert not other_process_can_lock()
        assert not other_process_can_lock()  # the inner exit does not release it
    assert other_process_can_lock()
    assert said == []  # nobody else held it: no word of waiting


HOLD_LOCK = (
    "import fcntl, sys, time\n"
    "f = open(sys.argv[1], 'a')\n"
    "fcntl.flock(f, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(1.5)\n"
    "open(sys.argv[2], 'w').close()\n"  # the mark, then the lock goes with the file
    "f.close()\n"
)


def test_a_second_builder_says_it_waits_then_gets_the_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path / "state"))
    lock = state_root() / "images.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    mark = tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock), str(mark)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    said: list[str] = []
    with build_lock(said.append):
        assert mark.exists()  # it got the lock only once the holder let it go
    holder.wait(timeout=30)
    assert said == [f"waiting for another image build on this machine to end ({lock})"]
