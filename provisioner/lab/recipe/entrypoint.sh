#!/bin/bash
# Start a lab node: host keys (made on first start only, so they survive restarts),
# the login user's key, sshd, then dockerd.
set -eu
ssh-keygen -A >/dev/null
install -d -m 0700 -o lab -g lab /home/lab/.ssh
install -m 0600 -o lab -g lab /lab/authorized_keys /home/lab/.ssh/authorized_keys
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
# A node that was stopped keeps its old pid files and sockets: clear them so dockerd starts.
rm -rf /var/run/docker.pid /var/run/docker /run/containerd
dockerd >/var/log/dockerd.log 2>&1 &
exec sleep infinity
