# A lab node whose Docker keeps its images in containerd's image store (the default of
# fresh Docker installs since 29), not the classic graph-driver store.
ARG NODE_IMAGE
FROM ${NODE_IMAGE}
COPY containerd-daemon.json /etc/docker/daemon.json
