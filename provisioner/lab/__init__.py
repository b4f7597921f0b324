"""The lab: several real nodes (containers with their own sshd and dockerd) on one machine."""
