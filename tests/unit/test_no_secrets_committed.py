"""Nothing secret or machine-specific is committed: no private keys, tokens or lab state."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")


def _tracked() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p]


def test_no_private_keys_or_tokens_are_tracked() -> None:
    offenders = []
    for path in _tracked():
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        name = path.name
        if name in ("id_ed25519", "id_rsa", "auth_token", "token") or name.endswith(".pem"):
            offenders.append(str(path))
            continue
        text = path.read_bytes().decode(errors="ignore")
        if PRIVATE_KEY.search(text) and "tests/" not in str(path.relative_to(ROOT)):
            offenders.append(str(path))
    assert offenders == []


def test_lab_state_and_build_outputs_are_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    for entry in (".venv/", "images/.wheelhouse/", "/results/", "cluster.yaml"):
        assert entry in ignored
