"""Time from Ctrl-C (SIGINT) to exit of a provisioner command, over several tries.

    .venv/bin/python scripts/ctrl_c_timing.py --lab e2e --hang 2 --tries 5 up
    .venv/bin/python scripts/ctrl_c_timing.py --lab e2e --hang 2 --connect-timeout 30 up

runs `provisioner VERB -i INVENTORY` (the lab's inventory, or `-i`), waits until its stderr
says `--when` (default: the doctor's first round, "gathering facts"), waits `--delay`
seconds, sends SIGINT (with SIGINT at its default in the child, as at a terminal: see
CONTRIBUTING), and prints the seconds to its exit and its exit code. `--hang NODE` makes
that lab node's sshd accept connections but never answer (`lab fault hang`) for the whole
run, undone at the end; `--connect-timeout S` runs on a copy of the inventory with
`ssh.connect_timeout: S`. With a lab, the listeners on Ray's ports that the interrupted
doctor's rounds left on its nodes are ended at the end (else they hold the ports for
LISTEN_SECONDS). Nothing is asserted: it measures (issue 47, item 9).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

PROVISIONER = str(Path(sys.executable).parent / "provisioner")


def _at_a_terminal() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_try(args: list[str], when: str, delay: float, timeout: float) -> tuple[float, int, str]:
    """Seconds from SIGINT to exit, the exit code, and the end of stderr."""
    proc = subprocess.Popen(
        [PROVISIONER, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=_at_a_terminal,
    )
    seen = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if when in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not seen.wait(timeout):
            raise SystemExit(f"never saw {when!r}:\n{''.join(lines)[-2000:]}")
        time.sleep(delay)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(5)
    return took, code, "".join(lines)[-400:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verb", nargs="+", help="the command and its own arguments, e.g. up")
    parser.add_argument("-i", "--inventory", type=Path, help="default: the lab's inventory")
    parser.add_argument("--lab", help="the lab's name (for --hang and its inventory)")
    parser.add_argument("--hang", help="lab node (name or index) whose sshd hangs meanwhile")
    parser.add_argument("--connect-timeout", type=float, help="ssh.connect_timeout to use")
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--when", default="gathering facts")
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=180.0)
    opts = parser.parse_args()

    lab = None
    if opts.lab is not None or opts.hang is not None:
        from provisioner.lab.nodes import load_lab

        lab = load_lab(opts.lab)
    inventory = opts.inventory or (lab.inventory if lab is not None else None)
    if inventory is None:
        parser.error("-i INVENTORY or --lab NAME")
    with tempfile.TemporaryDirectory() as tmp:
        if opts.connect_timeout is not None:
            document = yaml.safe_load(inventory.read_text())
            base = inventory.parent
            for key in ("key", "known_hosts"):
                if key in document.get("ssh", {}):
                    document["ssh"][key] = str((base / document["ssh"][key]).resolve())
            if document.get("image", {}).get("lock"):
                document["image"]["lock"] = str((base / document["image"]["lock"]).resolve())
            document.setdefault("ssh", {})["connect_timeout"] = opts.connect_timeout
            inventory = Path(tmp) / "inventory.yaml"
            inventory.write_text(yaml.safe_dump(document))
        args = [*opts.verb, "-i", str(inventory)]
        hung = None
        if opts.hang is not None:
            from provisioner.lab import faults

            assert lab is not None
            hung = lab.node(opts.hang)
            faults.hang(lab, hung)
        times = []
        try:
            for n in range(1, opts.tries + 1):
                took, code, tail = one_try(args, opts.when, opts.delay, opts.timeout)
                times.append(took)
                last = tail.strip().splitlines()[-1] if tail.strip() else ""
                print(f"try {n}: exit {code} {took:.2f} s after SIGINT ({last[:100]})", flush=True)
        finally:
            if hung is not None:
                from provisioner.lab import faults

                assert lab is not None
                faults.unhang(lab, hung)
            if lab is not None:  # what an interrupted doctor's round left on Ray's ports
                from provisioner.doctor.gather import LISTENER_MARK
                from provisioner.lab.engine import exec_rc

                for node in lab.nodes:
                    exec_rc(node.container, f"pkill -f ' {LISTENER_MARK}$'; true")
    print(
        f"provisioner {' '.join(opts.verb)}: {len(times)} tries, seconds from SIGINT to exit: "
        f"min {min(times):.2f}, median {statistics.median(times):.2f}, max {max(times):.2f}"
    )


if __name__ == "__main__":
    main()
