"""provisioner: from an inventory of machines you own to a verified Ray cluster."""

__version__ = "0.1.0"
