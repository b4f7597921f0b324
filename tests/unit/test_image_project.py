"""`image build --project`: the project file, conflicts with the base lock, the project
lock, the Dockerfile's layers and the pin (pure parts), and bad input through the real
CLI: exit 2, what, where and the fix, no pin written, before anything is built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.image.lock import LockedWheel, parse_lock
from provisioner.image.pin import Pin, Versions, pin_from_dict, pin_to_dict
from provisioner.image.project import (
    Project,
    dockerfile,
    format_project_lock,
    inputs_sha256,
    lock_conflicts,
    parse_project,
    parse_project_lock,
    parse_requirements_txt,
    project_pin,
    requirement_conflicts,
)

ROOT = Path(__file__).resolve().parents[2]
PROVISIONER = Path(sys.executable).parent / "provisioner"
BASE = parse_lock((ROOT / "images" / "requirements.lock").read_text(), "requirements.lock")
PYPROJECT = """\
[project]
name = "gridcells"
version = "0.1.0"
dependencies = ["gymnasium", "numpy", "shapely>=2.0"]

[tool.provisioner]
apt = ["libgeos-c1v5"]
"""


def sha(n: int) -> str:
    return f"sha256:{n:064x}"


def base_version(name: str) -> str:
    return next(w.version for w in BASE if w.name == name)


def test_pyproject_names_package_dependencies_and_debian_packages() -> None:
    p = parse_project(Path("/p/gridcells"), PYPROJECT, "tqdm==4.67.1\n# a comment\n")
    assert (p.name, p.version, p.has_package) == ("gridcells", "0.1.0", True)
    assert p.requirements == ("gymnasium", "numpy", "shapely>=2.0", "tqdm==4.67.1")
    assert p.apt == ("libgeos-c1v5",)


def test_a_requirements_file_alone_is_a_project_without_a_package() -> None:
    p = parse_project(Path("/p/deps-only"), None, "shapely\n")
    assert (p.name, p.has_package, p.requirements, p.apt) == ("deps-only", False, ("shapely",), ())


@pytest.mark.parametrize(
    ("pyproject", "requirements", "said"),
    [
        (None, None, "neither pyproject.toml nor requirements.txt"),
        ("[tool.black]\nline-length = 100\n", None, "neither a package"),
        ("[project\n", None, "not TOML"),
        ('[project]\nversion = "1"\n', None, "[project] has no name"),
        ('[project]\nname = "x"\n[tool.provisioner]\napt = ["rm -rf /"]\n', None, "apt must be"),
        ('[project]\nname = "x"\n[tool.provisioner]\npip = []\n', None, "takes one key"),
        (None, "-e ./src\n", "only requirements are read here"),
        (None, "shapely>>2\n", "is not a requirement"),
        ('[project]\nname = "x"\ndependencies = "shapely"\n', None, "must be a list"),
    ],
)
def test_bad_project_files_are_refused_with_where_and_fix(
    pyproject: str | None, requirements: str | None, said: str
) -> None:
    with pytest.raises(InputError) as caught:
        parse_project(Path("/p/x"), pyproject, requirements)
    assert said in caught.value.message
    assert caught.value.where.startswith("/p/x") and caught.value.fix


def test_requirements_txt_comments_and_continuations() -> None:
    assert parse_requirements_txt("a==1  # why\n\n# b\nc>=2\n", "r") == ["a==1", "c>=2"]


def test_a_requirement_the_base_lock_cannot_meet_names_both_versions() -> None:
    ray = base_version("ray")
    p = parse_project(Path("/p/x"), None, "ray==2.5.0\ntorch<2\nnumpy\nshapely\n")
    found = requirement_conflicts(p, BASE)
    assert [(c.name, c.wanted, c.base) for c in found] == [
        ("ray", "==2.5.0", ray),
        ("torch", "<2", base_version("torch")),
    ]
    assert f"wants ray==2.5.0, the base image pins {ray}" in found[0].describe()


def test_requirements_the_base_meets_or_that_do_not_apply_are_no_conflict() -> None:
    ray = base_version("ray")
    text = f"ray[rllib]=={ray}\ngymnasium>=1\nnumpy<1; python_version < '3.8'\nshapely\n"
    assert requirement_conflicts(parse_project(Path("/p/x"), None, text), BASE) == []


def test_a_package_named_like_a_base_package_conflicts() -> None:
    p = parse_project(Path("/p/x"), '[project]\nname = "Ray"\nversion = "9"\n', None)
    assert [c.name for c in requirement_conflicts(p, BASE)] == ["Ray"]


def test_a_project_lock_pinning_a_base_package_at_another_version_conflicts() -> None:
    locked = [LockedWheel("shapely", "2.2.0", "a" * 64), LockedWheel("NumPy", "1.26.0", "b" * 64)]
    assert [(c.name, c.base) for c in lock_conflicts(locked, BASE)] == [
        ("NumPy", base_version("numpy"))
    ]


def test_the_project_lock_round_trips_and_records_its_inputs() -> None:
    p = parse_project(Path("/p/x"), PYPROJECT, None)
    inputs = inputs_sha256(p, BASE)
    locked = [LockedWheel("shapely", "2.2.0", "a" * 64)]
    text = format_project_lock(locked, inputs)
    assert parse_project_lock(text, "lock") == (inputs, locked)
    assert parse_project_lock(format_project_lock([], inputs), "lock") == (inputs, [])
    # another requirement, or another base lock: other inputs (the lock is made again)
    other = parse_project(Path("/p/x"), PYPROJECT.replace("shapely>=2.0", "shapely>=2.1"), None)
    assert inputs_sha256(other, BASE) != inputs
    assert inputs_sha256(p, BASE[1:]) != inputs


def test_the_dockerfile_puts_the_own_wheel_last_one_layer_per_part() -> None:
    text = dockerfile(("libgeos-c1v5",), True, True)
    layer_steps = [
        line
        for line in text.splitlines()
        if line.startswith(("COPY --from", "RUN apt-get")) or line == "FROM system AS deps"
    ]
    assert layer_steps == [
        "RUN apt-get update \\",
        "FROM system AS deps",
        "COPY --from=deps-stage /opt/deps/ /",
        "COPY --from=own-stage /opt/own/ /",
    ]
    assert "--require-hashes" in text and "--no-index" in text
    assert "apt-get" not in dockerfile((), True, True)
    assert "own-stage" not in dockerfile((), True, False)


def base_pin() -> Pin:
    return Pin(
        image_id=sha(1),
        layers=(sha(2), sha(3)),
        base_image="provisioner-base:bookworm",
        base_image_id=sha(4),
        requirements_sha256="c" * 64,
        versions=Versions("3.11.2", "2.60.0", "2.13.0+cpu", "1.2.2"),
        size=100,
        tag="provisioner/ray:local",
    )


def test_the_pin_names_the_base_the_project_its_packages_and_layers() -> None:
    p: Project = parse_project(Path("/p/x"), PYPROJECT, None)
    layers = (sha(2), sha(3), sha(5), sha(6), sha(7))
    pin = project_pin(
        base_pin(),
        sha(9),
        layers,
        (1, 2, 3, 4, 5),
        115,
        "provisioner/ray:project-gridcells",
        p,
        {"shapely": "2.2.0", "gridcells": "0.1.0"},
        "d" * 64,
        True,
    )
    info = pin.extra["project"]
    assert info["layers"] == {"apt": sha(5), "deps": sha(6), "own": sha(7)}
    assert info["base_pin"]["image_id"] == sha(1) and info["base_pin"]["layers"] == 2
    assert (info["name"], info["version"]) == ("gridcells", "0.1.0")
    assert info["packages"] == {"shapely": "2.2.0", "gridcells": "0.1.0"}
    assert pin.versions == base_pin().versions
    assert pin_from_dict(json.loads(json.dumps(pin_to_dict(pin))), "pin") == pin


def test_a_pin_whose_image_lost_the_base_layers_is_refused() -> None:
    p = parse_project(Path("/p/x"), PYPROJECT, None)
    with pytest.raises(Exception, match="base image's layers"):
        project_pin(
            base_pin(),
            sha(9),
            (sha(8), sha(3), sha(5), sha(6), sha(7)),
            None,
            1,
            "t",
            p,
            {},
            "d" * 64,
            True,
        )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(PROVISIONER), *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({}, "no project here"),
        ({"requirements.txt": "ray==2.5.0\n"}, "wants ray==2.5.0, the base image pins"),
        ({"pyproject.toml": "[tool.black]\n"}, "neither a package"),
        (  # refused before the base image is built for it
            {
                "pyproject.toml": '[project]\nname = "x"\nversion = "1"\n',
                "setup.py": "raise SystemExit('this package does not build')\n",
            },
            "the project's package does not build: this package does not build",
        ),
    ],
)
def test_bad_projects_exit_2_before_anything_is_built_and_write_no_pin(
    tmp_path: Path, files: dict[str, str], said: str
) -> None:
    project = tmp_path / "proj"
    project.mkdir()
    for name, text in files.items():
        (project / name).write_text(text)
    images = tmp_path / "images"  # a base lock, and no base pin: nothing may be built
    images.mkdir()
    (images / "requirements.lock").write_text((ROOT / "images/requirements.lock").read_text())
    proc = run_cli("image", "build", "--project", str(project), "--images-dir", str(images))
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "fix:" in proc.stderr.lower()
    assert sorted(p.name for p in project.iterdir()) == sorted(files)  # no pin, no lock
    assert sorted(p.name for p in images.iterdir()) == ["requirements.lock"]


def test_image_show_names_the_project_on_its_base_pin(tmp_path: Path) -> None:
    from provisioner.image.pin import write_pin
    from tests.cli import cli

    p = parse_project(Path("/p/x"), PYPROJECT.replace('apt = ["libgeos-c1v5"]', "apt = []"), None)
    pin = project_pin(
        base_pin(), sha(9), (sha(2), sha(3), sha(6), sha(7)), None, 115, "t", p,
        {"shapely": "2.2.0", "gridcells": "0.1.0"}, "d" * 64, True,
    )  # fmt: skip
    write_pin(pin, tmp_path / "image.lock.json")
    shown = cli("image", "show", str(tmp_path / "image.lock.json"))
    assert shown.exit_code == 0, shown.stderr
    line = f"project gridcells 0.1.0 on the base pin {sha(1)[:19]}: shapely 2.2.0, gridcells 0.1.0"
    assert line in shown.stdout
    write_pin(base_pin(), tmp_path / "base.json")  # a base pin: no project line
    assert "project" not in cli("image", "show", str(tmp_path / "base.json")).stdout
