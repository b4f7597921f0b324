#!/bin/bash
# provisioner doctor: everything a node must tell, in one round trip.
# Fed on stdin: bash -s -- HEAD_ADDRESS NODE_ADDRESS IMAGE_REF LISTEN_PORTS LISTEN_SECONDS [RAY_PYTHON]
#   [IMAGE_ALT] [RUN_NONCE]
# Prints sections "@@name" followed by raw command output; the control machine judges them.
# Reads only, except for one temporary listener (python3) on LISTEN_PORTS for the
# reachability probes, which exits after LISTEN_SECONDS or when killed (its command line
# ends with the word provisioner-doctor-listener, which the kill checks first; the word
# before it, provisioner-doctor-run-RUN_NONCE, names the doctor run that started it, so
# that an interrupted run ends its own listeners, and no other's).
set -u
export LC_ALL=C
head_addr=$1 node_addr=$2 image=$3 listen_ports=$4 listen_seconds=$5 ray_python=${6:-}
# the pin's ID in Docker's containerd image store, when it is not $image ("": unknown)
image_alt=${7:-}
run_nonce=${8:-}
section() { printf '\n@@%s\n' "$1"; }
has() { command -v "$1" >/dev/null 2>&1; }
with_timeout() { if has timeout; then timeout "$@"; else shift; "$@"; fi; }

# Cheap on purpose: builtins where bash has them, one fork per fact otherwise, raw output
# that the control machine parses (a doctor over 100 nodes runs this 100 times).
section clock; if [ -n "${EPOCHREALTIME:-}" ]; then echo "$EPOCHREALTIME"; else date +%s.%N; fi

# The clock goes at once (when it arrives bounds the node's clock offset); everything
# else is told in one write at the end (`facts`, below, captured): each write would be an
# SSH packet of its own that the control machine wakes up for, thousands of them over
# 100 nodes, half of its CPU in this round. (Not indented: Python inside it is.)
facts() {
#@ray-state-start
section user; id -un; id -nG
section hostname; echo "${HOSTNAME:-$(hostname)}"
section hostname_addresses; getent ahosts "${HOSTNAME:-$(hostname)}" 2>/dev/null
section addresses; ip -o addr show 2>/dev/null
section route; ip -o route get "$head_addr" 2>&1
section arch; uname -m
section cpus; nproc
section memory
while IFS= read -r line; do
  case "$line" in MemTotal:* | MemAvailable:*) echo "$line" ;; esac
done </proc/meminfo

# Python and Ray as a plain `ssh host cmd` sees them, and as Ray's launcher sees them
# (a login interactive bash). Lines of interest start with %% (rc files may print noise).
# An interpreter's answers are kept in PROVISIONER_MEMO ("FILE|KIND|VALUE" lines), so the
# login run asks again only an interpreter that is another file.
lookup() {  # the first executable NAME on PATH, in REPLY
  local IFS=: dir
  for dir in $PATH; do
    [ -n "$dir" ] && [ -f "$dir/$1" ] && [ -x "$dir/$1" ] && { REPLY=$dir/$1; return 0; }
  done
  return 1
}
ask() {  # ask KIND FILE: FILE's python version, Ray version or RLlib stack, in REPLY
  local kind=$1 file=$2 f k v
  # the same binary has one version; Ray's version depends on the path (a venv's python3
  # is a link to the system's), so for Ray only the same path counts
  while IFS='|' read -r f k v; do
    [ "$k" = "$kind" ] && [ -n "$f" ] || continue
    if [ "$file" = "$f" ] || { [ "$kind" = version ] && [ "$file" -ef "$f" ]; }; then
      REPLY=$v; return
    fi
  done <<<"${PROVISIONER_MEMO:-}"
  if [ "$kind" = version ]; then
    v=$("$file" -S -c 'import sys; print(sys.version.split()[0])' 2>/dev/null)
  elif [ "$kind" = stack ]; then  # RLlib (Ray's, when ray/rllib is there), torch, gymnasium,
    # then after a | every installed distribution as name=version (a project's packages)
    v=$("$file" -c 'import importlib.metadata as m, importlib.util as u, os
def v(d):
    try:
        return m.version(d)
    except Exception:
        return "-"
s = u.find_spec("ray")
r = s is not None and any(os.path.isdir(os.path.join(p, "rllib")) for p in s.submodule_search_locations or ())
d = sorted("%s=%s" % (x.metadata["Name"], x.version) for x in m.distributions() if x.metadata["Name"])
print("rllib=%s torch=%s gymnasium=%s|%s" % (v("ray") if r else "-", v("torch"), v("gymnasium"), " ".join(d)))' 2>/dev/null)
  else
    v=$("$file" -c 'import importlib.metadata as m; print(m.version("ray"))' 2>/dev/null)
  fi
  PROVISIONER_MEMO+="$file|$kind|$v"$'\n'
  REPLY=$v
}
pyray() {
  echo "%%path=$PATH"
  local py p line words interp
  for py in python3 python; do
    if lookup "$py"; then
      p=$REPLY; ask version "$p"; echo "%%$py=$p $REPLY"
    fi
  done
  if lookup ray; then
    echo "%%ray=$REPLY"
    IFS= read -r line <"$REPLY" || line=""
    case "$line" in
      '#!'*)
        read -r -a words <<<"${line#\#!}"
        interp=${words[0]:-}
        if [ "${interp##*/}" = env ] && lookup "${words[1]:-}"; then interp=$REPLY; fi
        if [ -n "$interp" ]; then
          echo "%%ray_interp=$interp"
          ask version "$interp"; echo "%%ray_python=$REPLY"
          ask ray "$interp"; echo "%%ray_version=$REPLY"
          ask stack "$interp"; echo "%%ray_stack=$REPLY"
        fi
        ;;
    esac
  fi
}
# The runtime's own facts (its section: `Judges.facts`, inserted here by the doctor). It may
# set runtime_root, the directory where the runtime keeps its images: its disk is told below.
runtime_root=
#@runtime-facts

