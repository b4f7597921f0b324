"""`docker save` output, whole or with the layers a node already holds left out.

`docker load` reads manifest.json and, for each layer, first looks the layer's chain up in
its store; it opens the layer's file in the tar only when the chain is missing. So a tar
that omits the files of layers the node holds loads as well as the full one (the
end-to-end tests check it on Docker 20.10).

Which file holds which layer is said only by manifest.json (`Layers`, in the image's
order), and `docker save` writes it last, with the layer directories in name order, not
in layer order. A partial send therefore works from a saved file (kept in a cache and
shared by every node of the push): its index is read first, then the kept members are
copied byte for byte. Both layouts work: legacy (`<v1-id>/layer.tar`, Docker < 25) and
OCI (`blobs/sha256/<hex>`, Docker >= 25).

A partial send carries only what `docker load` reads from a save with a manifest.json:
that file, the config it names and the layer files it opens (moby's
image/tarexport/load.go, `Load`, the same from 20.10 to 29). The legacy `<v1-id>/json`
and `VERSION` files are read only by its `legacyLoad`, for a tar without manifest.json,
and a missing parent directory is made by the untar itself (pkg/archive `Unpack`), so
the layer directories' entries, their json and VERSION files, and an OCI save's
index.json, oci-layout and manifest blob stay here. `podman load` never gets a partial
send: containers/image's docker-archive source refuses a tar with a layer file missing
(docker/internal/tarfile/src.go, "Some layer tarfiles are missing in the tarball").
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from provisioner.errors import OperationError

CHUNK = 1 << 20
_END = b"\0" * (2 * tarfile.BLOCKSIZE)


def passthrough(stream: IO[bytes]) -> Iterator[bytes]:
    """A whole `docker save` stream, in chunks, untouched."""
    while block := stream.read(CHUNK):
        yield block


@dataclass(frozen=True)
class SavedImage:
    """The index of a saved image file: its members and which of them hold layers."""

    path: Path
    config: str  # "sha256:<hex>": the image ID
    layer_files: tuple[str, ...]  # manifest order: layer_files[i] holds diff ID i
    members: tuple[tarfile.TarInfo, ...]


def _norm(name: str) -> str:
    return name.removeprefix("./")


def read_saved(path: Path) -> SavedImage:
    """Index a `docker save` file (headers only; the data is skipped by seeking)."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            members = tuple(tar.getmembers())
            manifest_file = tar.extractfile("manifest.json")
            if manifest_file is None:
                raise KeyError("manifest.json")
            manifest = json.load(manifest_file)
    except (tarfile.TarError, KeyError, json.JSONDecodeError, OSError) as exc:
        raise OperationError(
            f"{path} is not a readable `docker save` file ({exc})",
            f"delete {path} and push again (it is saved anew)",
        ) from None
    if not isinstance(manifest, list) or len(manifest) != 1:
        raise OperationError(
            f"{path}: manifest.json must describe exactly one image",
            f"delete {path} and push again (it is saved anew)",
        )
    entry = manifest[0]
    config = _norm(str(entry["Config"]))
    digest = config.removeprefix("blobs/sha256/").removesuffix(".json")
    layers = tuple(_norm(str(name)) for name in entry["Layers"])
    return SavedImage(path, f"sha256:{digest}", layers, members)


def omitted_members(saved: SavedImage, omit_first: int) -> set[str]:
    """The (normalised) names of the layer files a send without the first `omit_first`
    layers leaves out: a kept layer's file may be a link to an earlier layer's file."""
    by_name = {_norm(m.name): m for m in saved.members}
    needed = set(saved.layer_files[omit_first:])
    for name in list(needed):
        member = by_name.get(name)
        if member is not None and member.issym():
            target = posixpath.join(posixpath.dirname(name), member.linkname)
            needed.add(_norm(posixpath.normpath(target)))
    return set(saved.layer_files[:omit_first]) - needed


def sent_members(saved: SavedImage, omit_first: int) -> list[tarfile.TarInfo]:
    """The members a send without the first `omit_first` layers carries, in the file's
    order: all of them when none is left out (the save as it is); else what `docker load`
    reads (module doc): manifest.json, the config, and the kept layers' files (a link and
    its target)."""
    if omit_first <= 0:
        return list(saved.members)
    layers = set(saved.layer_files) - omitted_members(saved, omit_first)
    read = {"manifest.json", _norm(_config_member(saved).name), *layers}
    return [m for m in saved.members if not m.isdir() and _norm(m.name) in read]


