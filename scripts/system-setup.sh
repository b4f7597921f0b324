#!/usr/bin/env bash
# What `make demo`, `make test` and .ci/run need from the system, in one place:
# Debian packages (docker.io, debootstrap, iproute2, openssh-client, rsync, iptables, make,
# python3-venv, docker-compose, zstd and pigz: the push's compressors; ffmpeg: the tests
# check `eval --video`'s MP4s with its ffprobe) and a Docker engine that answers. As root on Debian it installs and starts
# what is missing; anywhere else it prints the exact commands to run and exits 1.
set -euo pipefail

need=()
for pair in docker:docker.io dockerd:docker.io debootstrap:debootstrap ip:iproute2 \
            ssh:openssh-client rsync:rsync iptables:iptables make:make zstd:zstd pigz:pigz \
            ffprobe:ffmpeg; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
# SageMaker's local mode (`provisioner sagemaker run`) runs compose: v2 if there, else v1
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 \
  || need+=(docker-compose)
mapfile -t need < <(printf '%s\n' "${need[@]}" | sed '/^$/d' | sort -u)

can_install=0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then can_install=1; fi

if [ ${#need[@]} -gt 0 ]; then
  if [ $can_install = 1 ]; then
    echo "installing: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${need[@]}"
  else
    echo "missing packages: ${need[*]}"
    echo "run as root on Debian/Ubuntu:"
    echo "  apt-get update && apt-get install -y --no-install-recommends ${need[*]}"
    exit 1
  fi
fi

if ! docker info >/dev/null 2>&1; then
  if [ $can_install = 1 ] || [ "$(id -u)" = 0 ]; then
    echo "starting dockerd (log: /var/log/dockerd.log)"
    nohup dockerd >/var/log/dockerd.log 2>&1 </dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /var/log/dockerd.log; exit 1; }
  else
    echo "no Docker engine answers, and this is not root: start it as root with"
    echo "  systemctl start docker     # or: dockerd >/var/log/dockerd.log 2>&1 &"
    echo "and make sure $(id -un) may use it (usermod -aG docker $(id -un), then log in again)"
    exit 1
  fi
fi
