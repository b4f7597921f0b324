"""Leaving held layers out of a saved image, in both layouts of `docker save`."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from provisioner.errors import OperationError
from provisioner.image.savestream import partial, passthrough, read_saved

LAYERS = [b"base layer " * 1000, b"torch layer " * 5000, b"venv layer " * 3000]
DIFF_IDS = ["sha256:" + hashlib.sha256(data).hexdigest() for data in LAYERS]
CONFIG = "c" * 64


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    if link:
        info.type, info.linkname = tarfile.SYMTYPE, link
        tar.addfile(info)
    elif data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def legacy_save(path: Path, dirs: list[str], link_last_to_first: bool = False) -> Path:
    """As Docker 20.10 writes it: one directory per layer, in NAME order, manifest last."""
    with tarfile.open(path, mode="w") as tar:
        for d in sorted(dirs):
            i = dirs.index(d)
            _add(tar, d)
            _add(tar, f"{d}/VERSION", b"1.0")
            _add(tar, f"{d}/json", b"{}")
            if link_last_to_first and i == len(dirs) - 1:
                _add(tar, f"{d}/layer.tar", link=f"../{dirs[0]}/layer.tar")
            else:
                _add(tar, f"{d}/layer.tar", LAYERS[i])
        _add(tar, f"{CONFIG}.json", b"{}")
        manifest = [{"Config": f"{CONFIG}.json", "Layers": [f"{d}/layer.tar" for d in dirs]}]
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return path


def oci_save(path: Path) -> Path:
    """As Docker 25+ writes it: layers as blobs named by digest."""
    with tarfile.open(path, mode="w") as tar:
        _add(tar, "blobs")
        _add(tar, "blobs/sha256")
        for data, diff in zip(LAYERS, DIFF_IDS, strict=True):
            _add(tar, f"blobs/sha256/{diff.removeprefix('sha256:')}", data)
        _add(tar, f"blobs/sha256/{CONFIG}", b"{}")
        _add(tar, "index.json", b"{}")
        layers = [f"blobs/sha256/{d.removeprefix('sha256:')}" for d in DIFF_IDS]
        manifest = [{"Config": f"blobs/sha256/{CONFIG}", "Layers": layers}]
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return path


# layer directories whose names do NOT sort in layer order, as in real saves
DIRS = ["f" * 64, "0" * 64, "8" * 64]


def members(data: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            f = tar.extractfile(m) if m.isfile() else None
            out[m.name] = f.read() if f else m.linkname.encode()
    return out


@pytest.fixture(params=["legacy", "oci"])
def saved_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "image.tar"
    return legacy_save(path, DIRS) if request.param == "legacy" else oci_save(path)


def test_read_saved_maps_layer_files_in_manifest_order(saved_file: Path) -> None:
    saved = read_saved(saved_file)
    assert saved.config == f"sha256:{CONFIG}"
    contents = members(saved_file.read_bytes())
    assert [contents[name] for name in saved.layer_files] == LAYERS


def test_omitting_nothing_reproduces_the_file(saved_file: Path) -> None:
    out = b"".join(partial(read_saved(saved_file), 0))
    assert members(out) == members(saved_file.read_bytes())


@pytest.mark.parametrize("omit", [1, 2, 3])
def test_held_layers_are_left_out_and_the_rest_is_intact(saved_file: Path, omit: int) -> None:
    omitted: list[int] = []
    out = b"".join(partial(read_saved(saved_file), omit, omitted.append))
    before, after = members(saved_file.read_bytes()), members(out)
    assert [v for v in after.values() if v in LAYERS] == LAYERS[omit:]
    assert sum(omitted) == sum(len(x) for x in LAYERS[:omit])
    assert set(after) < set(before)
    assert all(after[name] == before[name] for name in after)  # the rest byte for byte
    assert "manifest.json" in after


def test_a_needed_link_keeps_its_target(tmp_path: Path) -> None:
    path = legacy_save(tmp_path / "i.tar", DIRS, link_last_to_first=True)
    after = members(b"".join(partial(read_saved(path), 2)))
    assert after[f"{DIRS[0]}/layer.tar"] == LAYERS[0]  # target of the kept link stays
    assert f"{DIRS[1]}/layer.tar" not in after


def test_passthrough_is_byte_for_byte(saved_file: Path) -> None:
    data = saved_file.read_bytes()
    assert b"".join(passthrough(io.BytesIO(data))) == data


def test_a_file_that_is_not_a_save_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x.tar"
    with tarfile.open(bad, mode="w") as tar:
        _add(tar, "hello", b"hi")
    with pytest.raises(OperationError, match="not a readable `docker save` file"):
        read_saved(bad)
