"""The pin (image.lock.json) and the requirements lock: reading, writing, validation."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from provisioner.errors import InputError
from provisioner.image.lock import LockedWheel, format_lock, lock_sha256, parse_lock
from provisioner.image.pin import (
    EMPTY_LAYER,
    Pin,
    Versions,
    layer_sizes_from_history,
    pin_to_dict,
    read_pin,
    write_pin,
)

D = "sha256:" + "a" * 64
L1, L2, L3 = ("sha256:" + c * 64 for c in "123")


def make_pin(**changes: object) -> Pin:
    pin = Pin(
        image_id=D,
        layers=(L1, L2, L3),
        base_image="provisioner-base:bookworm-x",
        base_image_id="sha256:" + "b" * 64,
        requirements_sha256="c" * 64,
        versions=Versions(python="3.11.2", ray="2.60.0", torch="2.13.0+cpu", gymnasium="1.2.2"),
        size=3000,
        layer_sizes=(1000, 500, 1500),
        built_at="2026-11-29T23:00:00+00:00",
    )
    return replace(pin, **changes)  # type: ignore[arg-type]


def test_pin_round_trips_through_the_file(tmp_path: Path) -> None:
    pin = make_pin()
    path = tmp_path / "sub" / "image.lock.json"
    write_pin(pin, path)
    assert read_pin(path) == pin
    data = json.loads(path.read_text())
    assert data["schema"] == 1 and data["layers"] == [L1, L2, L3]
    assert data["versions"]["ray"] == "2.60.0"
    assert [p.name for p in path.parent.iterdir()] == ["image.lock.json"]  # no temp file left


def test_pin_without_layer_sizes_round_trips(tmp_path: Path) -> None:
    pin = make_pin(layer_sizes=None)
    write_pin(pin, tmp_path / "p.json")
    assert read_pin(tmp_path / "p.json").layer_sizes is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"image_id": "abc"}, "image_id"),
        ({"layers": []}, "layers"),
        ({"layers": ["sha256:zz"]}, "not a sha256 digest"),
        ({"schema": 9}, "unknown pin schema 9"),
        ({"versions": {"python": "3.11"}}, "versions"),
        ({"size": -1}, "size"),
        ({"layer_sizes": ["x"]}, "layer_sizes"),
    ],
)
def test_a_bad_pin_is_an_input_error_naming_the_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    data = {**pin_to_dict(make_pin()), **change}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        read_pin(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)
    assert err.value.fix and "image build" in err.value.fix


def test_missing_and_broken_pins_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no image pin"):
        read_pin(tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        read_pin(tmp_path / "bad.json")


def test_bytes_for_counts_only_missing_layers() -> None:
    pin = make_pin()
    assert pin.bytes_for(0) == 3000
    assert pin.bytes_for(2) == 1500
    assert pin.bytes_for(3) == 0
    assert make_pin(layer_sizes=None).bytes_for(1) == 3000  # unknown sizes: assume all


def test_layer_sizes_from_history_skips_metadata_rows_and_empty_layers() -> None:
    history = [  # newest first, as docker returns it
        {"Size": 0},  # CMD
        {"Size": 40},  # COPY profile
        {"Size": 900},  # COPY venv
        {"Size": 0},  # ENV
        {"Size": 100},  # base
    ]
    layers = (L1, EMPTY_LAYER, L2, L3)
    assert layer_sizes_from_history(history, layers) == (100, 0, 900, 40)
    assert layer_sizes_from_history(history, (L1, L2)) is None  # rows left over
    assert layer_sizes_from_history(history[:2], layers) is None  # too few rows


def test_requirements_lock_round_trips_and_hash_ignores_comments() -> None:
    wheels = [
        LockedWheel("torch", "2.13.0+cpu", "1" * 64),
        LockedWheel("Jinja2", "3.1.6", "2" * 64),
    ]
    text = format_lock(wheels, "requirements.in")
    parsed = parse_lock(text, "x")
    assert [w.name for w in parsed] == ["Jinja2", "torch"]  # sorted by canonical name
    assert parsed[1] == LockedWheel("torch", "2.13.0+cpu", "1" * 64)
    assert lock_sha256(text) == lock_sha256("# another header\n" + text)
    changed = text.replace("3.1.6", "3.1.7")
    assert lock_sha256(changed) != lock_sha256(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ray==2.60.0\n", "not `name==version --hash"),
        ("ray>=2 --hash=sha256:" + "1" * 64 + "\n", "not `name==version --hash"),
        ("# only a comment\n", "lists no packages"),
        ("a==1 --hash=sha256:{0}\nA==2 --hash=sha256:{0}\n".format("1" * 64), "more than once"),
    ],
)
def test_a_bad_requirements_lock_is_an_input_error(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_lock(text, "requirements.lock")


def test_the_committed_lock_pins_the_issue_versions() -> None:
    root = Path(__file__).resolve().parents[2] / "images"
    wheels = {
        w.name.lower(): w.version
        for w in parse_lock((root / "requirements.lock").read_text(), "lock")
    }
    assert wheels["ray"] == "2.60.0"
    assert wheels["torch"] == "2.13.0+cpu"  # the CPU build, never the CUDA one
    assert "gymnasium" in wheels
    assert not any(name.startswith("nvidia") for name in wheels)
    # the image serves TensorBoard on the head (`provisioner tunnel`), CPU and CUDA alike
    cuda = parse_lock((root / "requirements-cuda.lock").read_text(), "lock")
    assert "tensorboard" in wheels and "tensorboard" in {w.name.lower() for w in cuda}


def test_a_missing_requirements_file_is_named_with_its_fix(tmp_path: Path) -> None:
    import pytest

    from provisioner.errors import InputError
    from provisioner.image.lock import resolve, resolve_without_download

    missing = tmp_path / "requirements.in"
    for call in (lambda: resolve(missing, tmp_path), lambda: resolve_without_download(missing)):
        with pytest.raises(InputError) as caught:
            call()
        assert caught.value.where == str(missing) and "--images-dir" in (caught.value.fix or "")


def test_the_lock_names_its_indexes_and_they_do_not_change_what_it_pins() -> None:
    from provisioner.image.lock import index_urls, without_indexes

    wheels = [LockedWheel("torch", "2.13.0+cpu", "1" * 64)]
    cpu = "https://download.pytorch.org/whl/cpu"
    text = format_lock(wheels, "requirements.in", [cpu])
    assert index_urls(text) == [cpu]
    assert parse_lock(text, "x") == wheels
    assert lock_sha256(text) == lock_sha256(format_lock(wheels, "requirements.in"))
    assert without_indexes(text) == format_lock(wheels, "requirements.in")
    assert index_urls(f"-i {cpu}\n--index-url={cpu}/x\nray==1\n") == [cpu, f"{cpu}/x"]
    # the committed files: PyTorch's CPU index is where torch 2.13.0+cpu comes from
    root = Path(__file__).resolve().parents[2] / "images"
    assert index_urls((root / "requirements.in").read_text()) == [cpu]
    assert index_urls((root / "requirements.lock").read_text()) == [cpu]


def _one_wheel_index(root: Path) -> tuple[LockedWheel, str]:
    """A package index (PEP 503, on disk) serving one pure wheel that no other index has."""
    import base64
    import hashlib
    import zipfile

    name, version = "provisioner_only_here", "1.0+cpu"
    wheel = root / "files" / f"{name}-{version}-py3-none-any.whl"
    wheel.parent.mkdir(parents=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.append(f"{path},sha256={digest.decode()},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    page = root / "simple" / "provisioner-only-here" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="../../files/{wheel.name}#sha256={sha}">{wheel.name}</a>\n')
    return LockedWheel(name, version, sha), (root / "simple").as_uri()


def test_a_wheel_pips_own_configuration_lacks_comes_from_the_index_the_lock_names(
    tmp_path: Path,
) -> None:
    """Real pip: the wheelhouse asks pip's configuration first, then the lock's index
    (a stock machine's PyPI lacks the CPU torch that PyTorch's index serves)."""
    from provisioner.errors import OperationError
    from provisioner.image.wheelhouse import ensure_wheels

    locked, index = _one_wheel_index(tmp_path / "index")
    # positive control: pip's own configuration alone does not have it
    with pytest.raises(OperationError):
        ensure_wheels([locked], tmp_path / "without")
    got = ensure_wheels([locked], tmp_path / "with", indexes=[index])
    assert [p.name for p in got] == [f"{locked.name}-{locked.version}-py3-none-any.whl"]
    assert (tmp_path / "with" / got[0].name).is_file()


def test_a_percent_encoded_wheel_url_in_pips_report_is_read_as_its_file_name() -> None:
    from provisioner.image.lock import wheels_in_report

    url = (
        "https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-"
        "manylinux_2_28_x86_64.whl#sha256=ab"
    )
    item = {"download_info": {"url": url, "archive_info": {"hashes": {"sha256": "ab" * 32}}}}
    (wheel,) = wheels_in_report({"install": [item]})
    assert (wheel.name, wheel.version) == ("torch", "2.13.0+cpu")
    assert wheel.filename == "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
