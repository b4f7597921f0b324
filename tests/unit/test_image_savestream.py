"""Leaving held layers out of a saved image, in both layouts of `docker save`."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from provisioner.errors import OperationError
from provisioner.image.compress import CacheRecord, Codec, LayerCache, compressed_stream
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


def span(size: int) -> int:
    """A plain member's bytes in a tar: its header block, then its data padded to blocks."""
    return tarfile.BLOCKSIZE + size + (-size % tarfile.BLOCKSIZE)


def read_by_docker_load(layout: str, omit: int) -> list[str]:
    """What `docker load` reads of a save with a manifest.json (moby's
    image/tarexport/load.go): manifest.json, the config, the files of the layers it lacks."""
    config = f"{CONFIG}.json" if layout == "legacy" else f"blobs/sha256/{CONFIG}"
    layers = (
        [f"{d}/layer.tar" for d in DIRS]
        if layout == "legacy"
        else [f"blobs/sha256/{d.removeprefix('sha256:')}" for d in DIFF_IDS]
    )
    return ["manifest.json", config, *layers[omit:]]


@pytest.mark.parametrize("layout", ["legacy", "oci"])
@pytest.mark.parametrize("omit", [1, 2, 3])
def test_a_partial_send_holds_only_what_docker_load_reads(
    tmp_path: Path, layout: str, omit: int
) -> None:
    path = tmp_path / "image.tar"
    legacy_save(path, DIRS) if layout == "legacy" else oci_save(path)
    before = members(path.read_bytes())
    out = b"".join(partial(read_saved(path), omit))
    after = members(out)
    # positive control: the save holds what is cut (legacy json, VERSION and directories;
    # an OCI save's index.json and directories)
    cut = [n for n in before if n.endswith(("/json", "/VERSION", "index.json"))]
    assert cut and all(name not in after for name in cut)
    read = read_by_docker_load(layout, omit)
    assert sorted(after) == sorted(read)
    assert all(after[name] == before[name] for name in after)  # byte for byte
    # nothing else on the wire: each member's header and blocks, then the two end blocks
    assert len(out) == sum(span(len(before[n])) for n in read) + 2 * tarfile.BLOCKSIZE
    assert out.endswith(b"\0" * 2 * tarfile.BLOCKSIZE)


def test_a_partial_send_of_one_small_layer_is_that_layer_config_and_manifest(
    tmp_path: Path,
) -> None:
    """The bench's case in bytes: a 24,064-byte top layer on held ones, whose legacy
    entries (a directory, VERSION, json: 2,560 bytes each) no longer travel."""
    small = b"x" * 24064
    dirs = ["a" * 64, "b" * 64]
    with tarfile.open(tmp_path / "i.tar", mode="w") as tar:
        for d, data in zip(dirs, [LAYERS[0], small], strict=True):
            _add(tar, d)
            _add(tar, f"{d}/VERSION", b"1.0")
            _add(tar, f"{d}/json", b"{" + b" " * 400 + b"}")
            _add(tar, f"{d}/layer.tar", data)
        _add(tar, f"{CONFIG}.json", b"{" + b" " * 4481 + b"}")  # 4,483 bytes, as gridcells'
        layers = [f"{d}/layer.tar" for d in dirs]
        _add(
            tar,
            "manifest.json",
            json.dumps([{"Config": f"{CONFIG}.json", "Layers": layers}]).encode(),
        )
    out = b"".join(partial(read_saved(tmp_path / "i.tar"), 1))
    manifest = len(members(out)["manifest.json"])
    assert len(out) == span(24064) + span(4483) + span(manifest) + 1024 == 30720 + span(manifest)


def test_a_compressed_partial_send_holds_only_what_docker_load_reads(tmp_path: Path) -> None:
    path = legacy_save(tmp_path / "image.tar", DIRS)
    cache, codec = LayerCache(tmp_path / "layers"), Codec("zlib", 1)
    out = b"".join(compressed_stream(read_saved(path), DIFF_IDS, 1, codec, cache, CacheRecord()))
    after = members(out)
    assert sorted(after) == sorted(read_by_docker_load("legacy", 1))
    assert after[f"{DIRS[2]}/layer.tar"] != LAYERS[2]  # compressed (the positive control)


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
