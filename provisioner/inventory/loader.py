"""load_inventory: detect the format, parse, resolve, validate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from provisioner.errors import InventoryError
from provisioner.inventory.allocation import read_allocation, with_allocation
from provisioner.inventory.ansible import parse_ansible
from provisioner.inventory.fields import TOP_FIELDS, Where
from provisioner.inventory.located import LocatedMap, load_yaml
from provisioner.inventory.models import Inventory
from provisioner.inventory.native import parse_native
from provisioner.inventory.raw import RawInventory
from provisioner.inventory.resolve import build

_YAML_SUFFIXES = (".yaml", ".yml", ".json")
_GROUP_KEYS = {"hosts", "vars", "children"}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(
            f"inventory {path} does not exist",
            "pass -i with the path of your inventory (see inventories/ for examples)",
        ) from None
    except IsADirectoryError:
        raise InventoryError(
            f"inventory {path} is a directory", "pass the inventory file itself"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(
            f"cannot read inventory {path}: {exc}", "check the file's permissions and encoding"
        ) from None


def is_native(document: Any) -> bool:
    """provisioner's own YAML: top-level cluster/ssh/head/workers/image/ray, where head is an
    address or a node (not an Ansible group of hosts/vars/children)."""
    if not isinstance(document, dict) or not document:
        return False
    if any(k in document for k in ("cluster", "ssh", "image", "ray")):
        return True
    head = document.get("head")
    if isinstance(head, str) or (isinstance(head, dict) and not set(head) <= _GROUP_KEYS):
        return True
    return isinstance(document.get("workers"), list) and set(document) <= set(TOP_FIELDS)


def _check_groups(path: Path, groups: dict[Any, Any], prefix: str = "") -> None:
    """The shape of an Ansible YAML inventory: groups of hosts, vars and children, each a
    mapping. What ansible-core would refuse or skip with a warning (both refused here too)
    is refused at once, with its line, without starting ansible-core."""

    def refuse(mapping: Any, key: Any, message: str) -> InventoryError:
        line = mapping.line_of(key) if isinstance(mapping, LocatedMap) else 0
        return Where(path, line).error(
            f"{prefix}{key}",
            message[:200],
            "see inventories/ansible.yaml (or provisioner's own: inventories/onprem.yaml)",
        )

    for name, group in groups.items():
        if group is None:
            continue
        if not isinstance(group, dict):
            raise refuse(groups, name, f"expected a group (hosts, vars, children), got {group!r}")
        for key, value in group.items():
            if key not in _GROUP_KEYS:
                raise refuse(group, key, "unknown key in a group: expected hosts, vars, children")
            if value is not None and not isinstance(value, dict):
                raise refuse(group, key, f"expected a mapping, got {value!r}")
        for host, host_vars in (group.get("hosts") or {}).items():
            if host_vars is not None and not isinstance(host_vars, dict):
                raise refuse(
                    group["hosts"], host, f"expected the host's variables, got {host_vars!r}"
                )
        _check_groups(path, group.get("children") or {}, f"{prefix}{name}.children.")


def parse(path: Path, text: str) -> RawInventory:
    """The inventory's content: provisioner's YAML, or anything ansible-core reads."""
    if path.suffix.lower() in _YAML_SUFFIXES:
        document = load_yaml(path, text)  # syntax errors named with their line here
        if not isinstance(document, dict) or is_native(document):
            return parse_native(path, document)  # not a mapping: refused there, with the fix
        _check_groups(path, document)
        return parse_ansible(path)
    try:
        document = load_yaml(path, text)
    except InventoryError:
        return parse_ansible(path)  # INI (or TOML): not YAML at all
    return parse_native(path, document) if is_native(document) else parse_ansible(path)


def load_inventory(
    path: Path, *, ssh_config: Path | None = None, openssh: bool | None = None
) -> Inventory:
    """Read and validate an inventory (provisioner YAML, or Ansible INI/YAML/TOML read by
    ansible-core).

    ~/.ssh/config (or `ssh_config`) is applied as OpenSSH applies it (`ssh -G`; paramiko's
    reader where no ssh client is installed, or with openssh=False). Raises InventoryError.
    """
    path = Path(path).expanduser().absolute()
    inventory = build(parse(path, _read(path)), ssh_config, openssh=openssh)
    if inventory.slurm is not None:  # the nodes of the allocation `up` recorded, if any
        inventory = with_allocation(inventory, read_allocation(inventory))
    return inventory


def load_cluster(
    path: Path, *, ssh_config: Path | None = None, openssh: bool | None = None
) -> Inventory:
    """`load_inventory` for the verbs that work on the cluster's nodes: an inventory whose
    nodes come from a scheduler must have them (an allocation) first."""
    return require_nodes(load_inventory(path, ssh_config=ssh_config, openssh=openssh))


def require_nodes(inventory: Inventory) -> Inventory:
    """The inventory, when its nodes are known (a list, or a SLURM allocation)."""
    if inventory.slurm is not None and not inventory.allocated:
        raise InventoryError(
            f"cluster {inventory.cluster!r} has no SLURM allocation: its nodes are not known",
            "run `provisioner up -i INVENTORY` first (it asks SLURM for the nodes), or "
            "render a script for sbatch with `provisioner render --slurm`",
            where=str(inventory.path),
        )
    return inventory
