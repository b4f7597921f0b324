"""Inventory formats and validation: every mistake is an InventoryError naming file, line, field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from provisioner.errors import InventoryError
from provisioner.inventory import RayPorts, load_inventory


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    path.write_text("not checked here\n")
    os.chmod(path, 0o600)
    return path


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


NATIVE = """\
cluster: lab
ssh:
  user: lab
  key: id_ed25519
  known_hosts: known_hosts
head:
  name: head-0
  address: 10.0.0.10
workers:
  - name: w-1
    address: 10.0.0.11
    port: 2222
    resources: {GPU: 2}
    labels: {zone: a}
  - 10.0.0.12
ray:
  ports: {gcs: 7000}
  shm_size: 2GiB
"""


def test_native(tmp_path: Path, key: Path) -> None:
    inv = load_inventory(write(tmp_path, "inv.yaml", NATIVE))
    assert [n.name for n in inv.nodes] == ["head-0", "w-1", "10.0.0.12"]
    assert inv.head.ssh.key == key and inv.head.ssh.known_hosts == (tmp_path / "known_hosts",)
    w1 = inv.node("w-1")
    assert w1.ssh.port == 2222 and w1.resources == {"GPU": 2.0} and w1.labels == {"zone": "a"}
    assert inv.ports.gcs == 7000 and inv.ports.dashboard == 8265 and inv.shm_size == 2 * 2**30
    assert inv.state_dir.parts[-2:] == ("clusters", "lab")


def error_of(tmp_path: Path, text: str, name: str = "inv.yaml") -> InventoryError:
    with pytest.raises(InventoryError) as caught:
        load_inventory(write(tmp_path, name, text))
    assert caught.value.exit_code == 2
    return caught.value


def test_typo_suggests_closest_key_with_line(tmp_path: Path, key: Path) -> None:
    err = error_of(tmp_path, NATIVE.replace("known_hosts:", "known_host:"))
    assert str(err).startswith(f"{tmp_path / 'inv.yaml'}:5: ssh.known_host")
    assert err.fix == "did you mean 'ssh.known_hosts'?"


def test_bad_policy(tmp_path: Path, key: Path) -> None:
    err = error_of(tmp_path, NATIVE.replace("  user: lab", "  user: lab\n  host_key_policy: yolo"))
    assert ":4: ssh.host_key_policy" in str(err) and "strict or accept-new" in str(err)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("address: 10.0.0.10", "address: '-oProxyCommand=x'", "head.address"),
        ("address: 10.0.0.10", "address: 'a;rm -rf /'", "head.address"),
        ("user: lab", "user: 'lab$(id)'", "ssh.user"),
        ("name: head-0", 'name: "a\\nb"', "head.name"),
        ("cluster: lab", "cluster: Lab_1", "cluster"),
        ("{gcs: 7000}", "{gcs: 70000}", "ray.ports.gcs"),
    ],
)
def test_hostile_or_bad_values(tmp_path: Path, key: Path, old: str, new: str, field: str) -> None:
    err = error_of(tmp_path, NATIVE.replace(old, new))
    assert f": {field}:" in str(err)


def test_duplicate_and_head_as_worker(tmp_path: Path, key: Path) -> None:
    err = error_of(tmp_path, NATIVE.replace("  - 10.0.0.12", "  - 10.0.0.10"))
    assert "head (head-0" in str(err) and "also listed as a worker" in str(err)
    err = error_of(tmp_path, NATIVE.replace("  - 10.0.0.12", "  - {name: w-1, address: 10.0.0.13}"))
    assert "duplicate node name" in str(err)


def test_key_problems(tmp_path: Path, key: Path) -> None:
    os.chmod(key, 0o644)
    err = error_of(tmp_path, NATIVE)
    assert "0644" in str(err) and err.fix == f"chmod 600 {key}"
    key.unlink()
    assert "does not exist" in str(error_of(tmp_path, NATIVE))


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    err = error_of(tmp_path, "cluster: x\nhead: [\n")
    assert "not valid YAML" in str(err) and ":3" in str(err)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="does not exist"):
        load_inventory(tmp_path / "nope.yaml")


INI = """\
[all:vars]
ansible_user=ubuntu
provisioner_cluster=rack

