# A lab node: its own sshd and its own dockerd, like a real machine.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends openssh-server docker.io iptables sudo \
      iputils-ping netcat-openbsd faketime \
 && rm -rf /var/lib/apt/lists/* \
 && rm -f /etc/ssh/ssh_host_*
# A non-root login user in the docker group, with passwordless sudo.
RUN useradd --create-home --shell /bin/bash --uid 1000 --groups docker,sudo lab \
 && echo 'lab ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/lab && chmod 0440 /etc/sudoers.d/lab
COPY sshd_config /etc/ssh/sshd_config.d/lab.conf
COPY entrypoint.sh /usr/local/sbin/lab-node
COPY delay-proxy.py /usr/local/lib/lab-delay-proxy.py
RUN chmod 0755 /usr/local/sbin/lab-node
CMD ["/usr/local/sbin/lab-node"]
