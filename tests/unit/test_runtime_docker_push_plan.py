"""Deciding what a node needs, from the facts one remote call gathers."""

from __future__ import annotations

import shlex

import pytest

from provisioner.errors import RemoteError
from provisioner.image.pin import CLUSTER_TAG
from provisioner.runtime.docker.push_plan import (
    SPARE_BYTES,
    ImageFacts,
    decide,
    facts_script,
    parse_facts,
    shared_prefix,
    verify_and_tag_command,
)
from tests.unit.test_image_lock import L1, L2, L3, D, make_pin

OTHER = "sha256:" + "f" * 64
LX = "sha256:" + "9" * 64

FACTS_OUTPUT = f"""docker=ok
root=/var/lib/docker
free=50000000000
tagged={OTHER}
image {OTHER} {L1} {L2} {LX}
image sha256:{"e" * 64} {L1}
"""


def test_parse_facts_reads_docker_state_space_tag_and_layers() -> None:
    facts = parse_facts(FACTS_OUTPUT)
    assert facts.docker == "ok"
    assert facts.free_bytes == 50_000_000_000
    assert facts.tagged_id == OTHER
    assert facts.images[OTHER] == (L1, L2, LX)
    assert parse_facts("docker=missing\n").docker == "missing"
    down = parse_facts("docker=down\ndocker_error=permission denied\n")
    assert (down.docker, down.docker_error) == ("down", "permission denied")


def test_shared_prefix_is_the_longest_ordered_prefix() -> None:
    pin = (L1, L2, L3)
    assert shared_prefix(pin, {}) == 0
    assert shared_prefix(pin, {"a": (L1, L2, LX), "b": (L1,)}) == 2
    assert shared_prefix(pin, {"a": (L2, L3)}) == 0  # same layers on another base: no chain
    assert shared_prefix(pin, {"a": (L1, L2, L3, LX)}) == 3


def test_a_node_holding_the_pin_under_the_tag_gets_nothing() -> None:
    facts = ImageFacts("ok", free_bytes=0, tagged_id=D, images={D: (L1, L2, L3)})
    assert decide(make_pin(), facts, "n").action == "none"


def test_a_node_holding_the_pin_under_another_tag_is_only_retagged() -> None:
    facts = ImageFacts("ok", free_bytes=0, tagged_id=OTHER, images={D: (L1, L2, L3)})
    assert decide(make_pin(), facts, "n").action == "tag"


def test_a_node_sharing_base_layers_gets_only_the_missing_ones() -> None:
    plan = decide(make_pin(), parse_facts(FACTS_OUTPUT), "n")
    assert plan.action == "send"
    assert plan.first_missing == 2
    assert plan.layers_to_send == (L3,)
    assert plan.need_bytes == 2 * 1500 + SPARE_BYTES


def test_an_empty_node_gets_every_layer() -> None:
    plan = decide(make_pin(), ImageFacts("ok", free_bytes=10**12), "n")
    assert (plan.action, plan.first_missing, plan.layers_to_send) == ("send", 0, (L1, L2, L3))


def test_too_little_disk_is_a_clear_error_before_sending() -> None:
    facts = ImageFacts("ok", root="/var/lib/docker", free_bytes=SPARE_BYTES, images={})
    with pytest.raises(RemoteError) as err:
        decide(make_pin(), facts, "node-1")
    assert err.value.kind == "no-space"
    assert err.value.host == "node-1"
    assert "/var/lib/docker" in str(err.value) and err.value.fix


@pytest.mark.parametrize("state", ["missing", "down"])
def test_no_docker_is_a_clear_error(state: str) -> None:
    with pytest.raises(RemoteError) as err:
        decide(make_pin(), ImageFacts(state, docker_error="denied"), "node-2")  # type: ignore[arg-type]
    assert err.value.kind == "no-docker"
    assert err.value.fix and "docker" in err.value.fix


def test_commands_quote_the_tag_and_id() -> None:
    evil = "x; rm -rf /"
    assert shlex.quote(evil) in facts_script(evil)
    assert shlex.quote(CLUSTER_TAG) in facts_script()
    cmd = verify_and_tag_command(D, evil)
    assert f"docker tag {D} {shlex.quote(evil)}" in cmd
    # the tag is moved only after the ID is confirmed
    assert cmd.index("docker image inspect") < cmd.index("docker tag")
