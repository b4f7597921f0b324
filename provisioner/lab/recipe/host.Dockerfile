# A lab node for host mode: the node image plus a virtualenv with Ray, RLlib and torch,
# built offline from the locked wheels, as people set Ray up on their own machines. The
# virtualenv is activated from ~/.profile, so `ray` is on the PATH of a login shell only
# (`ssh node ray` does not find it), as in the blog post this project answers.
ARG NODE_IMAGE
FROM ${NODE_IMAGE} AS venv
COPY wheels/ /tmp/wheels/
COPY requirements.lock /tmp/requirements.lock
USER lab
RUN python3 -m venv /home/lab/ray-venv \
 && /home/lab/ray-venv/bin/python -m pip install --no-cache-dir --no-index \
      --find-links /tmp/wheels --require-hashes --only-binary=:all: -r /tmp/requirements.lock \
 && /home/lab/ray-venv/bin/python -m pip check

FROM ${NODE_IMAGE}
COPY --from=venv --chown=lab:lab /home/lab/ray-venv /home/lab/ray-venv
RUN printf '\n# Ray for host mode: the virtualenv, for login shells only\n. "$HOME/ray-venv/bin/activate"\n' >> /home/lab/.profile \
 && chown lab:lab /home/lab/.profile
ENV RAY_USAGE_STATS_ENABLED=0
