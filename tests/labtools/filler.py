"""A cheap image to push, for the push's end-to-end tests and `scripts/bench_push.py`."""

from __future__ import annotations

import os
import random
import re
import tempfile
from dataclasses import replace
from pathlib import Path

from provisioner.image.pin import Pin
from provisioner.lab.engine import client


def filler_image(
    base: Pin, tag: str, megabytes: int, parent: str = "scratch", text: bool = False
) -> Pin:
    """A cheap image to push in tests and benchmarks: `parent` plus one layer of
    `megabytes` pseudo-random bytes fixed by the tag (so the same image ID on every run),
    built locally as `tag` and pinned like `base`. `text`: the bytes drawn from 16
    letters (4 bits each, so a compressor halves them about), not from all 256."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", tag)
    with tempfile.TemporaryDirectory(prefix="filler-") as tmp:
        blob = Path(tmp) / name
        data = random.Random(tag).randbytes(megabytes * 1024 * 1024)
        if text:
            data = data.translate(bytes(b"abcdefghijklmnop"[i % 16] for i in range(256)))
        blob.write_bytes(data)
        os.utime(blob, (0, 0))
        (Path(tmp) / "Dockerfile").write_text(f"FROM {parent}\nCOPY {name} /{name}\n")
        image, _ = client().images.build(path=tmp, tag=tag, rm=True)
    attrs = client().api.inspect_image(image.id)
    return replace(
        base,
        image_id=image.id,
        layers=tuple(attrs["RootFS"]["Layers"]),
        layer_sizes=None,
        size=int(attrs["Size"]),
        tag=tag,
    )
