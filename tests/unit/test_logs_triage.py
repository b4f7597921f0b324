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


# Lines as Ray 2.60 writes them (monitor.log's format is ray_constants.LOGGER_FORMAT; the
# texts are those of autoscaler/_private/{event_summarizer,monitor,commands}.py).
ADDING_LEGACY = (
    "2026-12-05 22:09:42,689\tINFO monitor.py:438 -- "
    ":event_summary:Adding 1 node(s) of type ray-legacy-head-node-type."
)
ADDING_MIN_COUNT = (
    "2026-12-05 22:09:42,689\tINFO scheduler.py:1557 -- "
    "Adding 1 nodes to satisfy min count for node type: ray-legacy-worker-node-type."
)
CLEANUP = (
    "2026-12-05 22:09:42,689\tERROR monitor.py:561 -- Monitor: Cleanup exception. Trying again..."
)
KEEP_MIN_PLAIN = (
    "2026-12-05 22:09:47,624\tINFO commands.py:513 -- "
    "2 random worker nodes will not be shut down. (due to --keep-min-workers)"
)
KEEP_MIN_COLOURED = (
    "2 random worker nodes will not be shut down. "
    "\x1b[2m(due to \x1b[1m--keep-min-workers\x1b[22m\x1b[26m)\x1b[22m"
)


def test_launcher_loop_of_any_node_type() -> None:
    for line in (ADDING_LEGACY, ADDING_MIN_COUNT, "(autoscaler +5s) Adding 2 nodes of type x."):
        assert "launcher-adding-loop" not in names(line)
        (found,) = logs.triage_text("\n".join([line] * 3))
        assert (found.pattern, found.count) == ("launcher-adding-loop", 3)
        assert "provisioner render" in found.fix


def test_monitor_cleanup_loop_is_named_with_cause_and_fix() -> None:
    (found,) = logs.triage_text(f"ok\n{CLEANUP}\n{CLEANUP}")
    assert (found.pattern, found.line, found.count) == ("monitor-cleanup-loop", 2, 2)
    assert "RAY_AUTOSCALER_FATESHARE_WORKERS" in found.cause
    assert "provisioner down" in found.fix
    assert names("Monitor: Workers taken down.") == set()


def test_keep_min_workers_note_is_named_plain_or_coloured() -> None:
    for line in (KEEP_MIN_PLAIN, KEEP_MIN_COLOURED):
        (found,) = logs.triage_text(line)
        assert found.pattern == "keep-min-workers"
        assert "min_workers" in found.cause and "provisioner down" in found.fix
    assert names("The head node will not be shut down. (due to --workers-only)") == set()


def test_the_lines_are_rays_own() -> None:
    """The event summary and the teardown note, produced by Ray's own code."""
    import operator

    from ray.autoscaler._private.event_summarizer import EventSummarizer

    summary = EventSummarizer()
    summary.add(
        "Adding {} node(s) of type ray-legacy-head-node-type.",
        quantity=1,
        aggregate=operator.add,
    )
    (line,) = summary.summary()
    assert line in ADDING_LEGACY
    assert "launcher-adding-loop" in names("\n".join([line] * 3))