[head]
gpu0 ansible_host=10.1.0.1

[workers]
gpu1 ansible_host=10.1.0.2 ansible_port=2200
gpu2 ansible_host=10.1.0.3

[workers:vars]
ansible_ssh_private_key_file=KEY
"""


def test_ansible_ini(tmp_path: Path, key: Path) -> None:
    """As Ansible hands the key to ssh: ~ expanded, relative paths from the current directory."""
    inv = load_inventory(write(tmp_path, "hosts.ini", INI.replace("KEY", str(key))))
    assert (
        inv.cluster == "rack" and inv.head.address == "10.1.0.1" and inv.head.ssh.user == "ubuntu"
    )
    assert inv.head.ssh.key is None and inv.node("gpu1").ssh.key == key
    assert inv.node("gpu1").ssh.port == 2200 and inv.node("gpu2").address == "10.1.0.3"


def test_ansible_ini_typo(tmp_path: Path) -> None:
    err = error_of(tmp_path, INI.replace("provisioner_cluster", "provisioner_clustr"), "hosts.ini")
    assert err.fix == "did you mean 'provisioner_cluster'?"


ANSIBLE_YAML = """\
all:
  vars:
    ansible_user: ops
  children:
    head:
      hosts:
        n0: {ansible_host: 10.2.0.1}
    workers:
      vars: {ansible_port: 2022}
      hosts:
        n1: {ansible_host: 10.2.0.2, provisioner_resources: {GPU: 1}}
