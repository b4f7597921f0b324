"""The cluster's lifecycle: render cluster.yaml, up, status, down, the token, the tunnel."""

from __future__ import annotations

from provisioner.cluster.token import local_token_path, read_token
from provisioner.cluster.tunnel import tunnel

__all__ = ["local_token_path", "read_token", "tunnel"]
