#!/bin/bash
# provisioner doctor: from this node, try a TCP connection to each ADDRESS:PORT given.
# Fed on stdin: bash -s -- TIMEOUT ADDRESS:PORT...   Prints "ADDRESS PORT ok|refused|timeout|error".
set -u
timeout_s=$1; shift
if command -v python3 >/dev/null 2>&1; then
  exec python3 -c '
import errno, select, socket, sys, time
limit = float(sys.argv[1])
pending = {}
for target in sys.argv[2:]:
    address, port = target.rsplit(":", 1)
    s = socket.socket()
    s.setblocking(False)
    code = s.connect_ex((address, int(port)))
    if code in (0, errno.EINPROGRESS):
        pending[s] = (address, port)
    else:
        print(address, port, "refused" if code == errno.ECONNREFUSED else "error")
        s.close()
end = time.monotonic() + limit
while pending and time.monotonic() < end:
    _, ready, _ = select.select([], list(pending), [], max(0.0, end - time.monotonic()))
    for s in ready:
        address, port = pending.pop(s)
        code = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        print(address, port, "ok" if code == 0 else "refused" if code == errno.ECONNREFUSED else "error")
        s.close()
for address, port in pending.values():
    print(address, port, "timeout")
' "$timeout_s" "$@"
fi
for target in "$@"; do
  address=${target%:*} port=${target##*:}
  (
    # address and port as the probe's arguments, never as its script's text
    if timeout "$timeout_s" bash -c 'exec 3<>"/dev/tcp/$1/$2"' probe "$address" "$port" 2>/dev/null; then r=ok
    elif [ $? -eq 124 ]; then r=timeout; else r=refused; fi
    echo "$address $port $r"
  ) &
done
wait
