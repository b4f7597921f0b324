"""The pin: the image every node must hold, by content, and what is inside it.

`provisioner image build` writes it (images/image.lock.json by default); the inventory
refers to it (`image: {lock: ...}`); every other command trusts the pin, never a tag.
Its content is specific to the machine that built the image (the base image's ID comes
from a local debootstrap), so the file is not committed: each machine builds its own.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from provisioner.errors import InputError

SCHEMA = 1
CLUSTER_TAG = "provisioner/ray:cluster"
BUILD_TAG = "provisioner/ray:local"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # checked whole (fullmatch)
_FIX = "run `provisioner image build` to build the image and write its pin again"


@dataclass(frozen=True)
class Versions:
    """What runs inside the image, read from inside it after the build."""

    python: str
    ray: str
    torch: str
    gymnasium: str


@dataclass(frozen=True)
class Pin:
    """One built image, identified by content."""

    image_id: str
    layers: tuple[str, ...]  # diff IDs, base first
    base_image: str
    base_image_id: str
    requirements_sha256: str
    versions: Versions
    size: int  # bytes, all layers unpacked
    layer_sizes: tuple[int, ...] | None = None  # per layer, when docker could tell
    built_at: str = ""
    tag: str = BUILD_TAG
    extra: dict[str, Any] = field(default_factory=dict)

    def short_id(self) -> str:
        return self.image_id.removeprefix("sha256:")[:12]

    def bytes_for(self, first_missing: int) -> int:
        """About how many bytes the layers from `first_missing` on hold, unpacked."""
        if self.layer_sizes is not None and len(self.layer_sizes) == len(self.layers):
            return sum(self.layer_sizes[first_missing:])
        return self.size if first_missing < len(self.layers) else 0


def pin_to_dict(pin: Pin) -> dict[str, Any]:
    data = asdict(pin)
    data["layers"] = list(pin.layers)
    data["layer_sizes"] = list(pin.layer_sizes) if pin.layer_sizes is not None else None
    extra = data.pop("extra")
    return {"schema": SCHEMA, **data, **({"extra": extra} if extra else {})}


def pin_from_dict(data: Any, where: str) -> Pin:
    """Validate a parsed pin; a clear InputError for every field that is wrong."""
    if not isinstance(data, dict):
        raise InputError("the pin is not a JSON object", _FIX, where=where)
    if data.get("schema") != SCHEMA:
        raise InputError(
            f"unknown pin schema {data.get('schema')!r} (this provisioner reads {SCHEMA})",
            _FIX,
            where=where,
        )

    def text(key: str, pattern: re.Pattern[str] | None = None) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value or (pattern and not pattern.fullmatch(value)):
            raise InputError(f"field {key!r} is missing or malformed: {value!r}", _FIX, where=where)
        return value

    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise InputError("field 'layers' must be a non-empty list", _FIX, where=where)
    for layer in layers:
        if not isinstance(layer, str) or not _DIGEST.fullmatch(layer):
            raise InputError(f"layer {layer!r} is not a sha256 digest", _FIX, where=where)
    versions = data.get("versions")
    keys = ("python", "ray", "torch", "gymnasium")
    if not isinstance(versions, dict) or not all(isinstance(versions.get(k), str) for k in keys):
        raise InputError(f"field 'versions' must name {', '.join(keys)}", _FIX, where=where)
    size = data.get("size")
    if not isinstance(size, int) or size < 0:
        raise InputError(f"field 'size' must be a byte count: {size!r}", _FIX, where=where)
    sizes = data.get("layer_sizes")
    if sizes is not None and (
        not isinstance(sizes, list) or not all(isinstance(s, int) and s >= 0 for s in sizes)
    ):
        raise InputError("field 'layer_sizes' must be a list of byte counts", _FIX, where=where)
    extra = data.get("extra", {})
    return Pin(
        image_id=text("image_id", _DIGEST),
        layers=tuple(layers),
        base_image=text("base_image"),
        base_image_id=text("base_image_id", _DIGEST),
        requirements_sha256=text("requirements_sha256"),
        versions=Versions(**{k: versions[k] for k in keys}),
        size=size,
        layer_sizes=tuple(sizes) if sizes is not None else None,
        built_at=str(data.get("built_at", "")),
        tag=str(data.get("tag", BUILD_TAG)),
        extra=extra if isinstance(extra, dict) else {},
    )


def read_pin(path: Path) -> Pin:
    """Read and validate the pin at `path`."""
    where = str(path)
    try:
        raw = path.read_text()
    except FileNotFoundError:
        raise InputError("no image pin here", _FIX, where=where) from None
    except OSError as exc:
        raise InputError(f"cannot read the pin: {exc.strerror}", _FIX, where=where) from exc
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", _FIX, where=where
        ) from exc
    return pin_from_dict(data, where)


def write_pin(pin: Pin, path: Path) -> None:
    """Write the pin atomically (a reader never sees half a file)."""
    write_atomically(path, (json.dumps(pin_to_dict(pin), indent=2) + "\n").encode())


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` as `path` through a temporary file in its folder and one rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# The diff ID of a layer that changes nothing (a RUN that wrote no file): an empty tar.
EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def layer_sizes_from_history(
    history: list[dict[str, Any]], layers: tuple[str, ...]
) -> tuple[int, ...] | None:
    """Per-layer sizes from `docker history` (newest first), or None when they cannot be
    matched one to one with the layers. Rows of metadata steps and of empty layers have
    size 0; every other layer has one row with its size, in order."""
    sizes = iter([int(row.get("Size", 0)) for row in reversed(history) if row.get("Size", 0)])
    out: list[int] = []
    for layer in layers:
        if layer == EMPTY_LAYER:
            out.append(0)
            continue
        size = next(sizes, None)
        if size is None:
            return None
        out.append(size)
    return tuple(out) if next(sizes, None) is None else None
