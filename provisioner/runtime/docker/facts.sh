# The docker runtime's section of the doctor's facts script (runtime/docker/doctor.py):
# run inside provisioner/doctor/facts.sh (with its `has`, `lookup`, `with_timeout`,
# PROVISIONER_MEMO and `$image`: the pinned ID), before its disks are told.
# python3 (first on the plain PATH) tells its version and, over the Docker socket, the
# Docker facts: a docker CLI call costs ~20 ms, this whole call less. Without python3,
# with DOCKER_HOST, or on any failure, the docker CLI speaks instead.
docker_root=/var/lib/docker
api_lines=()
if lookup python3; then
  use_api=0
  [ -z "${DOCKER_HOST:-}" ] && [ -S /var/run/docker.sock ] && has docker && use_api=1
  while IFS= read -r line; do api_lines+=("$line"); done < <("$REPLY" -S -c '
import json, socket, sys
print(sys.version.split()[0])
if sys.argv[2] != "1":
    sys.exit(0)
def get(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect("/var/run/docker.sock")
    s.sendall(("GET %s HTTP/1.0\r\nHost: docker\r\nConnection: close\r\n\r\n" % path).encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(None, 2)[1]), body
status, body = get("/version")
if status != 200:
    sys.exit(1)
version = json.loads(body)["Version"]
status, body = get("/info")
info = json.loads(body) if status == 200 else {}
root = info.get("DockerRootDir") or "/var/lib/docker"
status, body = get("/containers/json?all=1")
containers = json.loads(body) if status == 200 else []
out = [root, "", "@@docker", version, "rc=0", "@@docker_root", root, "@@containers"]
for c in containers:
    name = (c.get("Names") or [""])[0].lstrip("/")
    label = (c.get("Labels") or {}).get("provisioner.cluster", "")
    ref = c.get("Image", "")
    ref = ref[7:19] if ref.startswith("sha256:") else ref  # as `docker ps` shows it
    out.append("%s\t%s\t%s\t%s\t%s" % (name, ref, c.get("State", ""), label, c.get("Id", "")))
out.append("@@image")
for ref in (sys.argv[1], sys.argv[3]):
    if not ref:
        continue
    status, body = get("/images/%s/json" % ref)
    if status == 200:
        image = json.loads(body)
        out.append("%s %s/%s" % (image["Id"], image.get("Os", ""), image.get("Architecture", "")))
        break
runtimes = {"DefaultRuntime": info.get("DefaultRuntime", ""), "Runtimes": info.get("Runtimes") or {}}
if info.get("CDISpecDirs"):
    runtimes["CDISpecDirs"] = info["CDISpecDirs"]
out += ["@@docker_runtimes", json.dumps(runtimes, sort_keys=True)]
print("\n".join(out))
' "$image" "$use_api" "$image_alt" 2>/dev/null)
  PROVISIONER_MEMO="$REPLY|version|${api_lines[0]:-}"$'\n'
fi
if [ ${#api_lines[@]} -gt 2 ]; then
  docker_root=${api_lines[1]}
  printf '%s\n' "${api_lines[@]:2}"
else
  section docker
  docker_rc=127
  if has docker; then
    with_timeout 10 docker version --format '{{.Server.Version}}' 2>&1; docker_rc=$?; echo "rc=$docker_rc"
  else
    echo "docker: command not found"; echo "rc=127"
  fi
  section docker_sudo
  if [ "$docker_rc" != 0 ] && [ "$docker_rc" != 127 ] && has sudo; then
    with_timeout 10 sudo -n docker version --format '{{.Server.Version}}' 2>&1; echo "rc=$?"
  fi
  section docker_root
  if [ "$docker_rc" = 0 ]; then
    # one call: the root dir, then the runtimes as the socket's /info gives them
    # (CDISpecDirs only there: older CLIs refuse a template naming it)
    info=$(with_timeout 10 docker info --format '{{.DockerRootDir}}{{"\n"}}{"DefaultRuntime": {{json .DefaultRuntime}}, "Runtimes": {{json .Runtimes}}}' 2>/dev/null) || info=
    docker_root=${info%%$'\n'*}
    [ -n "$docker_root" ] || docker_root=/var/lib/docker
    echo "$docker_root"
    section docker_runtimes
    [ "$info" != "${info#*$'\n'}" ] && echo "${info#*$'\n'}"
    section containers
    # full IDs (--no-trunc), the image ID cut as `docker ps` shows it (as the API path does)
    with_timeout 10 docker ps -a --no-trunc --format '{{.Names}}\t{{.Image}}\t{{.State}}\t{{.Label "provisioner.cluster"}}\t{{.ID}}' 2>/dev/null |
      awk -F '\t' -v OFS='\t' '$2 ~ /^sha256:/ { $2 = substr($2, 8, 12) } { print }'
    section image
    if [ -n "$image" ]; then
      with_timeout 10 docker image inspect --format '{{.Id}} {{.Os}}/{{.Architecture}}' "$image" 2>/dev/null ||
        { [ -n "$image_alt" ] &&
          with_timeout 10 docker image inspect --format '{{.Id}} {{.Os}}/{{.Architecture}}' "$image_alt" 2>/dev/null; }
    fi
  fi
fi
section docker_socket; ls -ln /var/run/docker.sock 2>&1
runtime_root=$docker_root  # its disk is told in the shared @@disk section