"""


def test_ansible_yaml(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, "hosts.yaml", ANSIBLE_YAML))
    assert inv.head.name == "n0" and inv.head.ssh.port == 22
    assert inv.node("n1").ssh.port == 2022 and inv.node("n1").ssh.user == "ops"
    assert inv.node("n1").resources == {"GPU": 1.0}


def test_ssh_config_fills_gaps(tmp_path: Path, key: Path) -> None:
    config = write(
        tmp_path,
        "ssh_config",
        f"Host gpu-a\n  HostName 10.3.0.1\n  User alice\n  Port 2201\n  IdentityFile {key}\n"
        "  ProxyJump bastion@10.3.0.254:22\n",
    )
    inv_path = write(tmp_path, "inv.yaml", "cluster: c\nhead: gpu-a\n")
    inv = load_inventory(inv_path, ssh_config=config)
    head = inv.head
    assert (head.name, head.address, head.ssh.user, head.ssh.port) == (
        "gpu-a",
        "10.3.0.1",
        "alice",
        2201,
    )
    assert head.ssh.key == key and head.ssh.jump == "bastion@[10.3.0.254]:22"  # as ssh -G says
    assert [(h.address, h.user, h.port) for h in head.ssh.hops] == [("10.3.0.254", "bastion", 22)]


@pytest.mark.parametrize("name", ["onprem.yaml", "ansible.ini", "ansible.yaml"])
def test_examples_load(name: str, hidden_home: Path) -> None:
    key = hidden_home / ".ssh" / "id_ed25519"
    key.parent.mkdir(exist_ok=True)
    key.write_text("x")
    os.chmod(key, 0o600)
    inv = load_inventory(Path(__file__).parents[2] / "inventories" / name)
    assert inv.cluster == "rl-rack" and inv.head.name == "gpu-head"
    assert inv.node("gpu-2").ssh.port == 2222 and inv.node("gpu-2").ssh.user == "admin"


LABELS = [
    "a",
    "gpu-a100",
    "rack_1.row-2",
    "",
    "a,b=c",
    "zone=b",
    "a b",
    "-lead",
    "trail.",
    "x" * 64,
    "$(touch /tmp/x)",
    "é",
]


@pytest.mark.parametrize("value", LABELS)
def test_labels_accepted_exactly_when_ray_reads_them_as_that_one_label(
    tmp_path: Path, key: Path, value: str
) -> None:
    """Ray's own parser of `ray start --labels=...` is the reference: a label the inventory
    accepts reaches Ray as that one label; a value Ray would split (`,`, `=`) or refuse is
    an inventory error naming the field."""
    from ray._private.label_utils import parse_node_labels_string

    try:
        ray_reads: dict[str, str] | None = parse_node_labels_string(f"zone={value}")
    except ValueError:
        ray_reads = None
    text = NATIVE.replace("labels: {zone: a}", f"labels: {{zone: {value!r}}}")
    if ray_reads == {"zone": value}:
        assert load_inventory(write(tmp_path, "inv.yaml", text)).node("w-1").labels == {
            "zone": value
        }
    else:
        with pytest.raises(InventoryError, match=r"workers\[0\]\.labels\.zone|labels\.zone"):
            load_inventory(write(tmp_path, "inv.yaml", text))


@pytest.mark.parametrize("name", ["zone", "example.com/zone", "ray.io/zone", "a,b", "k=v", ""])
def test_label_names_follow_ray(tmp_path: Path, key: Path, name: str) -> None:
    from ray._private.label_utils import parse_node_labels_string, validate_node_labels

    try:
        ray_reads: dict[str, str] | None = parse_node_labels_string(f"{name}=a")
        validate_node_labels(ray_reads)
    except ValueError:
        ray_reads = None
    text = NATIVE.replace("labels: {zone: a}", f"labels: {{{name!r}: a}}")
    if ray_reads == {name: "a"}:
        assert load_inventory(write(tmp_path, "inv.yaml", text)).node("w-1").labels == {name: "a"}
    else:
        with pytest.raises(InventoryError, match="Ray label name"):
            load_inventory(write(tmp_path, "inv.yaml", text))


def test_port_base_draws_every_port_from_its_block(tmp_path: Path, key: Path) -> None:
    inv = load_inventory(
        write(tmp_path, "inv.yaml", NATIVE.replace("  ports:", "  port_base: 21000\n  ports:"))
    )
    p = inv.ports
    # gcs overridden by ray.ports; everything else from the block
    assert (p.gcs, p.dashboard, p.client) == (7000, 21001, 21002)
    assert (p.node_manager, p.object_manager) == (21003, 21004)
    assert (p.dashboard_agent_grpc, p.dashboard_agent_http) == (21005, 21006)
    assert (p.runtime_env_agent, p.metrics_export) == (21007, 21008)
    assert (p.min_worker, p.max_worker) == (21100, 21999)
    assert all(21000 <= port <= 21999 for port in p.all_ports() - {7000})


def test_without_port_base_the_ports_are_rays_usual() -> None:
    assert RayPorts().named() == {
        "gcs": 6379,
        "dashboard": 8265,
        "client": 10001,
        "dashboard_agent_grpc": 8078,
        "dashboard_agent_http": 52365,
        "metrics_export": 8090,
        "node_manager": 8077,
        "object_manager": 8076,
        "runtime_env_agent": 8079,
    }
    assert RayPorts().worker_range == range(10002, 20000)


def test_blocks_side_by_side_share_no_port() -> None:
    a, b = RayPorts.from_base(20000), RayPorts.from_base(21000)
    assert not a.overlaps(b) and not a.overlaps(RayPorts())
    # half a block apart: b's single ports fall into a's worker range
    assert set(range(20500, 20509)) <= RayPorts.from_base(20500).overlaps(a)
    # the usual layout's worker range is 10002-19999: a block there collides with it
    assert 15000 in RayPorts.from_base(15000).overlaps(RayPorts())
    # smaller blocks (e.g. one per SLURM job): the same single ports, workers from a tenth in
    small = RayPorts.from_base(20300, size=100)
    assert (small.gcs, small.metrics_export) == (20300, 20308)
    assert small.worker_range == range(20310, 20400)
    with pytest.raises(ValueError):
        RayPorts.from_base(65500)


@pytest.mark.parametrize("value", ["80", "64537", "-1", "'x'", "20000.5", "true", "[1]"])
def test_bad_port_base(tmp_path: Path, key: Path, value: str) -> None:
    text = NATIVE.replace("  ports: {gcs: 7000}", f"  port_base: {value}")
    err = error_of(tmp_path, text)
    assert f"{tmp_path / 'inv.yaml'}:17: ray.port_base:" in str(err)
    assert "1024-64536" in str(err) and "20000" in (err.fix or "")


def test_ansible_port_base(tmp_path: Path, key: Path) -> None:
    text = INI.replace("KEY", str(key)).replace(
        "provisioner_cluster=rack", "provisioner_cluster=rack\nprovisioner_ray_port_base=22000"
    )
    inv = load_inventory(write(tmp_path, "hosts.ini", text))
    assert inv.ports == RayPorts.from_base(22000)
    err = error_of(tmp_path, text.replace("=22000", "=99"), "hosts.ini")
    assert "provisioner_ray_port_base" in str(err) and "hosts.ini:4" in str(err)


def test_a_price_per_node_hour_is_read_from_either_format_and_checked(
    tmp_path: Path, key: Path
) -> None:
    assert load_inventory(write(tmp_path, "inv.yaml", NATIVE)).price_per_node_hour is None
    priced = "price_per_node_hour: 0.42\n" + NATIVE
    assert load_inventory(write(tmp_path, "p.yaml", priced)).price_per_node_hour == 0.42
    err = error_of(tmp_path, "price_per_node_hour: cheap\n" + NATIVE, "bad.yaml")
    assert "price_per_node_hour" in str(err) and "bad.yaml:1" in str(err)
    ini = INI.replace("KEY", str(key)).replace(
        "provisioner_cluster=rack", "provisioner_cluster=rack\nprovisioner_price_per_node_hour=1.25"
    )
    assert load_inventory(write(tmp_path, "hosts.ini", ini)).price_per_node_hour == 1.25
    err = error_of(tmp_path, ini.replace("=1.25", "=-1"), "hosts.ini")
    assert "provisioner_price_per_node_hour" in str(err)


def test_ray_tls_is_on_by_default_and_turned_off_by_the_inventory(
    tmp_path: Path, key: Path
) -> None:
    assert load_inventory(write(tmp_path, "inv.yaml", NATIVE)).tls is True
    off = NATIVE + "  tls: false\n"
    assert load_inventory(write(tmp_path, "off.yaml", off)).tls is False
    err = error_of(tmp_path, NATIVE + "  tls: 'no'\n", "bad.yaml")
    assert "ray.tls" in str(err) and "true or false" in str(err)
    ini = INI.replace("KEY", str(key)).replace(
        "provisioner_cluster=rack", "provisioner_cluster=rack\nprovisioner_ray_tls=false"
    )
    assert load_inventory(write(tmp_path, "hosts.ini", ini)).tls is False
    assert load_inventory(write(tmp_path, "on.ini", INI.replace("KEY", str(key)))).tls is True


def test_an_ansible_inventory_names_tunes_shared_storage_or_is_refused_with_where(
    tmp_path: Path, key: Path
) -> None:
    ini = INI.replace("KEY", str(key))
    assert load_inventory(write(tmp_path, "on.ini", ini)).storage == "head"
    shared = ini.replace(
        "provisioner_cluster=rack",
        "provisioner_cluster=rack\nprovisioner_storage={'path': '/srv/nfs/ray/'}",
    )
    inventory = load_inventory(write(tmp_path, "hosts.ini", shared))
    assert (inventory.storage, inventory.storage_path) == ("path", "/srv/nfs/ray")
    err = error_of(tmp_path, shared.replace("'path'", "'kind'"), "bad.ini")
    assert err.exit_code == 2 and "provisioner_storage" in str(err), err
    assert "bad.ini:" in str(err) and "{path: DIR}" in (err.fix or ""), (str(err), err.fix)
