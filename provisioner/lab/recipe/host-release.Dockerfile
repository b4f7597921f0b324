# A host-mode lab node of a Debian release whose Python has no CPU build of torch on the
# lab's package indexes (trixie: CPython 3.13): Debian's own torch (python3-torch) made
# visible to the virtualenv, its package and metadata linked into site-packages.
ARG HOST_IMAGE
FROM ${HOST_IMAGE}
ARG PYTHON
ARG HOST_PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${HOST_PACKAGES} \
 && rm -rf /var/lib/apt/lists/* \
 && site=/home/lab/ray-venv/lib/python${PYTHON}/site-packages \
 && for d in /usr/lib/python3/dist-packages/torch /usr/lib/python3/dist-packages/torchgen \
      /usr/lib/python3/dist-packages/torch-*-info; do \
      ln -s "$d" "$site/"; done \
 && su lab -c "/home/lab/ray-venv/bin/python -c 'import torch; print(torch.__version__)'"
