"""A cold node's head start: which local image goes ahead of the pin, the pin's last chunk
held until it is in, and what it loaded removed once the pin is verified (pure logic;
the push itself: tests/e2e/test_image_push.py)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.runtime.docker.direct import SAVE_BPS, budget_for, head_start_image, held_back
from provisioner.runtime.docker.push_plan import verify_and_tag_command
from tests.unit.test_image_lock import L1, L2, L3, D, make_pin

BASE, TORCH, WHOLE, OTHER = ("sha256:" + c * 64 for c in "bcde")
LX = "sha256:" + "9" * 64
# layer sizes (1000, 500, 1500): half the pin is 1500
IMAGES = {BASE: (L1,), TORCH: (L1, L2), WHOLE: (L1, L2, L3), OTHER: (L1, LX)}


def test_the_longest_start_of_the_pin_that_fits_goes_ahead() -> None:
    pin = make_pin()
    assert head_start_image(pin, IMAGES, budget=10_000) == (TORCH, 2)
    # the link's budget cuts it to the base; under the base's bytes, nothing goes
    assert head_start_image(pin, IMAGES, budget=1200) == (BASE, 1)
    assert head_start_image(pin, IMAGES, budget=999) is None


def test_never_the_pin_itself_nor_more_than_half_of_it() -> None:
    pin = make_pin(layer_sizes=(1000, 600, 1400))  # base + torch: 1600 > half of 3000
    assert head_start_image(pin, IMAGES, budget=10_000) == (BASE, 1)
    assert head_start_image(pin, {WHOLE: (L1, L2, L3)}, budget=10_000) is None


def test_an_image_that_only_shares_the_base_counts_as_its_shared_start_only() -> None:
    pin = make_pin()
    # OTHER holds L1 then a layer the pin lacks: it does not start the pin
    assert head_start_image(pin, {OTHER: (L1, LX)}, budget=10_000) is None
    assert head_start_image(pin, {}, budget=10_000) is None


def test_no_head_start_when_the_pin_does_not_know_its_layer_sizes() -> None:
    assert head_start_image(make_pin(layer_sizes=None), IMAGES, budget=10_000) is None


def test_the_budget_is_what_the_link_carries_in_the_saves_lead() -> None:
    pin = make_pin(layer_sizes=(1_000_000_000, 500_000_000, 1_500_000_000))
    # 3 GB taken to prepare in 3e9 / SAVE_BPS s; a 100 MB/s link carries that long:
    assert budget_for("auto", pin, 100e6) == pytest.approx(100e6 * 3e9 / SAVE_BPS)
    slow = budget_for("auto", pin, 20e6)
    assert head_start_image(pin, {"sha256:" + "b" * 64: (L1,)}, slow) is None  # 1 GB > budget
    assert budget_for("never", pin, 1e12) == 0
    assert budget_for("always", pin, 0) == float("inf")


def test_the_last_chunk_waits_for_the_head_start_and_only_the_last() -> None:
    seen: list[str] = []

    def chunks() -> Iterator[bytes]:
        for c in (b"a", b"b", b"c"):
            seen.append(f"made {c.decode()}")
            yield c

    for chunk in held_back(chunks(), lambda: seen.append("waited")):
        seen.append(f"sent {chunk.decode()}")
    assert seen == ["made a", "made b", "sent a", "made c", "sent b", "waited", "sent c"]
    assert list(held_back(iter(()), lambda: seen.append("empty"))) == [] and seen[-1] == "empty"


def test_a_stream_that_breaks_ends_without_its_last_chunk() -> None:
    called: list[bool] = []

    def broken() -> Iterator[bytes]:
        yield b"a"
        yield b"b"
        raise OSError("docker save died")

    got: list[bytes] = []
    with pytest.raises(OSError):
        for chunk in held_back(broken(), lambda: called.append(True)):
            got.append(chunk)
    # the node's docker load never sees the tar's end, so it loads nothing half-sent
    assert got == [b"a"] and called == []


def test_what_went_ahead_is_removed_only_after_the_pin_is_verified_and_tagged() -> None:
    evil = "sha256:x; rm -rf /"
    cmd = verify_and_tag_command(D, "provisioner/ray:cluster", evil)
    assert f"docker image rm {shlex.quote(evil)}" in cmd
    assert cmd.index("docker tag") < cmd.index("docker image rm")
    # chained with &&: nothing is removed unless the pin is there under its tag, and the
    # removal's own failure does not fail the push
    assert cmd.rstrip().endswith("|| true; }")
    assert "docker image rm" not in verify_and_tag_command(D)


@pytest.mark.parametrize("held", [True, False])
def test_the_removal_runs_only_for_a_verified_pin_and_never_fails_the_push(
    held: bool, tmp_path: Path
) -> None:
    """The command run by bash against a stand-in `docker` that logs its calls: `rm`
    fails, as it would for an image already gone."""
    log = tmp_path / "calls"
    fake = tmp_path / "docker"
    fake.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {shlex.quote(str(log))}\n'
        'case "$1 $2" in\n'
        f'  "image inspect") {"echo " + D if held else "exit 1"} ;;\n'
        '  "image rm") exit 1 ;;\n'
        "esac\n"
    )
    fake.chmod(0o755)
    cmd = verify_and_tag_command(D, "provisioner/ray:cluster", BASE)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    rc = subprocess.run(["bash", "-c", cmd], env=env, check=False).returncode
    calls = log.read_text().splitlines()
    assert (rc == 0) == held
    assert (f"image rm {BASE}" in calls) == held
