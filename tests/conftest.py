"""Test-wide fixtures: the user's own ~/.ssh and home are hidden from every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.local import state_root

# Where labs keep their state is fixed before HOME is hidden, so that a lab made by an
# earlier run (or by `make lab`) is found and reused.
os.environ.setdefault("PROVISIONER_STATE_DIR", str(state_root()))


@pytest.fixture(autouse=True)
def hidden_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    # ssh -G reads the account's ~/.ssh/config whatever $HOME says: point it at the hidden one
    # (an empty one: a PROVISIONER_SSH_CONFIG naming no file is an error)
    config = home / ".ssh" / "config"
    config.parent.mkdir(mode=0o700)
    config.touch()
    monkeypatch.setenv("PROVISIONER_SSH_CONFIG", str(config))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield home
