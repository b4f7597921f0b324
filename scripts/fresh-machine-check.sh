#!/usr/bin/env bash
# Does `make demo` complete, with no hand step, on a fresh machine? This script makes one
# and tries. Not part of `make test`: it took 13 to 15 minutes and 16.5 GB of disk at its
# peak on a 2-core machine (the time of each phase is printed).
#
#   scripts/fresh-machine-check.sh [--commit REV] [--make "TARGETS"] [--keep]
#
# Run it as root on a Debian machine with a Docker engine and debootstrap (a developer's
# machine that already runs `make demo`). It
#   1. rootfs:  debootstrap's minimal Debian bookworm (--variant=minbase) with ONLY what a
#               fresh machine of the kind the project is built on has, and `make demo` does
#               not install itself (see "What is pre-installed" below);
#   2. import:  `docker import` of that root filesystem as a throw-away image;
#   3. start:   a container of it with the lab's flags for a node that runs its own dockerd
#               (every capability but CAP_SYS_RESOURCE, no seccomp/apparmor, the cgroup tree
#               read-write: `--privileged` fails where the bounding set lacks
#               CAP_SYS_RESOURCE), its /var/lib/docker and /root on a host directory under
#               a temporary folder (overlay2 inside dockerd does not work on overlay);
#   4. clone:   a fresh `git clone` of the commit (default: HEAD of the repository this
#               script is in) into /root/provisioner in the container: no .venv, no
#               images/.wheelhouse, no images/image.lock.json;
#   5. make:    `make demo` there, as root: system-setup.sh installs docker.io, debootstrap,
#               iptables, rsync, openssh-client, iproute2... and starts dockerd; `make install`
#               builds the virtualenv; scripts/demo.py brings a 3-node lab up (nested: each
#               node runs its own dockerd), builds the image, starts Ray, trains PPO, plots,
#               and takes it all down;
#   6. checks:  exit 0, results/*/metrics.csv and results/*/training.png present, no lab
#               container, network or state directory left in the container.
# It prints the time of each phase (make's own phases: system-setup, make install, the
# demo's steps), the disk the container used at its peak, and PASS or FAIL. Everything it
# made (container, image, temporary folder, cgroups of nested containers killed with it) is
# removed at the end, on failure and on Ctrl-C too; then it checks that the host's bridges
# and iptables rules are as they were. The full log goes to $FRESH_LOG (default
# build/fresh-machine-check.log in this repository).
#
# What is pre-installed in the container, and why (nothing else is):
#   - python3, python3-venv, python3-pip: the machine comes with CPython 3.11, pip and venv;
#   - git: the machine has it, and the clone is a git checkout;
#   - make: the machine has GNU Make, and `make demo` cannot install `make` before it runs;
#   - ca-certificates, plus this machine's own CA certificates (/usr/local/share/
#     ca-certificates: the package index is reached through a proxy whose CA is there);
#   - this machine's APT sources (/etc/apt/sources.list.d) and pip configuration
#     (/etc/pip.conf, /etc/xdg/pip, root's pip.conf, the PIP_* environment), and, bind-mounted
#     read-only, the local folders that configuration names (find-links, file:// indexes;
#     here one holds the CPU build of torch 2.13.0): all part of the machine, not of the
#     project.
# gcc is on such a machine too but is left out on purpose: nothing `make demo` installs may
# need a compiler. NOT there, and left to `make demo`: docker.io (client and engine),
# debootstrap, iptables, iproute2, openssh-client, rsync, procps, the virtualenv, the
# wheelhouse and every image.
#
# Options: --commit REV (what to clone), --make "TARGETS" (run `make TARGETS` instead of
# `make demo`, e.g. "prereqs install"; the demo's checks are then skipped), --keep (leave the
# container and its folder for a look; the command that removes them is printed).
# Environment: FRESH_TMPDIR (where the temporary folder goes, default /var/tmp; it must
# not be on overlayfs), FRESH_DISK_LIMIT_GB (stop when the container's files pass this,
# default 25), FRESH_TIMEOUT_S (stop `make` after this, default 3600),
# PROVISIONER_DEBIAN_MIRROR (the mirror for debootstrap; default: the one this machine's
# APT uses).
set -euo pipefail

