# A SLURM lab node: the host-mode node (sshd, a virtualenv with Ray on the login shell's
# PATH) plus Debian's own SLURM and munge packages. One image for both roles: the login
# node runs slurmctld, a compute node slurmd (lab-slurm-node ROLE). slurm.conf and the
# munge key come from the lab's state folder at start.
ARG HOST_IMAGE
FROM ${HOST_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends slurm-wlm munge \
 && rm -rf /var/lib/apt/lists/*
COPY slurm-entrypoint.sh /usr/local/sbin/lab-slurm-node
RUN chmod 0755 /usr/local/sbin/lab-slurm-node
CMD ["/usr/local/sbin/lab-slurm-node", "compute"]
