"""The cluster verbs' one path to a scheduler's nodes (cluster/allocation.py): an inventory
without a scheduler is taken as it is, nothing asked of any machine."""

from __future__ import annotations

from pathlib import Path

from provisioner.cluster import allocation
from provisioner.inventory import load_inventory
from provisioner.remote import Pool

INVENTORY = """\
cluster: demo
ssh:
  user: lab
head: 10.250.9.10
workers: [10.250.9.11]
"""


def test_an_inventory_without_a_scheduler_is_held_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    inventory = load_inventory(path)
    held, job = allocation.hold(inventory)
    assert (held, job) == (inventory, None)
    with Pool(inventory) as pool:  # no session opened: give_back asks no machine
        assert allocation.give_back(inventory, pool) is None
