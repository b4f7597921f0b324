"""How an image delivery sends the pin (`image push`'s flags, `up --push`'s mode): the
options every runtime's `delivery(options)` takes (`runtime.protocol.Runtime`). Docker's push
reads them all; Podman refuses the star and the chain; the host delivers no image."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from provisioner.image.compress import Mode
from provisioner.image.pin import CLUSTER_TAG

HeadStartMode = Literal["auto", "always", "never"]


@dataclass(frozen=True)
class PushOptions:
    parallelism: int = 4
    retries: int = 2  # fresh attempts after a broken stream
    star: bool = False  # the star: once to the head, which sends on to every worker
    chain: bool = False  # the chain: every node streams on what it receives
    chain_from: int = 2  # chain: chain when this many nodes lack layers, else send direct
    full: bool = False  # send every layer even if the node holds some
    timeout: float = 1800.0  # per node
    tag: str = CLUSTER_TAG
    cache_dir: Path | None = None  # saved images for partial sends; default: the state dir
    compress: Mode = "auto"  # auto: by the link (compress.choose); always; never
    # a cold node's plain send: an image starting the pin goes ahead (HeadStart); auto: as
    # much as the probed link carries in `docker save`'s lead; always: the longest, at
    # most half the pin, whatever the link (tests); never
    head_start: HeadStartMode = "auto"
    # names the pid files of this push's loads on the nodes (`load_command`): a push
    # (`push_image`) takes a fresh one, so that its interrupt ends its own loads only
    push_id: str = field(default_factory=lambda: secrets.token_hex(8), compare=False)


__all__ = ["HeadStartMode", "PushOptions"]
