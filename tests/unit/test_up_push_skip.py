"""`up` asks no node about the image twice: what the doctor's round saw is passed on."""

from __future__ import annotations

from pathlib import Path

from provisioner.checks.facts import parse_facts
from provisioner.doctor.run import DoctorReport
from provisioner.runtime.docker.doctor import parse as docker_parse
from provisioner.runtime.docker.push import push_image
from tests.unit.inventories import make_inventory
from tests.unit.test_image_lock import make_pin

PIN_ID = "sha256:" + "a" * 64


def _report(images: dict[str, str], pin_id: str = PIN_ID) -> DoctorReport:
    facts = {}
    for name, image in images.items():
        text = f"@@image\n{image}\n" if image else ""
        facts[name] = parse_facts(name, text, runtime=docker_parse)
    return DoctorReport(findings=[], nodes=list(images), facts=facts, pin_id=pin_id)


def test_holding_names_only_nodes_whose_image_id_is_the_pin() -> None:
    report = _report({"a": f"{PIN_ID} linux/amd64", "b": "", "c": "sha256:" + "b" * 64 + " x/y"})
    assert report.holding(PIN_ID) == {"a": PIN_ID}


def test_holding_is_empty_for_an_id_the_round_did_not_ask_about() -> None:
    report = _report({"a": f"{PIN_ID} linux/amd64"})
    assert report.holding("sha256:" + "c" * 64) == {}
    assert report.holding("") == {}


def test_a_push_to_nodes_that_all_hold_the_pin_opens_no_connection(tmp_path: Path) -> None:
    inventory = make_inventory(tmp_path)
    pin = make_pin(image_id=PIN_ID)
    names = [n.name for n in inventory.nodes]
    # pool=None: a push that asked any node would open its own connections (and fail)
    report = push_image(inventory, None, pin=pin, held=names)
    assert report.ok and sorted(report.nodes) == sorted(names)
    assert {(n.action, n.via, n.bytes_sent) for n in report.nodes.values()} == {
        ("none", "doctor", 0)
    }
