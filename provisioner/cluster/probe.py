"""Runs INSIDE the head's Ray container (sent on stdin to `python -`); not imported locally.

`python - nodes ADDRESS`      -> the GCS's view of every node
`python - place ADDRESS SECS IDS` -> one task pinned to each node ID of IDS (comma-separated)
`python - join ADDRESS SECS IPS STALE PLACE` -> wait until every IP has an alive node whose
    ID is not in STALE, then (PLACE=1) the placement probe on those nodes; one ray.init

Prints one line `PROVISIONER_PROBE <json>` on stdout. The token reaches Ray through the
container's RAY_AUTH_TOKEN_PATH; nothing secret is printed.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from typing import Any

MARK = "PROVISIONER_PROBE "
START = time.monotonic()
TIMINGS: dict[str, float] = {}  # seconds since this script started, by step


def _mark(step: str) -> None:
    TIMINGS[step] = round(time.monotonic() - START, 3)


def _emit(document: Any) -> None:
    sys.stdout.write(MARK + json.dumps(document) + "\n")
    sys.stdout.flush()


def _nodes(ray: Any) -> list[dict[str, Any]]:
    return [
        {
            "node_id": n["NodeID"],
            "ip": n["NodeManagerAddress"],
            "alive": bool(n["Alive"]),
            "resources": n.get("Resources", {}),
            "labels": n.get("Labels", {}),
        }
        for n in ray.nodes()
    ]


def _where() -> dict[str, Any]:
    import ray

    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return {"ip": ip, "hostname": socket.gethostname()}


def _place(ray: Any, timeout: float, node_ids: list[str]) -> list[dict[str, Any]]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = ray.remote(num_cpus=0)(_where)
    alive = [n for n in _nodes(ray) if n["alive"] and n["node_id"] in node_ids]
    refs = {
        n["ip"]: where.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["node_id"], soft=False)
        ).remote()
        for n in alive
    }
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    for ip, ref in refs.items():
        try:
            got = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            results.append({"ip": ip, "ok": got["ip"] == ip, "ran_on": got["ip"]})
        except Exception as exc:
            results.append({"ip": ip, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return results


def _join(ray: Any, timeout: float, ips: list[str], stale: list[str], place: bool) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        nodes = _nodes(ray)
        fresh = {n["ip"]: n for n in nodes if n["alive"] and n["node_id"] not in stale}
        if set(ips) <= set(fresh) or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    document: dict[str, Any] = {"nodes": nodes}
    _mark("joined")
    if place and set(ips) <= set(fresh):
        ids = [fresh[ip]["node_id"] for ip in ips]
        document["placement"] = _place(ray, max(10.0, deadline - time.monotonic()), ids)
    _mark("placed")
    document["timings"] = TIMINGS
    return document


def _split(arg: str) -> list[str]:
    return [x for x in arg.split(",") if x]


def main(argv: list[str]) -> int:
    mode, address = argv[0], argv[1]
    import ray

    _mark("import")
    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    _mark("init")
    try:
        if mode == "nodes":
            _emit({"nodes": _nodes(ray)})
        elif mode == "join":
            secs, ips, stale, place = float(argv[2]), _split(argv[3]), _split(argv[4]), argv[5]
            _emit(_join(ray, secs, ips, stale, place == "1"))
        else:
            ids = [i for i in argv[3].split(",") if i] if len(argv) > 3 else []
            _emit({"placement": _place(ray, float(argv[2]), ids)})
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
