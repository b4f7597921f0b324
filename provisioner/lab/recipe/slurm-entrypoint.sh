#!/bin/bash
# Start a SLURM lab node: munge with the lab's key, then slurmctld (login) or slurmd
# (compute), then the lab node's own start (host keys, sshd, dockerd). A compute node
# refuses SSH from the control machine: it is reached through the login node only.
set -eu
role=${1:-compute}
install -o munge -g munge -m 0400 /lab/munge.key /etc/munge/munge.key
install -m 0644 /lab/slurm.conf /etc/slurm/slurm.conf
install -d -o munge -g munge -m 0755 /run/munge
rm -f /run/munge/munged.pid
su -s /bin/sh munge -c /usr/sbin/munged
install -d -o slurm -g slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ "$role" = login ]; then
  /usr/sbin/slurmctld -L /var/log/slurm/slurmctld.log
else
  gateway=$(ip route | awk '/^default/ {print $3; exit}')
  iptables -C INPUT -p tcp --dport 22 -s "$gateway" -j DROP 2>/dev/null \
    || iptables -I INPUT -p tcp --dport 22 -s "$gateway" -j DROP
  /usr/sbin/slurmd -L /var/log/slurm/slurmd.log
fi
exec /usr/local/sbin/lab-node