REPO=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
REV=HEAD
MAKE_TARGETS=demo
KEEP=0
while [ $# -gt 0 ]; do
  case "$1" in
    --commit) REV=${2:?--commit needs a revision}; shift 2 ;;
    --make) MAKE_TARGETS=${2:?--make needs targets}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "fresh-machine-check: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (it starts a container with its own dockerd)"
command -v debootstrap >/dev/null || die "needs debootstrap: apt-get install -y debootstrap"
docker info >/dev/null 2>&1 || die "needs a Docker engine that answers (docker info)"
COMMIT=$(git -C "$REPO" rev-parse --verify --quiet "$REV^{commit}") || die "no commit $REV in $REPO"

SUITE=bookworm
PACKAGES=python3,python3-venv,python3-pip,git,make,ca-certificates
ID=$(date +%s)-$$
NAME=provisioner-fresh-$ID
IMAGE=provisioner-fresh:$ID
DISK_LIMIT_GB=${FRESH_DISK_LIMIT_GB:-25}
TIMEOUT_S=${FRESH_TIMEOUT_S:-3600}
LOG=${FRESH_LOG:-$REPO/build/fresh-machine-check.log}
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
TMP=$(mktemp -d "${FRESH_TMPDIR:-/var/tmp}/provisioner-fresh.XXXXXX")
[ "$(stat -f -c %T "$TMP")" != overlayfs ] || die "$TMP is on overlayfs: set FRESH_TMPDIR"
mkdir -p "$TMP/docker" "$TMP/root"

