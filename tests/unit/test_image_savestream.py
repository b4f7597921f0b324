"""Leaving held layers out of a `docker save` stream, in both of its layouts."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from provisioner.errors import OperationError
from provisioner.image.savestream import filter_save

LAYERS = [b"base layer " * 1000, b"torch layer " * 5000, b"venv layer " * 3000]
DIFF_IDS = ["sha256:" + hashlib.sha256(data).hexdigest() for data in LAYERS]


def _add(tar: tarfile.TarFile, name: str, data: bytes | None) -> None:
    info = tarfile.TarInfo(name)
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        return
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def legacy_save(order: list[int] | None = None) -> bytes:
    """A tar laid out as Docker 20.10's `docker save` writes it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        dirs = []
        for i in order or range(len(LAYERS)):
            d = f"{i:064x}"
            dirs.append(d)
            _add(tar, d, None)
            _add(tar, f"{d}/VERSION", b"1.0")
            _add(tar, f"{d}/json", b"{}")
            _add(tar, f"{d}/layer.tar", LAYERS[i])
        _add(tar, "c" * 64 + ".json", b"{}")
        manifest = [{"Config": "c" * 64 + ".json", "Layers": [f"{d}/layer.tar" for d in dirs]}]
        _add(tar, "manifest.json", json.dumps(manifest).encode())
    return buf.getvalue()


def oci_save() -> bytes:
    """A tar laid out as Docker 25+ writes it: layers as blobs named by digest."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add(tar, "blobs", None)
        _add(tar, "blobs/sha256", None)
        for data, diff in zip(LAYERS, DIFF_IDS, strict=True):
            _add(tar, f"blobs/sha256/{diff.removeprefix('sha256:')}", data)
        _add(tar, "index.json", b"{}")
        _add(tar, "manifest.json", b"[]")
    return buf.getvalue()


def members(data: bytes) -> dict[str, bytes]:
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            f = tar.extractfile(m)
            out[m.name] = f.read() if f else b""
    return out


@pytest.mark.parametrize("save", [legacy_save, oci_save])
def test_omitting_nothing_keeps_every_member_and_byte(save: object) -> None:
    source = save()  # type: ignore[operator]
    out = b"".join(filter_save(io.BytesIO(source), DIFF_IDS, 0))
    assert members(out) == members(source)


@pytest.mark.parametrize("save", [legacy_save, oci_save])
def test_held_layers_are_left_out_and_the_rest_is_intact(save: object) -> None:
    source = save()  # type: ignore[operator]
    omitted: list[int] = []
    out = b"".join(filter_save(io.BytesIO(source), DIFF_IDS, 2, omitted.append))
    before, after = members(source), members(out)
    kept_layers = [v for v in after.values() if v in LAYERS]
    assert kept_layers == [LAYERS[2]]
    assert sum(omitted) == len(LAYERS[0]) + len(LAYERS[1])
    assert set(after) < set(before)
    for name in after:  # everything else byte for byte
        assert after[name] == before[name]
    assert len(out) < len(source) - sum(omitted) + 4096


def test_a_legacy_save_in_an_unexpected_order_is_refused() -> None:
    source = legacy_save(order=[1, 0, 2])
    with pytest.raises(OperationError, match="out of the image's order"):
        b"".join(filter_save(io.BytesIO(source), DIFF_IDS, 1))