# NVIDIA GPUs, their driver and the container toolkit: builtins only on a node without them.
section gpus
if lookup nvidia-smi; then
  with_timeout 10 "$REPLY" --query-gpu=index,uuid,name,memory.total,driver_version \
    --format=csv,noheader,nounits 2>&1
  echo "rc=$?"
fi
section gpu_driver
[ -r /proc/driver/nvidia/version ] && IFS= read -r line </proc/driver/nvidia/version && echo "$line"
section gpu_devices
for f in /dev/nvidia*; do [ -e "$f" ] && echo "$f"; done
section gpu_toolkit
ctk=
for tool in nvidia-ctk nvidia-container-runtime nvidia-container-runtime-hook nvidia-container-cli; do
  if lookup "$tool"; then echo "%%$tool=$REPLY"; [ -n "$ctk" ] || ctk=$REPLY; fi
done
[ -n "$ctk" ] && with_timeout 10 "$ctk" --version 2>&1 | head -n 1
section cdi
for f in /etc/cdi/*.yaml /etc/cdi/*.json /var/run/cdi/*.yaml /var/run/cdi/*.json; do
  [ -f "$f" ] && { echo "%%file=$f"; head -c 262144 "$f"; echo; }
done

# /dev/shm and the disks of the runtime's root (if it has one), /tmp and $HOME in one df.
named=()
[ -n "$runtime_root" ] && named=("$runtime_root")
named+=(/tmp "$HOME")
dirs=()
for dir in "${named[@]}"; do
  d=$dir; while [ -n "$d" ] && [ ! -e "$d" ]; do d=${d%/*}; done
  dirs+=("${d:-/}")
done
shm=()
[ -e /dev/shm ] && shm=(/dev/shm)
df_lines=()
while IFS= read -r line; do df_lines+=("$line"); done < <(df -kP ${shm[@]+"${shm[@]}"} "${dirs[@]}" 2>/dev/null)
section shm; [ ${#shm[@]} = 1 ] && echo "${df_lines[1]:-}"
section disk
i=$((1 + ${#shm[@]}))
for dir in "${named[@]}"; do
  [ -n "${df_lines[$i]:-}" ] && printf '%s %s\n' "$dir" "${df_lines[$i]}"
  i=$((i + 1))
done

section shell_plain; pyray
export PROVISIONER_MEMO
section shell_login
with_timeout 15 bash --login -i -c "$(declare -f lookup ask pyray); pyray" </dev/null 2>/dev/null | grep '^%%'

# The interpreter the inventory names for host mode (ray: {python: PATH}), if any.
section ray_python
if [ -n "$ray_python" ] && [ -x "$ray_python" ]; then
  echo "%%ray=$ray_python"; echo "%%ray_interp=$ray_python"
  ask version "$ray_python"; echo "%%ray_python=$REPLY"
  ask ray "$ray_python"; echo "%%ray_version=$REPLY"
  ask stack "$ray_python"; echo "%%ray_stack=$REPLY"
fi

# sudo, and the listening sockets with their processes (all users' with sudo).
if has sudo && listening=$(sudo -n ss -Htlnp 2>/dev/null); then
  sudo_state=ok
else
  if has sudo; then sudo_state=$(sudo -n true 2>&1 && echo ok); else sudo_state="sudo: not installed"; fi
  listening=$(ss -Htlnp 2>/dev/null)
fi
section sudo; echo "$sudo_state"
section listening; echo "$listening"
section ray_processes
ps -eo pid=,comm=,args= 2>/dev/null | awk '$2=="raylet" || $2=="gcs_server" || $2 ~ /^ray::/ {print substr($0, 1, 200)}'
# Whose each Ray process (and each listening process) is, so that the doctor can tell this
# cluster's Ray, another cluster's and a stale one apart: "PID PPID TITLE CONTAINER CLUSTER
# PORTS..." with the container (Docker's or Podman's, from its cgroup), the cluster's temp dir on its
# command line (host mode: /tmp/prov-CLUSTER, or the node directory before), and for raylet and gcs_server the ports on their command line.
section ray_owners
declare -A ppid_of=() comm_of=()
while read -r pid ppid comm; do
  ppid_of[$pid]=$ppid; comm_of[$pid]=$comm
done < <(ps -eo pid=,ppid=,comm= 2>/dev/null)
owner_pids=()
for pid in "${!comm_of[@]}"; do
  case "${comm_of[$pid]}" in raylet | gcs_server | ray::*) owner_pids+=("$pid") ;; esac
done
rest=$listening
while [[ $rest =~ pid=([0-9]+) ]]; do
  owner_pids+=("${BASH_REMATCH[1]}"); rest=${rest#*pid="${BASH_REMATCH[1]}"}
done
declare -A told=()
for pid in "${owner_pids[@]}"; do
  [ -n "${told[$pid]:-}" ] && continue
  told[$pid]=1
  cid=- cluster=- ports="" argv=() words=()
  while IFS= read -r line; do
    [[ $line =~ (docker|libpod)[-/]([0-9a-f]{64}) ]] && cid=${BASH_REMATCH[2]}
  done 2>/dev/null <"/proc/$pid/cgroup"
  mapfile -d '' -t argv 2>/dev/null <"/proc/$pid/cmdline"
  [[ "${argv[*]:-}" =~ (\.provisioner/clusters/|/tmp/prov-)([a-z0-9-]+)(/ray)?/ ]] &&
    cluster=${BASH_REMATCH[2]}
  title=${comm_of[$pid]:-?}
  case "$title" in
    ray::*) read -r title _ <<<"${argv[0]:-$title}" ;;
    raylet | gcs_server)
      read -r -a words <<<"${argv[*]:-}"
      for word in "${words[@]}"; do
        case "$word" in --*port=[0-9]* | --gcs[-_]address=*) ports+=" $word" ;; esac
      done
      ;;
  esac
  echo "$pid ${ppid_of[$pid]:-0} $title $cid $cluster$ports"
done
section ray_session; [ -e /tmp/ray/session_latest ] && ls -ld /tmp/ray/session_latest 2>/dev/null
section rsync; command -v rsync
# network filesystems (candidates for the inventory's storage: {path: DIR}): MOUNTPOINT TYPE SOURCE
section net_mounts
awk '$3 ~ /^(nfs|nfs4|cifs|smb3|lustre|gpfs|beegfs|ceph|fuse\..*)$/ {print $2, $3, $1}' /proc/mounts 2>/dev/null

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
' "$node_addr" "$listen_ports" "$listen_seconds" "provisioner-doctor-run-$run_nonce" \
  provisioner-doctor-listener
fi
#@ray-state
section end
}
told=$(facts)
printf '%s\n' "$told"