def partial(
    saved: SavedImage, omit_first: int, on_omitted: Callable[[int], None] | None = None
) -> Iterator[bytes]:
    """The saved tar without its first `omit_first` layers: the members `sent_members`
    names, each byte for byte as saved, then the end-of-archive blocks."""
    omit = omitted_members(saved, omit_first)
    if on_omitted is not None:
        for member in saved.members:
            if member.isfile() and _norm(member.name) in omit:
                on_omitted(member.size)
    with saved.path.open("rb") as f:
        for member in sent_members(saved, omit_first):
            end = member.offset_data + (member.size if member.isfile() else 0)
            end += -end % tarfile.BLOCKSIZE
            f.seek(member.offset)
            remaining = end - member.offset
            while remaining > 0:
                block = f.read(min(CHUNK, remaining))
                if not block:
                    raise OperationError(
                        f"{saved.path} ends early",
                        "delete it (the push saves and compresses it anew) and push again",
                    )
                remaining -= len(block)
                yield block
    yield _END


# Docker's containerd image store (Docker >= 24 with the containerd-snapshotter feature;
# the default of fresh installs since Docker 29) keys an image by its manifest's digest,
# not by its config's (the image ID of the classic store, and of the pin). `docker load` of
# a `docker save` file makes that manifest itself, the same bytes every time: the config
# and each layer as a plain (uncompressed) tar, whose digest is its diff ID.
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"


def _layer_member(saved: SavedImage, i: int) -> tarfile.TarInfo:
    by_name = {_norm(m.name): m for m in saved.members}
    name = saved.layer_files[i]
    member = by_name[name]
    while member.issym():
        name = _norm(posixpath.normpath(posixpath.join(posixpath.dirname(name), member.linkname)))
        member = by_name[name]
    return member


def _config_member(saved: SavedImage) -> tarfile.TarInfo:
    hexd = saved.config.removeprefix("sha256:")
    for m in saved.members:
        if _norm(m.name) in (f"{hexd}.json", f"blobs/sha256/{hexd}"):
            return m
    raise OperationError(
        f"{saved.path} holds no config {saved.config[:19]}",
        f"delete {saved.path} and push again (it is saved anew)",
    )


def containerd_manifest(saved: SavedImage, diff_ids: tuple[str, ...]) -> bytes:
    """The manifest Docker's containerd image store makes when it loads `saved` (byte for
    byte as containerd's importer writes it); its digest is the image's ID there."""
    if len(diff_ids) != len(saved.layer_files):
        raise OperationError(
            f"{saved.path}: {len(saved.layer_files)} layers, not {len(diff_ids)}",
            f"the saved image is not the pin's: delete {saved.path} and push again",
        )
    doc = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {
            "mediaType": CONFIG_TYPE,
            "digest": saved.config,
            "size": _config_member(saved).size,
        },
        "layers": [
            {"mediaType": LAYER_TYPE, "digest": d, "size": _layer_member(saved, i).size}
            for i, d in enumerate(diff_ids)
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def containerd_id(saved: SavedImage, diff_ids: tuple[str, ...]) -> str:
    """The saved image's ID in Docker's containerd image store."""
    return "sha256:" + hashlib.sha256(containerd_manifest(saved, diff_ids)).hexdigest()


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0o444
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _pad(n: int) -> bytes:
    return b"\0" * (-n % tarfile.BLOCKSIZE)


def _small(name: str, data: bytes) -> bytes:
    return _header(name, len(data)) + data + _pad(len(data))


def oci_layout(
    saved: SavedImage,
    diff_ids: tuple[str, ...],
    omit_first: int = 0,
    on_omitted: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The saved image as an OCI image layout for a node with the containerd image store,
    without the blobs of its first `omit_first` layers. That store's `docker load` reads
    a layout's index and manifest and takes a layer it holds from its own content store
    (it refuses a `docker save` file with a layer file missing). The manifest is
    `containerd_manifest`, so the loaded image's ID is `containerd_id` on any path."""
    manifest = containerd_manifest(saved, diff_ids)
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [{"mediaType": MANIFEST_TYPE, "digest": digest, "size": len(manifest)}],
    }
    yield _small("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
    yield _small("index.json", json.dumps(index, separators=(",", ":")).encode())
    yield _small(f"blobs/sha256/{digest.removeprefix('sha256:')}", manifest)
    config = _config_member(saved)
    kept = {d: _layer_member(saved, i) for i, d in enumerate(diff_ids) if i >= omit_first}
    omitted = {d: _layer_member(saved, i) for i, d in enumerate(diff_ids) if i < omit_first}
    blobs = [(saved.config, config), *kept.items()]
    if on_omitted is not None:
        for d, member in omitted.items():
            if d not in kept:
                on_omitted(member.size)
    with saved.path.open("rb") as f:
        for d, member in blobs:
            yield _header(f"blobs/sha256/{d.removeprefix('sha256:')}", member.size)
            f.seek(member.offset_data)
            remaining = member.size
            while remaining > 0:
                block = f.read(min(CHUNK, remaining))
                if not block:
                    raise OperationError(
                        f"{saved.path} ends early",
                        "delete it (the push saves and compresses it anew) and push again",
                    )
                remaining -= len(block)
                yield block
            yield _pad(member.size)
    yield _END