say() { echo "[fresh $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
PHASES=()
T0=$SECONDS
phase_start=$SECONDS
phase() {  # phase NAME: the time since the last mark goes to NAME
  PHASES+=("$(printf '%-42s %6ds' "$1" $((SECONDS - phase_start)))")
  phase_start=$SECONDS
}

host_net() {  # the host's bridges and iptables rules (counters left out)
  ip -o link show type bridge 2>/dev/null | awk -F': ' '{print "bridge " $2}' | sort
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' | sort
}
host_net >"$TMP.net-before"

MONITOR=
BACKGROUND=
CLEANED=0
kill_tree() {  # a process and everything under it, by pid
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill -TERM "$1" 2>/dev/null
}
cleanup() {
  local rc=$?
  [ $CLEANED = 1 ] && return
  CLEANED=1
  trap - INT TERM EXIT
  set +e
  [ -n "$MONITOR" ] && { kill "$MONITOR"; wait "$MONITOR"; } 2>/dev/null
  [ -n "$BACKGROUND" ] && { kill_tree "$BACKGROUND"; wait "$BACKGROUND"; } 2>/dev/null
  if [ $KEEP = 1 ]; then
    say "kept: container $NAME, image $IMAGE, folder $TMP; remove them with:"
    say "  docker rm -f $NAME; docker rmi $IMAGE; rm -rf $TMP $TMP.*"
    exit $rc
  fi
  say "cleaning up"
  local nested=()
  if docker inspect "$NAME" >/dev/null 2>&1; then
    # Containers still running inside (a failed or interrupted demo), and inside those: they
    # die with this container, but their cgroups (the host's tree, bind-mounted) stay behind.
    mapfile -t nested < <(docker exec "$NAME" sh -c '
      command -v docker >/dev/null || exit 0
      for c in $(docker ps -q --no-trunc); do
        echo "$c"; docker exec "$c" sh -c "docker ps -q --no-trunc 2>/dev/null" 2>/dev/null
      done' 2>/dev/null || true)
    [ ${#nested[@]} -gt 0 ] && say "${#nested[@]} nested container(s) still running; they go with it"
    docker rm -f "$NAME" >/dev/null 2>&1 || true
  fi
  docker image rm -f "$IMAGE" >/dev/null 2>&1 || true
  local id dir left=0
  for id in "${nested[@]}"; do
    [ -n "$id" ] || continue
    for dir in /sys/fs/cgroup/*/docker/"$id" /sys/fs/cgroup/*/*/docker/"$id"; do
      [ -d "$dir" ] || continue
      for _ in 1 2 3 4 5; do rmdir "$dir" 2>/dev/null && break; sleep 1; done
      [ -d "$dir" ] && { say "cgroup left: $dir"; left=1; }
    done
  done
  rm -rf "$TMP"
  host_net >"$TMP.net-after"
  if diff -q "$TMP.net-before" "$TMP.net-after" >/dev/null; then
    say "host bridges and iptables rules: as before"
  else
    # This check adds none to the host (its nested engines have their own network
    # namespace): a change is another user's, named by the docker network it belongs to.
    say "host bridges or iptables rules changed while this ran, by others (not this check's):"
    local line net
    diff "$TMP.net-before" "$TMP.net-after" | sed -n 's/^\([<>]\) bridge \(.*\)/\1 \2/p' \
      | while read -r line net; do
          [ "$line" = ">" ] && line=added || line=removed
          say "  bridge $net $line ($(docker network ls --no-trunc -q -f "id=${net#br-}" \
            --format '{{.Name}}' 2>/dev/null | head -1 || true))"
        done
    say "  and $(diff "$TMP.net-before" "$TMP.net-after" | grep -c '^[<>] -A') iptables rule(s)"
  fi
  rm -f "$TMP.net-before" "$TMP.net-after" "$TMP.disk" "$TMP.make-pid"
  [ $left = 0 ] || rc=1
  [ -e "$TMP" ] && { say "could not remove $TMP"; rc=1; }
  docker inspect "$NAME" >/dev/null 2>&1 && { say "container $NAME still there"; rc=1; }
  exit $rc
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM

say "commit $COMMIT of $REPO; temporary folder $TMP; log $LOG"
say "disk before: $(df -h --output=size,used,avail,target "$TMP" | tail -1)"
free_kb=$(df -k --output=avail "$TMP" | tail -1)
[ "$free_kb" -gt $(((DISK_LIMIT_GB + 5) * 1024 * 1024)) ] \
  || die "less than $((DISK_LIMIT_GB + 5)) GB free where $TMP is: the container may take $DISK_LIMIT_GB GB"

# --- 1. rootfs
mirror=${PROVISIONER_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security \
           | awk '{print $2; exit}' || true)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk -v s=$SUITE '$1=="deb" && $0 ~ " "s" " {for(i=2;i<=NF;i++) if($i ~ /^[a-z]+:\/\//){print $i; exit}}' /etc/apt/sources.list)
fi
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt: set PROVISIONER_DEBIAN_MIRROR"
ROOTFS=$TMP/rootfs
say "debootstrap $SUITE from $mirror with $PACKAGES (a minute or two)"
# In the background, so that Ctrl-C stops the script at once (the trap waits for no
# foreground command) and the clean-up stops debootstrap.
nice debootstrap --variant=minbase --include=$PACKAGES $SUITE "$ROOTFS" "$mirror" >>"$LOG" 2>&1 &
BACKGROUND=$!
wait $BACKGROUND || { tail -5 "$LOG"; die "debootstrap failed (log: $LOG)"; }
BACKGROUND=
# The machine's own configuration: APT sources, CA certificates, pip's configuration.
if compgen -G '/etc/apt/sources.list.d/*' >/dev/null; then
  cp -a /etc/apt/sources.list.d/. "$ROOTFS/etc/apt/sources.list.d/"
  rm -f "$ROOTFS/etc/apt/sources.list"
fi
if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
  cp -a /usr/local/share/ca-certificates/. "$ROOTFS/usr/local/share/ca-certificates/"
  chroot "$ROOTFS" update-ca-certificates >>"$LOG" 2>&1
fi
[ -f /etc/pip.conf ] && cp -a /etc/pip.conf "$ROOTFS/etc/pip.conf"
[ -d /etc/xdg/pip ] && mkdir -p "$ROOTFS/etc/xdg" && cp -a /etc/xdg/pip "$ROOTFS/etc/xdg/"
if [ -f /root/.config/pip/pip.conf ]; then
  mkdir -p "$TMP/root/.config/pip" && cp -a /root/.config/pip/pip.conf "$TMP/root/.config/pip/"
fi
cp -a "$ROOTFS/etc/skel/." "$TMP/root/" 2>/dev/null || true
: >"$ROOTFS/etc/resolv.conf"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
phase "1. rootfs (debootstrap, machine config)"

# --- 2. import
tar -C "$ROOTFS" -c . | docker import -c 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
rm -rf "$ROOTFS"
phase "2. docker import"

# --- 3. start
# The local folders pip's configuration names (find-links, index URLs as file://), read
# from pip itself and from the PIP_* environment: mounted read-only at the same paths.
mounts=()
while read -r dir; do
  [ -d "$dir" ] && mounts+=(-v "$dir:$dir:ro")
done < <(
  { python3 -m pip config list 2>/dev/null | cut -d= -f2-; env | grep -E '^PIP_' | cut -d= -f2-; } |
    tr -d "'\"" | tr ' ' '\n' | sed -n -e 's#^file://##' -e 's#/simple/*$##' -e '\#^/#p' |
    sort -u
)
envs=()
# pip's settings in the environment are the machine's too; PYTHONUNBUFFERED keeps the
# time stamps on the log's lines true (a pipe would buffer Python's output).
while IFS='=' read -r key _; do envs+=(-e "$key"); done < <(env | grep -E '^PIP_[A-Z_]+=' || true)
envs+=(-e PYTHONUNBUFFERED=1)
docker run -d --name "$NAME" --hostname fresh --init \
  --cap-add ALL --cap-drop SYS_RESOURCE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
  --security-opt systempaths=unconfined \
  -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
  -v "$TMP/docker:/var/lib/docker" -v "$TMP/root:/root" "${mounts[@]}" "${envs[@]}" \
  -e HOME=/root -w /root "$IMAGE" sleep infinity >/dev/null
missing=$(docker exec "$NAME" sh -c 'for t in docker dockerd debootstrap iptables rsync ssh ip; do
  command -v $t >/dev/null || printf "%s " $t; done')
say "in the container: $(docker exec "$NAME" python3 --version), absent: ${missing:-nothing}"
phase "3. container start"

# --- 4. clone
git clone --quiet --no-checkout "$REPO" "$TMP/root/provisioner"
git -C "$TMP/root/provisioner" checkout --quiet --detach "$COMMIT"
git -C "$TMP/root/provisioner" remote remove origin
phase "4. git clone"

# --- disk: the container's files (its folder and its writable layer), every 30 s
upper=$(docker inspect -f '{{.GraphDriver.Data.UpperDir}}' "$NAME")
echo 0 >"$TMP.disk"
disk_kb() {  # files vanish while du walks them: its exit code means nothing here
  { du -sxk "$TMP" "$upper" 2>/dev/null || true; } | awk '{s+=$1} END {print s+0}'
}
(
  set +e
  while sleep 30; do
    kb=$(disk_kb)
    [ "$kb" -gt "$(cat "$TMP.disk")" ] && echo "$kb" >"$TMP.disk"
    free_kb=$(df -k --output=avail "$TMP" | tail -1)
    if [ "$kb" -gt $((DISK_LIMIT_GB * 1024 * 1024)) ] || [ "$free_kb" -lt $((5 * 1024 * 1024)) ]; then
      echo "[fresh] the container's files passed ${DISK_LIMIT_GB} GB, or the disk has less than 5 GB free: stopping" >&2
      kill -TERM "$(cat "$TMP.make-pid" 2>/dev/null)" $$ 2>/dev/null; exit
    fi
  done
) &
MONITOR=$!

# --- 5. make demo, each line stamped; make's own command lines mark its phases
say "make $MAKE_TARGETS (as root in /root/provisioner)"
stamp() {
  local line mark=system-setup
  while IFS= read -r line; do
    printf '%s %s\n' "$(date -u +%H:%M:%S)" "$line"
    case "$line" in
      "python3 -m venv"*|".venv/bin/pip install"*)
        [ "$mark" = system-setup ] && { echo "@mark $SECONDS scripts/system-setup.sh"; mark=install; } ;;
      ".venv/bin/python scripts/demo.py"*)
        case $mark in
          system-setup) echo "@mark $SECONDS scripts/system-setup.sh" ;;
          install) echo "@mark $SECONDS make install" ;;
        esac
        mark=demo ;;
    esac
  done
  case $mark in
    system-setup) echo "@mark $SECONDS scripts/system-setup.sh" ;;
    install) echo "@mark $SECONDS make install" ;;
    demo) echo "@mark $SECONDS scripts/demo.py (steps above)" ;;
  esac
}
set +e
# (its pid in a file: the disk watch stops it; a signal to this shell waits for the pipe)
sh -c 'echo $$ >"$1"; shift; exec "$@"' - "$TMP.make-pid" timeout --foreground "$TIMEOUT_S" \
  docker exec -w /root/provisioner "$NAME" make $MAKE_TARGETS 2>&1 \
  | stamp | tee -a "$LOG" | grep -v '^@mark'
