"""load_inventory: detect the format, parse, resolve, validate."""

from __future__ import annotations

import re
from pathlib import Path

from provisioner.errors import InventoryError
from provisioner.inventory.ansible import is_ansible_yaml, parse_ini, parse_yaml_groups, to_raw
from provisioner.inventory.located import load_yaml
from provisioner.inventory.models import Inventory
from provisioner.inventory.native import parse_native
from provisioner.inventory.raw import RawInventory
from provisioner.inventory.resolve import build, read_ssh_config

_INI_START = re.compile(r"^\s*\[[A-Za-z0-9_.:-]+\]\s*$", re.MULTILINE)


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


def _looks_ini(path: Path, text: str) -> bool:
    if path.suffix in (".ini", ".cfg"):
        return True
    first = next(
        (
            line
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith(("#", ";"))
        ),
        "",
    )
    return bool(_INI_START.match(first))


def parse(path: Path, text: str) -> RawInventory:
    """The inventory's content in any supported format."""
    if _looks_ini(path, text):
        return to_raw(path, parse_ini(path, text))
    document = load_yaml(path, text)
    if is_ansible_yaml(document):
        return to_raw(path, parse_yaml_groups(path, document))
    return parse_native(path, document)


def load_inventory(path: Path, *, ssh_config: Path | None = None) -> Inventory:
    """Read and validate an inventory (provisioner YAML, Ansible INI or YAML).

    ~/.ssh/config (or `ssh_config`) supplies HostName, User, Port, IdentityFile and
    ProxyJump where the inventory does not say them. Raises InventoryError.
    """
    path = Path(path).expanduser().absolute()
    return build(parse(path, _read(path)), read_ssh_config(ssh_config))
