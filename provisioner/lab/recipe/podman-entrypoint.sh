#!/bin/bash
# Start a podman lab node: host keys (made on first start only), the login user's key,
# the user's Podman storage (a host directory mounted by the lab, made the user's), / as a
# shared mount (rootless Podman warns on every call otherwise), then sshd.
set -eu
ssh-keygen -A >/dev/null
install -d -m 0700 -o lab -g lab /home/lab/.ssh
install -m 0600 -o lab -g lab /lab/authorized_keys /home/lab/.ssh/authorized_keys
chown lab:lab /home/lab/.local /home/lab/.local/share /home/lab/.local/share/containers
mount --make-rshared /
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
exec sleep infinity
