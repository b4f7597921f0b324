"""Runs INSIDE the head's Ray container (sent on stdin to `python -`); not imported locally.

`python - nodes ADDRESS`      -> the GCS's view of every node
`python - place ADDRESS SECS IDS` -> one task pinned to each node ID of IDS (comma-separated);
    one result per address, a success winning (an address may hold a stale ID too)
`python - join ADDRESS SECS IPS STALE PLACE` -> wait until every IP has an alive node whose
    ID is not in STALE, then (PLACE=1) the placement probe on every such ID; one ray.init

Prints one line `PROVISIONER_PROBE <json>` on stdout. The token reaches Ray through the
container's RAY_AUTH_TOKEN_PATH; nothing secret is printed.
"""

from __future__ import annotations

import contextlib
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


def best_per_address(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pure: one result per address, in first-seen order; a success wins over a failure.

    An address can have two "alive" node IDs: a raylet killed without a goodbye stays
    listed until its health checks fail (tens of seconds), and its replacement registers
    under a new ID meanwhile. The task pinned to the dead one fails; the address is fine
    if the task pinned to the live one ran there.
    """
    best: dict[str, dict[str, Any]] = {}
    for entry in entries:
        held = best.get(entry["ip"])
        if held is None or (entry.get("ok") and not held.get("ok")):
            best[entry["ip"]] = entry
    return list(best.values())


def _place(ray: Any, timeout: float, node_ids: list[str]) -> list[dict[str, Any]]:
    """One task pinned to each alive node of `node_ids`, all at once; one result per
    address (see `best_per_address`). Stops waiting once every address has a success."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    where = ray.remote(num_cpus=0)(_where)
    alive = [n for n in _nodes(ray) if n["alive"] and n["node_id"] in node_ids]
    pending = {
        where.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["node_id"], soft=False)
        ).remote(): n
        for n in alive
    }
    entries: list[dict[str, Any]] = []

    def settled() -> set[str]:
        return {e["ip"] for e in entries if e.get("ok")}

    deadline = time.monotonic() + timeout
    while pending and {n["ip"] for n in pending.values()} - settled():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=left)
        for ref in ready:
            n = pending.pop(ref)
            try:
                got = ray.get(ref)
                ok = got["ip"] == n["ip"]
                entries.append({"ip": n["ip"], "ok": ok, "ran_on": got["ip"]})
            except Exception as exc:
                entries.append(
                    {"ip": n["ip"], "ok": False, "error": f"{type(exc).__name__}: {exc}"}
                )
    for ref, n in pending.items():
        if n["ip"] not in settled():
            entries.append(
                {"ip": n["ip"], "ok": False, "error": f"no answer within {timeout:.0f}s"}
            )
        with contextlib.suppress(Exception):  # one on a dead node may not cancel; left
            ray.cancel(ref)
    return best_per_address(entries)


def _join(ray: Any, timeout: float, ips: list[str], stale: list[str], place: bool) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        nodes = _nodes(ray)
        fresh = [n for n in nodes if n["alive"] and n["node_id"] not in stale]
        if set(ips) <= {n["ip"] for n in fresh} or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    document: dict[str, Any] = {"nodes": nodes}
    _mark("joined")
    if place and set(ips) <= {n["ip"] for n in fresh}:
        # every fresh ID at each address: a stale one not yet marked dead may be among them
        ids = [n["node_id"] for n in fresh if n["ip"] in ips]
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
