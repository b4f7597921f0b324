"""Ansible inventories read by ansible-core itself, in a child process.

`python -P provisioner/inventory/ansible_core.py INVENTORY...` prints one JSON document per
inventory: the hosts of the head and worker groups, each with the SSH connection options
as ansible-core's ssh connection plugin resolves them (InventoryManager, VariableManager,
group_vars/host_vars, precedence, templating) and the provisioner_* variables. ansible-core
runs in its own process because importing it changes process-wide state (it wraps
stdout/stderr, registers fork handlers, reads ansible.cfg into global constants).
Nothing here connects anywhere.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

HEAD_GROUPS = ("head", "ray_head", "heads")
WORKER_GROUPS = ("workers", "worker", "ray_workers", "ray_worker")
# ansible's ssh plugin options that decide where and as whom it connects
OPTIONS = (
    "host",
    "remote_user",
    "port",
    "private_key_file",
    "private_key",
    "password",
    "ssh_args",
    "ssh_common_args",
    "ssh_extra_args",
)
# Only file formats: no inventory scripts are run, no dynamic inventory plugins loaded.
ENV = {
    "ANSIBLE_INVENTORY_ENABLED": "yaml,ini,toml",
    "ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED": "True",
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
    "ANSIBLE_NOCOLOR": "1",
    "ANSIBLE_FORCE_COLOR": "0",
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
}


def _plain(value: Any) -> Any:
    """ansible's tagged values as plain JSON types."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return str(value)


def _origin(value: Any) -> str | None:
    from ansible._internal._datatag._tags import Origin

    tag = value if isinstance(value, Origin) else Origin.get_tag(value)
    if tag is None or not tag.path:
        return None
    return f"{tag.path}:{tag.line_num}" if tag.line_num else str(tag.path)


def _ini_error_line(path: str, loader: Any) -> int | None:
    """The line an INI inventory fails on (ansible-core 2.19 drops it from the error)."""
    from ansible._internal._datatag._tags import Origin
    from ansible.inventory.data import InventoryData
    from ansible.plugins.inventory import BaseInventoryPlugin
    from ansible.plugins.loader import inventory_loader

    plugin = inventory_loader.get("ini")
    BaseInventoryPlugin.parse(plugin, InventoryData(), loader, path)
    plugin._origin = Origin(path=path, line_num=0)
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    try:
        plugin._parse(text.splitlines())
    except Exception:
        return int(plugin._origin.line_num or 0) or None
    return None


def _parse_error(path: str, loader: Any) -> dict[str, Any]:
    """Why no plugin could read `path`, with the line where ansible-core can tell it."""
    from ansible.errors import AnsibleError
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    failures: list[dict[str, Any]] = []
    for name in ("yaml", "toml", "ini"):
        plugin = inventory_loader.get(name)
        try:
            if not plugin.verify_file(path):
                continue
            plugin.parse(InventoryData(), loader, path, cache=False)
        except AnsibleError as exc:
            failures.append(_describe(exc, path, name, loader))
        except Exception as exc:  # a plugin's own bug: still a parse failure of this file
            failures.append({"message": f"{type(exc).__name__}: {exc}", "where": path})
    suffix = Path(path).suffix.lower()
    preferred = (
        "yaml" if suffix in (".yml", ".yaml", ".json") else "toml" if suffix == ".toml" else "ini"
    )
    chosen = next((f for f in failures if f.get("plugin") == preferred), None)
    return chosen or (failures[-1] if failures else {"message": "not an inventory", "where": path})


def _describe(exc: BaseException, path: str, plugin: str, loader: Any) -> dict[str, Any]:
    messages: list[str] = []
    where: str | None = None
    current: BaseException | None = exc
    while current is not None:
        text = str(getattr(current, "message", "") or current).split("\n")[0].strip()
        if text and text not in messages and not text.startswith("Failed to parse inventory"):
            messages.append(text)
        obj = getattr(current, "obj", None)
        found = _origin(obj) if obj is not None else None
        if found and (where is None or (found.count(":") > where.count(":"))):
            where = found
        current = current.__cause__ or current.__context__
    if plugin == "ini" and (where is None or where == path):
        line = _ini_error_line(path, loader)
        where = f"{path}:{line}" if line else path
    return {"message": "; ".join(messages) or str(exc), "where": where or path, "plugin": plugin}


def _host_entry(host: Any, variables: dict[str, Any], loader: Any) -> dict[str, Any]:
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.playbook.play_context import PlayContext
    from ansible.plugins.loader import connection_loader
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=variables)
    entry: dict[str, Any] = {"name": str(host.name), "options": {}, "where": {}, "vars": {}}
    try:
        connection = templar.template(variables.get("ansible_connection", C.DEFAULT_TRANSPORT))
        entry["connection"] = str(connection)
        plugin = connection_loader.get("ssh", PlayContext(), "/dev/null")
        plugin.set_options(var_options=plugin._resolve_option_variables(variables, templar))
        for option in OPTIONS:
            entry["options"][option] = _plain(plugin.get_option(option))
        for name in C.config.get_plugin_vars("connection", "ssh"):
            if name in variables:
                entry["where"][name] = _origin(variables[name])
        for name, value in variables.items():
            if str(name).startswith("provisioner_"):
                entry["vars"][str(name)] = _plain(templar.template(value))
                entry["where"][str(name)] = _origin(value)
    except AnsibleError as exc:
        described = _describe(exc, "", "", loader)
        entry["error"] = {"message": described["message"], "where": described["where"] or None}
    return entry


def read(path: str) -> dict[str, Any]:
    """One inventory as ansible-core reads it (JSON-ready)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    # group_vars/ and host_vars/ next to the inventory, never the current directory's
    loader.set_basedir(str(Path(path).parent))
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            inventory = InventoryManager(loader=loader, sources=[path])
            variables = VariableManager(loader=loader, inventory=inventory)
            groups = {
                role: [
                    str(h.name)
                    for name in names
                    if name in inventory.groups
                    for h in inventory.groups[name].get_hosts()
                ]
                for role, names in (("head", HEAD_GROUPS), ("workers", WORKER_GROUPS))
            }
            wanted = dict.fromkeys([*groups["head"], *groups["workers"]])
            hosts = [
                _host_entry(h, variables.get_vars(host=h, include_hostvars=False), loader)
                for h in (inventory.get_host(n) for n in wanted)
            ]
    except AnsibleError:
        failed = True
    else:
        failed = False
    if failed:
        with contextlib.redirect_stderr(io.StringIO()):
            return {"path": path, "error": _parse_error(path, loader)}
    said = [
        line.strip() for line in warnings.getvalue().splitlines() if line.startswith("[WARNING]")
    ]
    return {"path": path, "groups": groups, "hosts": hosts, "warnings": said}


def main(argv: list[str]) -> int:
    for key, value in ENV.items():
        os.environ[key] = value
    with contextlib.redirect_stdout(sys.stderr):  # ansible's own output never mixes with ours
        documents = [read(str(Path(p).absolute())) for p in argv]
    json.dump(documents, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
