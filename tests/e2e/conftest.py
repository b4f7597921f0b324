"""The end-to-end lab: one session-scoped lab of real nodes shared by every e2e test.

Name and subnet come from PROVISIONER_LAB_NAME / PROVISIONER_LAB_SUBNET (default: a lab
named `e2e` on 10.250.100.0/24, apart from a user's `make lab`). Tests undo the faults
they inject; leftovers from an aborted run are cleared at the start. The lab is removed
at the end unless PROVISIONER_KEEP_LAB=1 (then the next run starts in seconds).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.lab import faults
from provisioner.lab.config import LabConfig
from provisioner.lab.nodes import LabInfo, lab_down, lab_up

E2E_NAME = os.environ.get("PROVISIONER_LAB_NAME", "e2e")
E2E_SUBNET = os.environ.get("PROVISIONER_LAB_SUBNET", "10.250.100.0/24")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def lab_config() -> LabConfig:
    return LabConfig(name=E2E_NAME, subnet=E2E_SUBNET, nodes=3)


@pytest.fixture(scope="session")
def lab(lab_config: LabConfig) -> Iterator[LabInfo]:
    try:
        info = lab_up(lab_config, print)
    except InputError:  # a leftover lab of that name on another subnet: start clean
        lab_down(lab_config)
        info = lab_up(lab_config, print)
    faults.clear(info)
    yield info
    faults.clear(info)
    if os.environ.get("PROVISIONER_KEEP_LAB") != "1":
        lab_down(lab_config)


@pytest.fixture(scope="session")
def lab_inventory(lab: LabInfo) -> Path:
    return lab.inventory
