# A lab node of a later Debian release: the node image plus what that release splits into
# packages of its own (trixie: the docker client, docker-cli, which docker.io only recommends).
ARG NODE_IMAGE
FROM ${NODE_IMAGE}
ARG RELEASE_PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${RELEASE_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*
