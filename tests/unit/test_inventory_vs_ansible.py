"""Differential: every host of `head` and `workers`, as provisioner reads it, against what
ansible-core itself would connect to.

The reference comes from ansible-core at test time (tests/unit/ansible_oracle.py: the ssh
command line its ssh plugin builds for the host) passed to OpenSSH's `ssh -G`; provisioner's
answer comes from its own reader (ansible_core.py + resolve.py). They must agree on
address, user, port, key and jump, or provisioner must refuse with a clear error naming
file and line. The corpus follows the syntax shown in Ansible's inventory documentation
(INI, YAML, TOML, ranges, host:port, group_vars/host_vars, children, legacy names,
ansible_ssh_common_args proxies). Nothing connects.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from provisioner.errors import InventoryError
from provisioner.inventory.ansible import read_with_ansible_core, to_raw
from provisioner.inventory.models import Inventory
from provisioner.inventory.resolve import build
from provisioner.inventory.sshconfig import parse_ssh_g
from tests.unit.test_ssh_config_vs_openssh import connection_pair, ssh_loads

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Case:
    name: str
    files: dict[str, str]  # path -> content; {d} is the case's directory
    inventory: str = "hosts"
    refuse: str | None = None  # a clear error provisioner gives (ansible-core may accept)
    error: bool = False  # ansible-core itself refuses the file
    ssh_config: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


KEY = "{d}/keys/id_ops"
C: list[Case] = [
    Case(
        "docs-basic-ini",
        {
            "hosts": "mail.example.com\n\n[head]\nfoo.example.com\n\n[workers]\none.example.com\ntwo.example.com\nthree.example.com\n"
        },
    ),
    Case(
        "docs-basic-yaml",
        {
            "hosts.yml": "all:\n  hosts:\n    mail.example.com:\n  children:\n    head:\n      hosts:\n        foo.example.com:\n    workers:\n      hosts:\n        one.example.com:\n        two.example.com:\n"
        },
        "hosts.yml",
    ),
    Case(
        "yaml-without-all",
        {
            "inv.yaml": "head:\n  hosts:\n    h1.example.com:\nworkers:\n  hosts:\n    w1.example.com:\n    w2.example.com:\n      ansible_port: 2202\n"
        },
        "inv.yaml",
    ),
    Case(
        "range-numeric", {"hosts": "[head]\nhead.example.com\n[workers]\nwww[01:03].example.com\n"}
    ),
    Case(
        "range-step",
        {
            "hosts": "[head]\nhead.example.com\n[workers]\nwww[01:06:2].example.com ansible_user=ops\n"
        },
    ),
    Case("range-alpha", {"hosts": "[head]\nhead.example.com\n[workers]\ndb-[a:c].example.com\n"}),
    Case(
        "host-colon-port",
        {"hosts": "[head]\nbadwolf.example.com:5309\n[workers]\n192.0.2.7:2222\nw2.example.com\n"},
    ),
    Case(
        "alias-ansible-host",
        {
            "hosts": "[head]\njumper ansible_port=5555 ansible_host=192.0.2.50\n[workers]\nw1 ansible_host=192.0.2.51\n"
        },
    ),
    Case(
        "ipv6-bare",
        {"hosts": "[head]\n2001:db8::10\n[workers]\n2001:db8::11\nfe80::1 ansible_port=2222\n"},
    ),
    Case(
        "ipv6-ansible-host",
        {
            "hosts": "[head]\nh ansible_host=2001:db8::20\n[workers]\nw ansible_host='2001:db8::21' ansible_user=ops\n"
        },
    ),
    Case(
        "section-comment",
        {"hosts": "[head]   # the head\nh1.example.com\n[workers]# workers\nw1.example.com\n"},
    ),
    Case(
        "section-semicolon-comment",
        {"hosts": "[head]\nh1.example.com\n[workers] ; workers\nw1.example.com\n"},
        error=True,
    ),
    Case(
        "value-comments",
        {
            "hosts": "[head]\nh1 ansible_host=10.0.0.1 # rack 1\n[workers]\nw1 ansible_host=10.0.0.2 ansible_user=ops  # rack 2\n"
        },
    ),
    Case(
        "apostrophes-elsewhere",
        {
            "hosts": '[head]\nh1 ansible_host=10.0.0.1 motd="it\'s fine"\n[workers]\nw1 ansible_host=10.0.0.2\n[workers:vars]\nowner="O\'Brien"\nansible_user=ops\n'
        },
    ),
    Case(
        "hosts-file-starts-ungrouped",
        {
            "hosts": "gateway.example.com ansible_user=gw\n[head]\nh1.example.com\n[workers]\nw1.example.com\n"
        },
    ),
    Case(
        "group-vars-inline",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\nw2\n[workers:vars]\nansible_user=ops\nansible_port=2222\n"
        },
    ),
    Case(
        "all-vars",
        {
            "hosts": "[all:vars]\nansible_user=admin\nansible_port=2200\n[head]\nh1\n[workers]\nw1 ansible_port=22\n"
        },
    ),
    Case(
        "children-groups",
        {
            "hosts": "[head]\nh1\n[workers:children]\ngpu\ncpu\n[gpu]\ng1\ng2\n[cpu]\nc1\n[gpu:vars]\nansible_user=gpuuser\n[workers:vars]\nansible_user=worker\n"
        },
    ),
    Case(
        "sibling-group-vars",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\nw2\n[rack_a]\nw1\n[rack_a:vars]\nansible_port=2201\nansible_user=racka\n"
        },
    ),
    Case(
        "group-vars-file",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\n",
            "group_vars/workers.yml": "ansible_user: fromfile\nansible_port: 2022\n",
        },
    ),
    Case(
        "group-vars-dir",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\n",
            "group_vars/workers/ssh.yml": "ansible_user: dirfile\n",
            "group_vars/workers/port.yaml": "ansible_port: 2023\n",
        },
    ),
    Case(
        "host-vars-file",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\nw2\n",
            "host_vars/w2.yml": "ansible_host: 192.0.2.99\nansible_user: w2user\n",
        },
    ),
    Case(
        "group-vars-all-file",
        {
            "hosts": "[head]\nh1\n[workers]\nw1 ansible_user=own\n",
            "group_vars/all.yml": "ansible_user: everyone\nansible_port: 2024\n",
        },
    ),
    Case(
        "legacy-names",
        {
            "hosts": "[head]\nh1 ansible_ssh_host=10.1.0.1 ansible_ssh_user=old ansible_ssh_port=2100\n[workers]\nw1 ansible_ssh_host=10.1.0.2\n"
        },
    ),
    Case(
        "legacy-and-new",
        {
            "hosts": "[head]\nh1 ansible_host=10.1.0.1 ansible_ssh_host=10.1.0.9 ansible_user=new ansible_ssh_user=old\n[workers]\nw1 ansible_port=2201 ansible_ssh_port=2202\n"
        },
    ),
    Case(
        "key-names",
        {
            "hosts": f"[head]\nh1 ansible_ssh_private_key_file={KEY}\n[workers]\nw1 ansible_private_key_file={KEY}\n",
            "keys/id_ops": "k\n",
        },
    ),
    Case(
        "key-relative-to-cwd",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\n[all:vars]\nansible_ssh_private_key_file=tests/unit/golden/not-a-key\n"
        },
        refuse="does not exist",
    ),
    Case(
        "child-overrides-parent",
        {
            "hosts": "[head]\nh1\n[workers:children]\ngpu\n[gpu]\ng1\n[workers:vars]\nansible_user=parent\n[gpu:vars]\nansible_user=child\n"
        },
    ),
    Case(
        "group-priority",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\n[zeta]\nw1\n[alpha]\nw1\n[alpha:vars]\nansible_user=alpha\nansible_group_priority=10\n[zeta:vars]\nansible_user=zeta\n"
        },
    ),
    Case(
        "common-args-proxyjump",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\n[workers:vars]\nansible_ssh_common_args='-o ProxyJump=ops@bastion.example.com:2222'\n"
        },
    ),
    Case(
        "common-args-proxycommand",
        {
            "hosts": "[head]\nh1\n[workers]\nw1 ansible_host=10.9.0.2\n[workers:vars]\nansible_ssh_common_args='-o ProxyCommand=\"ssh -W %h:%p -q user@gateway.example.com\"'\n"
        },
    ),
    Case(
        "extra-args-J",
        {
            "hosts": "[head]\nh1\n[workers]\nw1 ansible_ssh_extra_args='-J gw@bastion.example.com:2200'\n"
        },
    ),
    Case(
        "proxyjump-chain",
        {
            "hosts": "[head]\nh1\n[workers]\nw1 ansible_ssh_common_args='-J a.example.com,ops@b.example.com:2201'\n"
        },
    ),
    Case(
        "ssh-config-alias",
        {"hosts": "[head]\ngpu-head\n[workers]\ngpu-1\ngpu-2 ansible_user=explicit\n"},
        ssh_config="Host gpu-*\n  User cfg\n  Port 2300\nHost gpu-head\n  HostName 10.7.0.1\nHost gpu-1\n  HostName 10.7.0.2\n",
    ),
    Case(
        "ssh-config-proxyjump",
        {"hosts": "[head]\nbastion\n[workers]\ninner ansible_host=10.8.0.5\n"},
        ssh_config="Host bastion\n  HostName 192.0.2.1\n  User jumper\nHost 10.8.0.*\n  ProxyJump bastion\n  User inner\n",
    ),
    Case(
        "ansible-port-beats-config",
        {"hosts": "[head]\nh1 ansible_port=2400\n[workers]\nw1\n"},
        ssh_config="Host *\n  Port 2500\n  User cfg\n",
    ),
    Case(
        "yaml-nested-children",
        {
            "inv.yml": "all:\n  vars:\n    ansible_user: top\n  children:\n    head:\n      hosts:\n        h1:\n          ansible_host: 10.3.0.1\n    workers:\n      children:\n        east:\n          vars:\n            ansible_user: east\n          hosts:\n            e1:\n              ansible_host: 10.3.0.2\n        west:\n          hosts:\n            w1:\n              ansible_port: 2205\n"
        },
        "inv.yml",
    ),
    Case(
        "yaml-host-port",
        {
            "inv.yml": "all:\n  children:\n    head:\n      hosts:\n        h1.example.com:2201:\n    workers:\n      hosts:\n        w1.example.com:\n          ansible_port: 2202\n"
        },
        "inv.yml",
    ),
    Case(
        "yaml-range",
        {
            "inv.yml": "head:\n  hosts:\n    h1:\nworkers:\n  hosts:\n    www[01:02].example.com:\n      ansible_user: ranged\n"
        },
        "inv.yml",
    ),
    Case(
        "toml-docs",
        {
            "inv.toml": '[head.hosts]\nh1 = { ansible_host = "10.4.0.1" }\n\n[workers.hosts]\nw1 = { ansible_host = "10.4.0.2", ansible_port = 2206 }\n\n[workers.vars]\nansible_user = "tom"\n'
        },
        "inv.toml",
    ),
    Case(
        "jinja-host",
        {
            "hosts": "[head]\nh1\n[workers]\nw1\nw2\n[workers:vars]\nansible_host=\"{{ inventory_hostname }}.lab.example\"\nansible_user=\"{{ 'o' ~ 'ps' }}\"\n"
        },
    ),
    Case(
        "jinja-undefined",
        {"hosts": '[head]\nh1\n[workers]\nw1 ansible_host="{{ no_such_var }}"\n'},
        error=True,
    ),
    Case(
        "children-cycle",
        {"hosts": "[head]\nh1\n[workers:children]\nloop\n[loop:children]\nworkers\n"},
        error=True,
    ),
    Case("bad-section", {"hosts": "[head]\nh1\n[workers:foo]\nw1\n"}, error=True),
    Case("bad-host-var", {"hosts": "[head]\nh1\n[workers]\nw1 ansible_port\n"}, error=True),
    Case(
        "yaml-sequence-key",
        {"inv.yml": "all:\n  children:\n    head:\n      hosts:\n        ? [a, b]\n        : {}\n"},
        "inv.yml",
        error=True,
    ),
    Case(
        "connection-local",
        {"hosts": "[head]\nlocalhost ansible_connection=local\n[workers]\nw1\n"},
        refuse="ansible_connection",
    ),
    Case(
        "password",
        {"hosts": "[head]\nh1 ansible_password=secret\n[workers]\nw1\n"},
        refuse="ansible_password",
    ),
    Case(
        "forwarding-arg",
        {"hosts": "[head]\nh1\n[workers]\nw1 ansible_ssh_common_args='-L 8080:localhost:80'\n"},
        refuse="cannot be honoured",
    ),
    Case("two-heads", {"hosts": "[head]\nh1\nh2\n[workers]\nw1\n"}, refuse="exactly one host"),
    Case(
        "yaml-typo-key",
        {"inv.yml": "head:\n  hosts:\n    h1:\nworkers:\n  hostz:\n    w1:\n"},
        "inv.yml",
        refuse="warned",
    ),
    Case(
        "ssh-args-user",
        {"hosts": "[head]\nh1 ansible_ssh_args='-o User=fromargs -o Port=2600'\n[workers]\nw1\n"},
    ),
]
CASES = {c.name: c for c in C}


def _write(case: Case, base: Path) -> Path:
    d = base / case.name
    for rel, text in case.files.items():
        path = d / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{d}", str(d)))
        if rel.startswith("keys/"):
            path.chmod(0o600)
    (d / "ssh_config").write_text(case.ssh_config)
    return d / case.inventory


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both answers for every case: ansible-core's ssh command lines, and provisioner's read
    (ansible-core children run once each for the whole corpus)."""
    base = tmp_path_factory.mktemp("corpus")
    paths = {c.name: _write(c, base) for c in C}
    oracle = subprocess.run(
        [sys.executable, "-m", "tests.unit.ansible_oracle", *map(str, paths.values())],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    reference = dict(zip(paths, json.loads(oracle.stdout), strict=True))
    ours = dict(zip(paths, read_with_ansible_core(list(paths.values())), strict=True))
    return {"paths": paths, "reference": reference, "ours": ours}


def _ssh_g(argv: list[str], config: Path) -> dict[str, list[str]]:
    done = subprocess.run(
        ["ssh", "-G", "-F", str(config), *argv],
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return parse_ssh_g(done.stdout)


def _ours(answers: dict[str, Any], name: str) -> Inventory:
    path = answers["paths"][name]
    return build(to_raw(path, answers["ours"][name]), path.parent / "ssh_config", openssh=True)


def test_the_corpus_is_large_enough() -> None:
    agreeing = [c for c in C if not c.refuse and not c.error]
    assert len(C) >= 40 and len(agreeing) >= 35


@pytest.mark.parametrize("name", [c.name for c in C if not c.refuse and not c.error])
def test_agrees_with_ansible_core(answers: dict[str, Any], name: str) -> None:
    reference = answers["reference"][name]
    assert "error" not in reference, reference
    inventory = _ours(answers, name)
    config = answers["paths"][name].parent / "ssh_config"
    expected_roles = {"head": list(reference["head"]), "workers": list(reference["workers"])}
    assert [inventory.head.name] == expected_roles["head"]
    assert [w.name for w in inventory.workers] == expected_roles["workers"]
    for node in inventory.nodes:
        argv = reference["head" if node.is_head else "workers"][node.name]
        want = _ssh_g(argv, config)
        got, expected = connection_pair(node, want, ssh_loads(config, argv))
        assert got == expected, f"{name} {node.name}: ansible+ssh -G {expected}, ours {got}"
        assert (node.ssh.proxy_command is None) == ("proxycommand" not in want)


@pytest.mark.parametrize("name", [c.name for c in C if c.refuse or c.error])
def test_refused_clearly_with_file_and_line(answers: dict[str, Any], name: str) -> None:
    case = CASES[name]
    reference = answers["reference"][name]
    if case.error:
        assert "error" in reference, f"ansible-core accepted {name}: {reference}"
    with pytest.raises(InventoryError) as caught:
        _ours(answers, name)
    error = caught.value
    assert error.exit_code == 2 and error.fix
    assert error.where and re.search(r":\d+$", error.where), error.where
    assert str(answers["paths"][name].parent) in error.where
    if case.refuse:
        assert case.refuse in str(error), str(error)


def test_load_inventory_reads_an_ini_file_named_hosts(tmp_path: Path) -> None:
    """The whole path (format detection included): a file named `hosts` starting with an
    ungrouped host is an Ansible inventory."""
    from provisioner.inventory import load_inventory

    path = tmp_path / "hosts"
    path.write_text(CASES["hosts-file-starts-ungrouped"].files["hosts"])
    inventory = load_inventory(path)
    assert inventory.head.name == "h1.example.com"
    assert [w.name for w in inventory.workers] == ["w1.example.com"]


def test_missing_ansible_core_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import provisioner.inventory.ansible as reader

    monkeypatch.setattr(reader, "ansible_core_installed", lambda: False)
    with pytest.raises(InventoryError) as caught:
        reader.read_with_ansible_core([tmp_path / "hosts"])
    assert "pip install 'provisioner[ansible]'" in (caught.value.fix or "")
    assert os.environ.get("ANSIBLE_INVENTORY_ENABLED") is None  # the parent's env untouched