rc=${PIPESTATUS[0]}
set -e
make_start=$phase_start
while read -r _ end what; do
  PHASES+=("$(printf '%-42s %6ds' "5. $what" $((end - make_start)))")
  make_start=$end
done < <(grep '^@mark' "$LOG")
phase_start=$SECONDS

# --- 6. checks
fail=()
[ "$rc" = 0 ] || fail+=("make $MAKE_TARGETS exited $rc")
if [ "$MAKE_TARGETS" = demo ]; then
  results=$(docker exec -w /root/provisioner "$NAME" sh -c \
    'ls results/*/metrics.csv results/*/training.png 2>/dev/null' || true)
  echo "$results" | grep -q 'metrics.csv$' || fail+=("no results/*/metrics.csv")
  echo "$results" | grep -q 'training.png$' || fail+=("no results/*/training.png")
  left=$(docker exec "$NAME" sh -c 'docker ps -aq --filter label=io.provisioner.lab;
    docker network ls -q --filter label=io.provisioner.lab;
    ls -d /root/.local/state/provisioner/lab-* 2>/dev/null' || true)
  [ -z "$left" ] || fail+=("a lab is left: $(echo $left)")
  [ -n "$results" ] && say "results: $(echo $results)"
fi
phase "6. checks"

peak_kb=$(cat "$TMP.disk")
now_kb=$(disk_kb)
[ "$now_kb" -gt "$peak_kb" ] && peak_kb=$now_kb
say "phases:"
for p in "${PHASES[@]}"; do say "  $p"; done
say "  $(printf '%-42s %6ds' total $((SECONDS - T0)))"
say "container's disk: peak $((peak_kb / 1024 / 1024)).$(((peak_kb / 1024 % 1024) * 10 / 1024)) GB (sampled every 30 s), at the end $((now_kb / 1024 / 1024)) GB; host: $(df -h --output=avail "$TMP" | tail -1) free"
if [ ${#fail[@]} -eq 0 ]; then
  say "PASS: make $MAKE_TARGETS on a fresh $SUITE machine, commit ${COMMIT:0:12}"
else
  for f in "${fail[@]}"; do say "FAIL: $f"; done
  exit 1
fi
