"""Kinds of lab node (`lab up --flavours`): which Debian release a node runs and how its
Docker stores images. Pure: the names, what each means, and the per-node list."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.errors import InputError


@dataclass(frozen=True)
class Flavour:
    """One kind of lab node, everything from Debian's packages."""

    name: str
    suite: str  # the Debian release its base is debootstrapped from
    # Docker's containerd image store on (/etc/docker/daemon.json), not the classic one
    containerd_store: bool
    about: str
    python: str = "3.11"  # the system Python (host mode's virtualenv is made from it)


FLAVOURS: dict[str, Flavour] = {
    f.name: f
    for f in (
        Flavour(
            "bookworm",
            "bookworm",
            False,
            "Debian 12: Docker 20.10, Python 3.11, Slurm 22.05, Podman 4.3",
        ),
        Flavour("trixie", "trixie", False, "Debian 13: Docker 26, Python 3.13", "3.13"),
        Flavour(
            "trixie+containerd",
            "trixie",
            True,
            "Debian 13 with Docker's containerd image store on",
            "3.13",
        ),
    )
}
DEFAULT_FLAVOUR = "bookworm"
# What a node of each Debian release installs on top of the common recipe (node.Dockerfile,
# then node-release.Dockerfile): from trixie on, the docker client is a package of its own
# (docker.io only recommends it).
RELEASE_PACKAGES: dict[str, tuple[str, ...]] = {"bookworm": (), "trixie": ("docker-cli",)}
# What a host-mode node of each Debian release adds to its virtualenv from Debian's packages
# (host-release.Dockerfile): trixie's Python 3.13 has no CPU build of torch on the lab's
# package indexes, so Debian's own torch (2.6) is linked in.
HOST_PACKAGES: dict[str, tuple[str, ...]] = {"bookworm": (), "trixie": ("python3-torch",)}


def _fix() -> str:
    names = ", ".join(FLAVOURS)
    return (
        f"give one of {names} for all nodes, or one per node separated by commas "
        "(e.g. --flavours bookworm,trixie,trixie+containerd)"
    )


def parse_flavours(text: str) -> tuple[str, ...]:
    """The flavours named in `--flavours` (comma-separated, as given; not yet per node)."""
    names = tuple(part.strip() for part in text.split(","))
    if not text.strip() or any(not n for n in names):
        raise InputError(f"--flavours {text!r} has an empty entry", _fix())
    unknown = [n for n in names if n not in FLAVOURS]
    if unknown:
        raise InputError(f"unknown lab flavour {unknown[0]!r} in --flavours {text!r}", _fix())
    return names


def per_node(flavours: tuple[str, ...], count: int) -> tuple[str, ...]:
    """One flavour per node: a single entry is every node's, else one entry per node."""
    if len(flavours) == 1:
        return flavours * count
    if len(flavours) != count:
        raise InputError(
            f"--flavours names {len(flavours)} flavours for {count} nodes",
            _fix() + f"; a lab of {count} nodes takes 1 or {count} entries",
        )
    return flavours


def suites(flavours: tuple[str, ...]) -> tuple[str, ...]:
    """The Debian releases the flavours need, each once, in order."""
    return tuple(dict.fromkeys(FLAVOURS[f].suite for f in flavours))
