# A lab node for the podman runtime: its own sshd and rootless Podman for a login user who
# is in no docker group and has no sudo (Docker is not even installed): the shared machine
# whose administrator refuses the docker group, which is root on the node.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# uidmap: newuidmap/newgidmap; runc: crun refuses the hybrid cgroup layout of hosts like this
# one (cgroup v1 with controllers on the v2 mount); catatonit: Podman's pause process.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server podman uidmap runc catatonit \
      slirp4netns iputils-ping netcat-openbsd \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_*
# The login user: subordinate IDs from useradd (/etc/subuid, /etc/subgid), no groups.
RUN useradd --create-home --shell /bin/bash --uid 1000 lab \
 && mkdir -p /home/lab/.local/share/containers && chown -R lab:lab /home/lab/.local
# What an administrator sets up for rootless Podman on a node without systemd: cgroupfs,
# events in a file, runc, overlay storage (the user's store is a host directory, see
# lab/config.py: native overlay needs a filesystem that is not itself overlay).
RUN mkdir -p /etc/containers \
 && printf '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n' \
      > /etc/containers/containers.conf \
 && printf '[storage]\ndriver = "overlay"\n' > /etc/containers/storage.conf
# Lingering on, as `loginctl enable-linger lab` records it (the lab has no systemd to ask):
# the doctor's podman.linger reads this file; a test removes it on one node.
RUN mkdir -p /var/lib/systemd/linger && touch /var/lib/systemd/linger/lab
COPY sshd_config /etc/ssh/sshd_config.d/lab.conf
COPY podman-entrypoint.sh /usr/local/sbin/lab-node
RUN chmod 0755 /usr/local/sbin/lab-node
CMD ["/usr/local/sbin/lab-node"]
