#!/bin/bash
# provisioner doctor: everything a node must tell, in one round trip.
# Fed on stdin: bash -s -- HEAD_ADDRESS NODE_ADDRESS IMAGE_REF LISTEN_PORTS LISTEN_SECONDS
# Prints sections "@@name" followed by raw command output; the control machine judges them.
# Reads only, except for one temporary listener (python3) on LISTEN_PORTS for the
# reachability probes, which exits after LISTEN_SECONDS or when killed.
set -u
export LC_ALL=C
head_addr=$1 node_addr=$2 image=$3 listen_ports=$4 listen_seconds=$5
section() { printf '\n@@%s\n' "$1"; }
has() { command -v "$1" >/dev/null 2>&1; }
with_timeout() { if has timeout; then timeout "$@"; else shift; "$@"; fi; }

section clock; date +%s.%N
section user; id -un; id -nG
section hostname; hostname
section hostname_addresses; getent ahosts "$(hostname)" 2>/dev/null | awk '{print $1}' | sort -u
section addresses; ip -o addr show 2>/dev/null | awk '{print $4}'
section route; ip -o route get "$head_addr" 2>&1 | head -1
section arch; uname -m
section cpus; nproc
section memory; grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
section shm; df -kP /dev/shm 2>/dev/null | tail -n +2
section sudo; if has sudo; then sudo -n true 2>&1 && echo ok; else echo "sudo: not installed"; fi

section docker
if has docker; then
  with_timeout 10 docker version --format '{{.Server.Version}}' 2>&1; echo "rc=$?"
else
  echo "docker: command not found"; echo "rc=127"
fi
section docker_sudo
if has docker && ! docker version >/dev/null 2>&1 && has sudo; then
  with_timeout 10 sudo -n docker version --format '{{.Server.Version}}' 2>&1; echo "rc=$?"
fi
section docker_socket; ls -ln /var/run/docker.sock 2>&1
section docker_root; with_timeout 10 docker info --format '{{.DockerRootDir}}' 2>/dev/null
docker_root=$(with_timeout 10 docker info --format '{{.DockerRootDir}}' 2>/dev/null || echo /var/lib/docker)
section disk
for dir in "$docker_root" /tmp "$HOME"; do
  d=$dir; while [ ! -e "$d" ]; do d=$(dirname "$d"); done
  printf '%s ' "$dir"; df -kP "$d" 2>/dev/null | tail -n +2
done
section containers
with_timeout 10 docker ps -a --format '{{.Names}}\t{{.Image}}\t{{.State}}\t{{.Label "provisioner.cluster"}}' 2>/dev/null
section image
if [ -n "$image" ]; then
  with_timeout 10 docker image inspect --format '{{.Id}} {{.Os}}/{{.Architecture}}' "$image" 2>/dev/null
fi

# Python and Ray as a plain `ssh host cmd` sees them, and as Ray's launcher sees them
# (a login interactive bash). Lines of interest start with %% (rc files may print noise).
pyray() {
  echo "%%path=$PATH"
  local p r line interp
  for py in python3 python; do
    if p=$(command -v "$py"); then
      echo "%%$py=$p $("$p" -c 'import platform; print(platform.python_version())' 2>/dev/null)"
    fi
  done
  if r=$(command -v ray); then
    echo "%%ray=$r"
    IFS= read -r line < "$r" || line=""
    case "$line" in
      '#!'*)
        interp=${line#\#!}
        # shellcheck disable=SC2086
        echo "%%ray_python=$($interp -c 'import platform; print(platform.python_version())' 2>/dev/null)"
        echo "%%ray_version=$($interp -c 'import importlib.metadata as m; print(m.version("ray"))' 2>/dev/null)"
        ;;
    esac
  fi
}
section shell_plain; pyray
section shell_login
with_timeout 15 bash --login -i -c "$(declare -f pyray); pyray" </dev/null 2>/dev/null | grep '^%%'

section listening
{ sudo -n ss -Htlnp 2>/dev/null || ss -Htlnp 2>/dev/null; } | awk '{print $4, $6}'
section ray_processes
ps -eo pid=,comm=,args= 2>/dev/null | awk '$2=="raylet" || $2=="gcs_server" || $2 ~ /^ray::/' | cut -c1-200
section ray_session; ls -ld /tmp/ray/session_latest 2>/dev/null
section rsync; command -v rsync

section listener
if [ -n "$listen_ports" ] && has python3; then
  python3 -c '
import os, select, socket, sys, time
address, ports, lifetime = sys.argv[1], sys.argv[2].split(","), float(sys.argv[3])
socks = []
for port in ports:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        try:
            s.bind((address, int(port)))
        except OSError as exc:
            if exc.errno != 99:  # EADDRNOTAVAIL: the address is not on this node (NAT)
                raise
            s.bind(("", int(port)))
        s.listen(64)
        socks.append(s)
        print("bound", port)
    except OSError as exc:
        print("busy", port, exc.errno)
        s.close()
sys.stdout.flush()
if not socks:
    sys.exit(0)
pid = os.fork()
if pid:
    print("pid", pid)
    sys.exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
end = time.monotonic() + lifetime
while time.monotonic() < end:
    ready, _, _ = select.select(socks, [], [], max(0.0, end - time.monotonic()))
    for s in ready:
        try:
            s.accept()[0].close()
        except OSError:
            pass
' "$node_addr" "$listen_ports" "$listen_seconds"
fi
section end
