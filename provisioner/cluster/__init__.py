"""The cluster's lifecycle: render cluster.yaml, up, status, down, the token, the tunnel."""

from __future__ import annotations

from provisioner.cluster.tunnel import tunnel
from provisioner.node.token import local_token_path, read_token

__all__ = ["local_token_path", "read_token", "tunnel"]
