"""Lab flavours: parsing `--flavours`, one flavour per node, and the images' recipe hashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.image.base_image import base_tag
from provisioner.lab import images
from provisioner.lab.config import LabConfig
from provisioner.lab.flavours import FLAVOURS, parse_flavours, per_node, suites
from tests.cli import cli


def test_flavours_parse_as_given_and_spread_one_per_node() -> None:
    assert parse_flavours("bookworm") == ("bookworm",)
    assert parse_flavours(" bookworm, trixie ,trixie+containerd") == (
        "bookworm",
        "trixie",
        "trixie+containerd",
    )
    assert per_node(("trixie",), 3) == ("trixie",) * 3
    mixed = ("bookworm", "trixie", "trixie+containerd")
    assert per_node(mixed, 3) == mixed
    assert suites(mixed) == ("bookworm", "trixie")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("sid", "unknown lab flavour 'sid'"),
        ("bookworm,,trixie", "empty entry"),
        ("", "empty entry"),
        ("Bookworm", "unknown lab flavour"),
    ],
)
def test_bad_flavours_are_input_errors_naming_the_choices(text: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as err:
        parse_flavours(text)
    assert all(name in (err.value.fix or "") for name in FLAVOURS)


def test_a_list_that_is_neither_one_nor_one_per_node_is_refused() -> None:
    with pytest.raises(InputError, match="2 flavours for 3 nodes"):
        per_node(("bookworm", "trixie"), 3)
    with pytest.raises(InputError, match="2 flavours for 3 nodes"):
        LabConfig(name="t", subnet="10.250.7.0/24", nodes=3, flavours=("bookworm", "trixie"))


def test_each_node_gets_its_flavour_head_first() -> None:
    cfg = LabConfig(
        name="t", subnet="10.250.7.0/24", nodes=3, flavours=("bookworm", "trixie", "trixie")
    )
    assert [(n.role, n.flavour) for n in cfg.lab_nodes()] == [
        ("head", "bookworm"),
        ("worker", "trixie"),
        ("worker", "trixie"),
    ]
    assert cfg.lab_nodes()[1].to_json()["flavour"] == "trixie"
    default = LabConfig(name="t", subnet="10.250.7.0/24", nodes=2)
    assert {n.flavour for n in default.lab_nodes()} == {"bookworm"}


def test_podman_nodes_are_of_either_release_and_have_no_docker_image_store() -> None:
    kwargs = {"name": "t", "subnet": "10.250.7.0/24", "runtime": "podman", "nodes": 3}
    with pytest.raises(InputError, match="no trixie\\+containerd image store"):
        LabConfig.from_env(flavours=("trixie+containerd",), **kwargs)  # type: ignore[arg-type]
    mixed = ("bookworm", "trixie", "bookworm")
    ok = LabConfig.from_env(flavours=mixed, **kwargs)  # type: ignore[arg-type]
    assert tuple(n.flavour for n in ok.lab_nodes()) == mixed


def test_host_mode_nodes_take_flavours_one_per_node() -> None:
    flavours = ("bookworm", "bookworm", "trixie")
    cfg = LabConfig.from_env(name="t", subnet="10.250.7.0/24", runtime="host", flavours=flavours)
    assert tuple(n.flavour for n in cfg.lab_nodes()) == flavours
    assert [FLAVOURS[f].python for f in flavours] == ["3.11", "3.11", "3.13"]


def test_a_slurm_lab_is_of_one_release() -> None:
    kwargs = {"name": "t", "subnet": "10.250.7.0/24", "nodes": 2, "slurm": True}
    trixie = LabConfig.from_env(flavours=("trixie",), **kwargs)  # type: ignore[arg-type]
    assert {n.flavour for n in trixie.lab_nodes()} == {"trixie"}  # login node too
    with pytest.raises(InputError, match="one Debian release") as caught:
        LabConfig.from_env(flavours=("bookworm", "trixie", "trixie"), **kwargs)  # type: ignore[arg-type]
    assert "--flavours trixie" in caught.value.fix


def test_cli_bad_flavours_exit_2_with_the_fix() -> None:
    for bad, needle in (
        ("bookworm,sid", "unknown lab flavour 'sid'"),
        ("bookworm,trixie", "2 flavours for 3 nodes"),
    ):
        r = cli("lab", "up", "--name", "t", "--subnet", "10.250.7.0/24", "--flavours", bad)
        assert r.exit_code == 2, r.stderr
        assert needle in r.stderr and "trixie+containerd" in r.stderr
        assert "Traceback" not in r.stderr


def test_base_tags_differ_by_release_and_keep_bookworms() -> None:
    assert base_tag().startswith("provisioner-base:bookworm-")
    assert base_tag(suite="bookworm") == base_tag()
    assert base_tag(suite="trixie").startswith("provisioner-base:trixie-")
    assert base_tag(suite="trixie") != base_tag()
    # a registry base stands in for bookworm's only
    assert base_tag("debian:bookworm-slim", "trixie") == base_tag(suite="trixie")


def test_node_tags_hash_their_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = images._recipe_dir()
    copy = tmp_path / "recipe"
    copy.mkdir()
    for f in real.iterdir():
        if f.is_file():  # not __pycache__ (an installed package has one)
            (copy / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(images, "_recipe_dir", lambda: copy)
    node = images.node_tag("provisioner-base:trixie-x")
    release = images.release_node_tag(node, ("docker-cli",))
    containerd = images.containerd_node_tag(release)
    assert len({node, release, containerd}) == 3
    assert images.node_tag("provisioner-base:bookworm-x") != node
    assert images.release_node_tag(node, ("docker-cli", "x")) != release
    (copy / "containerd-daemon.json").write_text(json.dumps({"features": {}}))
    assert images.containerd_node_tag(release) != containerd
    assert images.node_tag("provisioner-base:trixie-x") == node  # untouched by that
    (copy / images.RELEASE_RECIPE).write_text("# changed\n")
    assert images.release_node_tag(node, ("docker-cli",)) != release


def test_the_containerd_flavour_turns_the_store_on() -> None:
    daemon = json.loads((images._recipe_dir() / "containerd-daemon.json").read_text())
    assert daemon == {"features": {"containerd-snapshotter": True}}
    assert [f.name for f in FLAVOURS.values() if f.containerd_store] == ["trixie+containerd"]


def test_lab_up_again_keeps_the_labs_flavours(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from provisioner.cli.lab import _flavours_of

    monkeypatch.setenv("PROVISIONER_STATE_DIR", str(tmp_path))  # not the real labs' folder

    cfg = LabConfig(
        name="kept",
        subnet="10.250.7.0/24",
        nodes=3,
        flavours=("bookworm", "trixie", "trixie+containerd"),
    )
    assert _flavours_of("kept", 3) == ("bookworm",)  # no such lab up: the default
    cfg.state_dir.mkdir(parents=True)
    record = {"name": "kept", "subnet": cfg.subnet, "nodes": 3, "flavours": list(cfg.flavours)}
    (cfg.state_dir / "lab.json").write_text(json.dumps(record))
    assert _flavours_of("kept", 3) == cfg.flavours
    r = cli("lab", "up", "--name", "kept", "--subnet", cfg.subnet, "--nodes", "4")
    assert r.exit_code == 2 and "one flavour per node" in r.stderr, r.stderr
    assert "--flavours" in r.stderr and "Traceback" not in r.stderr
