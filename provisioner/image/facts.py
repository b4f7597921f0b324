"""The image's experiment facts, captured at build and kept beside its pin.

`provisioner image build` (and `image build --project`) runs the capture
(`provisioner.experiment.capture_source()`) with the built image's Python once and writes
what it prints to a file beside the pin (`image.lock.json` -> `image.facts.json`); the pin
names that file and its sha256 in `extra["facts"]`.

Why a file of its own and not the pin: the facts are some 300 kB (every algorithm's
default config, every registered env id), the pin a few hundred bytes that every command
reads and a person reads too; the sha256 ties the facts to the pin all the same (a
changed or stale file is not taken for the image's).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.errors import OperationError
from provisioner.experiment import Facts
from provisioner.experiment.facts import capture_source
from provisioner.image.pin import Pin

FACTS_KEY = "facts"  # the pin's extra data: {"file": NAME, "sha256": HEX}
PIN_SUFFIX = ".lock.json"
FACTS_SUFFIX = ".facts.json"


def facts_name(pin_path: Path) -> str:
    """The facts file's name beside the pin: `image.lock.json` -> `image.facts.json`."""
    name = pin_path.name
    stem = name[: -len(PIN_SUFFIX)] if name.endswith(PIN_SUFFIX) else name
    return f"{stem}{FACTS_SUFFIX}"


def facts_entry(name: str, data: bytes) -> dict[str, str]:
    """What the pin says of its facts (pure)."""
    return {"file": name, "sha256": hashlib.sha256(data).hexdigest()}


def checked_capture(data: bytes, where: str) -> bytes:
    """The capture's last stdout line as the facts document (the library's own prints go to
    stderr); an OperationError when it is no facts document this provisioner reads."""
    text = data.decode(errors="replace").strip()
    try:
        document: Any = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise OperationError(
            f"the experiment facts' capture printed no JSON document: {text[-300:]!r}",
            "see that the image's Python imports ray.rllib and gymnasium",
            where=where,
        )
    Facts.from_json(document)  # readable by this provisioner (the schema)
    return (text + "\n").encode()


def with_facts(pin: Pin, entry: dict[str, str] | None) -> Pin:
    """`pin` naming `entry` as its facts; none (a failed capture) names none, never facts
    of another image (a project pin copies its base pin's extra data)."""
    from dataclasses import replace

    extra = {k: v for k, v in pin.extra.items() if k != FACTS_KEY}
    return replace(pin, extra={**extra, **({FACTS_KEY: entry} if entry else {})})


def capture_command(python: str) -> list[str]:
    """`PYTHON -c SOURCE`: the capture, run inside the image (argv, no shell)."""
    return [python, "-c", capture_source().decode()]


def login_capture_command() -> list[str]:
    """The capture through a login shell, as `ray up` runs every command (the image's
    PATH, the Python that `read_versions` reads)."""
    return ["bash", "--login", "-c", 'exec python -c "$1"', "capture", capture_source().decode()]


def capture_in_image(image_id: str, command: list[str]) -> bytes:
    """Run the capture in the image (no network): the facts document."""
    from docker.errors import APIError, ContainerError

    from provisioner.local import docker_client

    try:
        out = docker_client().containers.run(
            image_id, command, remove=True, network_disabled=True, stdout=True, stderr=False
        )
    except (APIError, ContainerError) as exc:
        raise OperationError(
            f"the experiment facts' capture failed in the image: {exc}",
            "see that the image's Python imports ray.rllib and gymnasium",
            where=image_id,
        ) from exc
    return checked_capture(bytes(out), image_id)


def write_facts(data: bytes, pin_path: Path) -> dict[str, str]:
    """Write the facts beside the pin (atomically); the pin's entry for them."""
    from provisioner.image.pin import write_atomically

    name = facts_name(pin_path)
    write_atomically(pin_path.parent / name, data)
    return facts_entry(name, data)


@dataclass(frozen=True)
class PinFacts:
    """The facts a pin names: the document, or why there is none to use."""

    facts: Facts | None
    path: Path | None
    missing: str = ""  # why none: no entry (a pin older than the facts), file gone, changed


def pin_facts(pin: Pin, pin_path: Path) -> PinFacts:
    """The facts beside `pin_path`, checked against the pin's sha256."""
    entry = pin.extra.get(FACTS_KEY)
    if not isinstance(entry, dict) or not isinstance(entry.get("file"), str):
        return PinFacts(None, None, "the image's pin names no experiment facts (built before them)")
    name = Path(str(entry["file"])).name  # beside the pin, never elsewhere
    path = pin_path.parent / name
    try:
        data = path.read_bytes()
    except OSError as exc:
        return PinFacts(None, path, f"the pin's experiment facts cannot be read: {exc.strerror}")
    if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        return PinFacts(
            None, path, "the experiment facts beside the pin are not the pin's (sha256 differs)"
        )
    try:
        document = json.loads(data)
    except ValueError:
        return PinFacts(None, path, "the pin's experiment facts are not JSON")
    return PinFacts(Facts.from_json(document), path)
