"""The reference answer: the ssh command line ansible-core itself builds for each host.

`python -m tests.unit.ansible_oracle INVENTORY...` prints, per inventory, the argv that
ansible-core's ssh connection plugin would run for every host of `head` and `workers`
(the way its TaskExecutor sets the plugin's options, then the plugin's own
`_build_command`), or the error ansible-core raises. The test then asks `ssh -G` what that
command line connects to. Nothing connects. Runs in a child process: ansible-core reads
its configuration once per process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

GROUPS = {
    "head": ("head", "ray_head", "heads"),
    "workers": ("workers", "worker", "ray_workers", "ray_worker"),
}


def _argv(host: Any, variables: dict[str, Any], loader: Any) -> list[str]:
    from ansible import constants as C
    from ansible.playbook.play_context import PlayContext
    from ansible.plugins.loader import connection_loader
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=variables)
    connection = templar.template(variables.get("ansible_connection", C.DEFAULT_TRANSPORT))
    if connection not in ("ssh", "smart"):
        return [f"connection={connection}"]
    plugin = connection_loader.get("ssh", PlayContext(), "/dev/null")
    plugin.set_options(
        task_keys={}, var_options=plugin._resolve_option_variables(variables, templar)
    )
    argv = [a.decode() for a in plugin._build_command("ssh", "ssh")]
    return [*argv[1:], "--", str(plugin.get_option("host"))]


def read(path: str) -> dict[str, Any]:
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    loader.set_basedir(str(Path(path).parent))
    try:
        inventory = InventoryManager(loader=loader, sources=[path])
        manager = VariableManager(loader=loader, inventory=inventory)
        answer: dict[str, Any] = {}
        for role, names in GROUPS.items():
            hosts = [
                h for n in names if n in inventory.groups for h in inventory.groups[n].get_hosts()
            ]
            answer[role] = {
                h.name: _argv(h, manager.get_vars(host=h, include_hostvars=False), loader)
                for h in hosts
            }
        return answer
    except AnsibleError as exc:
        return {"error": str(exc).splitlines()[0]}


def main(paths: list[str]) -> None:
    os.environ["ANSIBLE_INVENTORY_ENABLED"] = "yaml,ini,toml"
    os.environ["ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED"] = "True"
    out = sys.stdout
    sys.stdout = sys.stderr
    answers = [read(p) for p in paths]
    json.dump(answers, out)


if __name__ == "__main__":
    main(sys.argv[1:])
