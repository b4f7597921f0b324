"""A `docker save` stream with the layers a node already holds left out.

`docker load` reads manifest.json and, for each layer, first looks the layer's chain up in
its store; it opens the layer's file in the tar only when the chain is missing. So a tar
that omits the files of layers the node holds loads as well as the full one (checked on
Docker 20.10 by the end-to-end tests). Two layouts of `docker save` exist:
- legacy (Docker < 25): `<v1-id>/layer.tar`, one directory per layer, written in the
  order of the image's layers. The omitted ones are hashed on the way, so a different
  order is caught rather than trusted;
- OCI (Docker >= 25): `blobs/sha256/<hex>`, where a layer's digest is its diff ID.
"""

from __future__ import annotations

import hashlib
import re
import tarfile
from collections.abc import Callable, Iterator, Sequence
from typing import IO

from provisioner.errors import OperationError

CHUNK = 1 << 20
_LEGACY = re.compile(r"^(?:\./)?[0-9a-f]{64}/layer\.tar$")
_BLOB = re.compile(r"^(?:\./)?blobs/sha256/([0-9a-f]{64})$")


def _data(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    f = tar.extractfile(member)
    if f is None:
        return
    while block := f.read(CHUNK):
        yield block


def filter_save(
    stream: IO[bytes],
    layers: Sequence[str],
    omit_first: int,
    on_omitted: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The tar from `stream`, without the files of `layers[:omit_first]`."""
    omit = set(layers[:omit_first])
    legacy_index = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = member.name
            blob = _BLOB.match(name)
            if blob and member.isfile() and f"sha256:{blob.group(1)}" in omit:
                _count(on_omitted, member.size)
                continue
            if _LEGACY.match(name) and member.isfile():
                index = legacy_index
                legacy_index += 1
                if index < omit_first:
                    _check_layer(_data(tar, member), layers[index], index)
                    _count(on_omitted, member.size)
                    continue
            yield member.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
            if member.isfile():
                yield from _data(tar, member)
                pad = -member.size % tarfile.BLOCKSIZE
                if pad:
                    yield b"\0" * pad
    yield b"\0" * (2 * tarfile.BLOCKSIZE)


def _count(on_omitted: Callable[[int], None] | None, size: int) -> None:
    if on_omitted is not None:
        on_omitted(size)


def _check_layer(blocks: Iterator[bytes], expected: str, index: int) -> None:
    h = hashlib.sha256()
    for block in blocks:
        h.update(block)
    if f"sha256:{h.hexdigest()}" != expected:
        raise OperationError(
            f"docker save wrote layer {index} out of the image's order "
            f"(sha256:{h.hexdigest()[:12]}, expected {expected[:19]})",
            "push with --full to send every layer",
        )
