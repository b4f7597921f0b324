"""What a runtime's image delivery reports (`runtime.protocol.Delivery`): per node what it did
and what it sent, and the errors, one a node. Neutral: the docker runtime's push
(`runtime.docker.push`) and the podman runtime's
`podman load` both report in it, and `up` puts it in its result as `push`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from provisioner.errors import ProvisionerError


@dataclass
class NodeDelivery:
    """What the delivery did on one node (`action`: none, the node held the image; tag,
    only its tag moved; send, image bytes went to it)."""

    host: str
    action: Literal["none", "tag", "send"]
    layers_total: int
    layers_sent: int = 0
    bytes_sent: int = 0  # image bytes sent from this machine to the node
    bytes_omitted: int = 0  # bytes of layers the node held, not sent
    seconds: float = 0.0
    attempts: int = 1
    via: str = "control"  # "control", or the node that sent it (star, chain)
    bytes_forwarded: int = 0  # chain: bytes this node sent on to other nodes
    codec: str = ""  # how the layers went from this machine: "" plain, "gz", "zst"
    compress_reason: str = ""  # why (compress.choose's line)
    cache_hits: int = 0  # layers taken compressed from this machine's cache
    cache_misses: int = 0  # layers compressed for this push (and kept in the cache)
    store: str = "classic"  # the node's image store: "classic" or "containerd"
    image_id: str = ""  # the pin's ID in that store (the containerd store: its own)
    # a cold plain send: the base image's bytes sent ahead on a channel of their own
    # (runtime.docker.direct.HeadStart; the stream in bytes_sent carries those layers too)
    head_start_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        rate = self.bytes_sent / self.seconds if self.seconds > 0 else 0.0
        return {**self.__dict__, "rate_bytes_per_s": round(rate)}


@dataclass
class DeliveryReport:
    """What the delivery of the pinned image did on every node; one node's failure is in
    `errors` and stops no other."""

    image_id: str
    tag: str
    nodes: dict[str, NodeDelivery] = field(default_factory=dict)
    errors: dict[str, ProvisionerError] = field(default_factory=dict)
    seconds: float = 0.0
    mode: str = "direct"  # how the image went: direct, star or chain

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def control_bytes(self) -> int:
        """Image bytes that left this machine (star: only those sent to the head)."""
        return sum(n.bytes_sent for n in self.nodes.values() if n.via == "control")

    @property
    def busiest_node_bytes(self) -> int:
        """The most bytes one node sent on to others (chain; 0 otherwise)."""
        return max((n.bytes_forwarded for n in self.nodes.values()), default=0)

    def to_json(self) -> dict[str, Any]:
        return {
            "image_id": self.image_id,
            "tag": self.tag,
            "mode": self.mode,
            "ok": self.ok,
            "control_bytes": self.control_bytes,
            "busiest_node_bytes": self.busiest_node_bytes,
            "seconds": round(self.seconds, 1),
            "nodes": [n.to_json() for n in self.nodes.values()],
            "errors": [
                {
                    "host": host,
                    "message": str(err),
                    "fix": err.fix,
                    "kind": getattr(err, "kind", ""),
                }
                for host, err in self.errors.items()
            ],
        }
