from __future__ import annotations

from pathlib import Path

from provisioner.cluster import logs


def names(text: str) -> set[str]:
    return {f.pattern for f in logs.triage_text(text)}


def test_each_known_error_is_named() -> None:
    assert names("OSError: [Errno 98] Address already in use") == {"address-in-use"}
    assert "version-mismatch" in names("RuntimeError: Version mismatch: cluster 2.9 vs 2.60")
    assert "authentication" in names("Status: UNAUTHENTICATED: Invalid authentication token")
    assert "oom-kill" in names("ray.exceptions.OutOfMemoryError: Task was killed due to memory")
    assert "lost-heartbeat" in names("The node with node id abc has missed too many heartbeats")
    assert "worker-crash" in names("Fatal Python error: Segmentation fault")
    assert names("all good\nnothing here") == set()


def test_launcher_loop_needs_repetition() -> None:
    line = "Adding 1 node(s) of type local.cluster.node."
    assert "launcher-adding-loop" not in names(line)
    assert "launcher-adding-loop" in names("\n".join([line] * 5))
    finding = logs.triage_text("\n".join(["x", line, line, line]))[0]
    assert (finding.line, finding.count) == (2, 3)


def test_triage_dir_names_node_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "node-1" / "ray" / "raylet.out"
    f.parent.mkdir(parents=True)
    f.write_text("ok\nok\n[Errno 98] Address already in use\n")
    (found,) = logs.triage_dir(tmp_path)
    assert (found.node, found.file, found.line) == ("node-1", "ray/raylet.out", 3)
    assert found.fix
