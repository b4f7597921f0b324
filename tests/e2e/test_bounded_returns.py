"""Issue 27 (5, 6) on the lab: what a job leaves in its results comes home bounded, and
no link it plants is followed, by a pull or by `down --yes`.

The job (root in the Ray container, over the results bind mount in the SSH user's home)
leaves a 4 TiB sparse file and links to the user's ~/.ssh, authorized_keys and /etc beside
plain files. Positive controls on the head show each link works and points at a readable
secret; what the pull writes here is measured (the disk's free space, shared with other
work, is recorded only).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from provisioner.inventory import load_inventory
from provisioner.lab.nodes import LabInfo
from tests.e2e.faults.lab import cli, on_node
from tests.e2e.faults.record import scenario

PLANTING_BOOK = """
import json, os, sys, time
home = sys.argv[1]
out = os.environ["PROVISIONER_RESULTS_DIR"]
open(os.path.join(out, "metrics.csv"), "w").write("iteration,env_steps\\n1,100\\n")
json.dump({"iterations": 1}, open(os.path.join(out, "summary.json"), "w"))
os.makedirs(os.path.join(out, "sub"), exist_ok=True)
open(os.path.join(out, "sub", "plain.txt"), "w").write("plain next to the links\\n")
with open(os.path.join(out, "huge.bin"), "wb") as f:
    f.truncate(4 * 2**40)  # 4 TiB, sparse: costs no disk
os.symlink(home + "/.ssh", os.path.join(out, "ssh"))
os.symlink(home + "/.ssh/authorized_keys", os.path.join(out, "keys"))
os.symlink(home + "/.ssh/authorized_keys", os.path.join(out, "job-status.json"))
os.symlink("/etc", os.path.join(out, "etc"))
open(os.path.join(out, "ready"), "w").write("1")
while True:
    time.sleep(1)
"""


def free_bytes(path: Path) -> int:
    disk = os.statvfs(path)
    return disk.f_bavail * disk.f_frsize


def test_a_hostile_results_directory_comes_home_bounded_and_without_its_links(
    cluster_inventory: Path, lab: LabInfo, tmp_path: Path
) -> None:
    inv = str(cluster_inventory)
    up = cli("up", "-i", inv, "--json")
    assert up.code == 0, up.stderr[-3000:]
    head = lab.nodes[0]
    cluster = load_inventory(cluster_inventory).cluster
    home = on_node(head, f"getent passwd {head.user} | cut -d: -f6").strip()
    keys = f"{home}/.ssh/authorized_keys"
    book = tmp_path / "book"
    book.mkdir()
    (book / "plant.py").write_text(PLANTING_BOOK)
    with scenario(
        "a job leaves a 4 TiB sparse file and links to ~/.ssh, authorized_keys and /etc "
        "in its results; `jobs results`, then `down --yes`",
        "the sparse file is refused by name (exit 1), the plain files come home, no link "
        "is followed (no key, no authorized_keys, no /etc here), under 1 MiB written "
        "here; `down --yes` writes job-status.json without touching authorized_keys",
        kind="security",
    ) as s:
        sub = cli("submit", "-i", inv, "--detach", "--json", str(book / "plant.py"), "--", home)
        assert sub.code == 0, (sub.stdout + sub.stderr)[-3000:]
        job = json.loads(sub.stdout)["job_id"]
        remote = f"{home}/.provisioner/clusters/{cluster}/results/{job}"
        on_node(
            head, f"for i in $(seq 120); do [ -e {remote}/ready ] && exit 0; sleep 1; done; exit 1"
        )
        # positive controls: each link works on the head, and the sparse file is 4 TiB
        assert "ssh-" in on_node(head, f"cat {remote}/keys")
        assert "authorized_keys" in on_node(head, f"ls {remote}/ssh/")
        assert "root:" in on_node(head, f"cat {remote}/etc/passwd")
        sizes = on_node(head, f"stat -c %s {remote}/huge.bin; du -k {remote}/huge.bin").split()
        assert int(sizes[0]) == 4 * 2**40 and int(sizes[1]) < 1024, sizes
        s.saw(links=["keys", "ssh/", "etc/passwd"], tib=int(sizes[0]) // 2**40)
        keys_before = on_node(head, f"sha256sum {keys}")

        results = tmp_path / "r"
        before = free_bytes(tmp_path)
        got = cli("jobs", "results", "-i", inv, "--results", str(results), "--json", job)
        after = free_bytes(tmp_path)
        # what the pull wrote here (staging folders included): the disk's free space is
        # shared with other work on this machine, so it is measured, not asserted
        written = sum(p.lstat().st_blocks * 512 for p in results.rglob("*"))
        s.expect("pulled", got.code, 1, (got.stdout + got.stderr)[-3000:])
        transfer = json.loads(got.stdout)["transfer"]
        (refused,) = transfer["files_refused"]
        assert refused.startswith("huge.bin: ") and "PROVISIONER_PULL_MAX_BYTES" in refused
        s.saw(refused=refused.split(":")[0])
        came = {p.relative_to(results / job).as_posix() for p in (results / job).rglob("*")}
        home = {"metrics.csv", "summary.json", "sub/plain.txt"}
        assert home <= came, came
        s.saw(home=sorted(home))
        s.expect("came", sorted(came & {"huge.bin", "ssh", "keys", "etc", "job-status.json"}), [])
        assert not any(("/" in c and c.split("/")[0] in ("ssh", "etc")) for c in came), came
        for path in (results / job).rglob("*"):
            assert (not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode)) or path.is_dir()
        s.expect("under_1mib", written < 2**20, True, str(written))  # nothing of the 4 TiB

        down = cli("down", "-i", inv, "--yes", "--no-logs", "--results", str(tmp_path / "d"))
        s.expect("down", down.code, 0, (down.stdout + down.stderr)[-3000:])
        s.expect("keys_same", on_node(head, f"sha256sum {keys}") == keys_before, True)
        status = on_node(head, f"stat -c %F {remote}/job-status.json; cat {remote}/job-status.json")
        assert status.startswith("regular file") and '"by": "down"' in status, status
        s.saw(status="regular file")
        assert "ssh-" in on_node(head, f"cat {keys}")
        s.observed = (
            "positive controls on the head: the links {links} each read their target, "
            "huge.bin {tib} TiB; jobs results exit {pulled}, {refused} refused by name with "
            "the PROVISIONER_PULL_MAX_BYTES fix; {home} home; of the links and huge.bin, "
            "[{came}] came; under 1 MiB written here: {under_1mib}; down --yes exit {down}: "
            "authorized_keys' sha256 unchanged: {keys_same}, job-status.json a {status}"
        )
        s.measure(written=written, freed=before - after)
        s.measured = (
            "{written} bytes written here; this disk's free space changed by {freed} bytes "
            "meanwhile (shared with other work)"
        )
    again = cli("up", "-i", inv, "--json")
    assert again.code == 0, again.stderr[-3000:]
