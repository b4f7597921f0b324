"""The lab's login key: an Ed25519 pair made locally, private half mode 0600."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


def ensure_keypair(private: Path, comment: str) -> str:
    """Create the key pair if missing; return the public key line (OpenSSH format)."""
    public = private.with_name(private.name + ".pub")
    if not private.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        pub = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        public.write_text(f"{pub.decode()} {comment}\n")
    os.chmod(private, 0o600)
    return public.read_text().strip()
