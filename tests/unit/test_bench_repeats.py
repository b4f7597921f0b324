"""`make bench` keeps going when a run fails: bounded retries, every failure recorded and shown."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture(scope="module")
def br() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    import bench_repeats

    return bench_repeats


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(SCRIPTS))
    import bench

    return bench


def flaky(failures: int, value: float) -> object:
    """A run that fails `failures` times (as bench_doctor does: SystemExit), then succeeds."""
    left = [failures]

    def run() -> float:
        if left[0]:
            left[0] -= 1
            raise SystemExit("ansible fan-out failed (rc 4, 99/100 ok): ep-2230 | UNREACHABLE!")
        return value

    return run


def test_a_failed_attempt_is_recorded_and_retried(br: ModuleType) -> None:
    rep = br.Repeats(retries=2)
    assert rep.run("fan-out/ansible", flaky(1, 4.5)) == 4.5
    (failed,) = rep.of("fan-out/ansible")
    assert (failed.repeat, failed.attempt) == (1, 1)
    assert "rc 4, 99/100 ok" in failed.error
    assert br.summary(rep.of("fan-out/ansible"), 3, 2) == "1 of 3 repeats failed once, retried"


def test_retries_are_bounded_and_a_lost_repeat_gives_none(br: ModuleType) -> None:
    rep = br.Repeats(retries=2)
    assert rep.run("x", flaky(10, 1.0)) is None
    assert [a.attempt for a in rep.of("x")] == [1, 2, 3]
    assert rep.run("x", lambda: 2.0) == 2.0  # the next repeat runs on
    assert br.lost_repeats(rep.of("x"), 2) == 1
    assert br.summary(rep.of("x"), 2, 2) == "1 of 2 repeats failed (1 lost after 2 retries)"


def test_exceptions_and_failed_commands_are_recorded_too(br: ModuleType) -> None:
    rep = br.Repeats(retries=0)

    def boom() -> float:
        raise subprocess.CalledProcessError(1, ["ray", "up"], stderr=b"timed out\n waiting")

    assert rep.run("bring-up/ray up", boom) is None
    assert rep.of("bring-up/ray up")[0].error.endswith("timed out waiting")
    assert br.error_text(ValueError("x" * 1000), limit=10) == "…" + "x" * 10


def test_keyboard_interrupt_still_stops_the_run(br: ModuleType) -> None:
    def interrupted() -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        br.Repeats().run("x", interrupted)


def test_the_table_shows_failed_repeats_and_lists_their_errors(
    bench: ModuleType, br: ModuleType
) -> None:
    rep = br.Repeats(retries=1)
    ansible_runs = [rep.run("a", flaky(1, 9.0)), rep.run("a", lambda: 11.0)]
    facts_runs = [rep.run("f", flaky(5, 1.0)), rep.run("f", flaky(5, 1.0))]
    ansible = bench.Figure("ansible", "s", [x for x in ansible_runs if x], rep.of("a"), 2, 1)
    facts = bench.Figure("doctor", "s", [x for x in facts_runs if x], rep.of("f"), 2, 1)
    r = bench.ratio(ansible, facts)
    assert r is None  # no doctor run: no ratio, no verdict
    row = bench.Row("fan-out", "fan-out", facts, ansible, r, "A / d", "≥ 5", None, "what")
    doc = {
        "machine": {"cores": 2, "cpu": "c", "memory_gib": 1, "load_average_at_start": [1]},
        "finished": "now",
        "command": "scripts/bench.py",
        "lab_nodes": 3,
        "repeat": 2,
        "push_repeat": 1,
        "rows": [row.to_json()],
    }
    text = bench.markdown(doc)
    assert "ansible: 10.0 s (9.00 s–11.0 s) · 1 of 2 repeats failed once, retried" in text
    assert "doctor: failed every repeat · 2 of 2 repeats failed (2 lost after 1 retry)" in text
    assert "repeat 1, attempt 1: ansible fan-out failed (rc 4, 99/100 ok)" in text
    assert "| — | ≥ 5 | — |" in text


def test_scale_labs_get_their_own_subnets(bench: ModuleType) -> None:
    import bench_scale

    assert bench_scale.subnet_for("10.250.140.0/24", 1) == "10.250.141.0/24"
    cfg = bench_scale.lab_config("i18", "10.250.140.0/24", 6, 1)
    assert (cfg.name, cfg.subnet, cfg.nodes) == ("i18-b6", "10.250.142.0/24", 6)


def test_scale_series_reads_every_figure_in_images_and_keeps_gaps(bench: ModuleType) -> None:
    image = 1000
    push = {
        "direct": {"seconds": 3.0, "control_wire_bytes": 3050, "busiest_wire_bytes": 40},
        "star": {"seconds": 4.0, "control_wire_bytes": 1020, "busiest_wire_bytes": 2040},
        "forward": {"seconds": 3.5, "control_wire_bytes": 1020, "busiest_wire_bytes": 1010},
    }
    results = [
        {
            "nodes": 3,
            "push": push,
            "doctor_s": 0.5,
            "down_s": 2.0,
            "up": [{"alive": 8.0, "ray_start": 6.5, "returned": 9.0}],
            "ray_up": [None],  # ray up failed every attempt
        },
        {"nodes": 6, "failed": True},
    ]
    s = bench.scale_series(results, image)
    assert s["n"] == [3.0, 6.0]
    assert s["up_overhead"] == [1.5, None]
    assert s["ray_alive"] == [None, None]
    assert s["star_busiest"] == [2.04, None] and s["forward_busiest"] == [1.01, None]
    ctx = bench.Context(None, Path("x"), None, Path("."), bench.Repeats())
    rows = bench.scale_rows(ctx, results, image)
    forward = next(r for r in rows if r.benchmark == "scale, 3 nodes: push forward")
    assert forward.met is True and forward.ratio == 1.01
    bring = rows[0].to_json()
    assert bring["baseline"]["median"] is None and bring["ratio"] is None


def test_the_scale_table_has_one_column_per_lab_size(bench: ModuleType) -> None:
    results = [
        {"nodes": 3, "doctor_s": 0.51, "push": {"forward": {"busiest_wire_bytes": 1010}}},
        {"nodes": 10, "doctor_s": 1.2},
    ]
    text = bench.scale_markdown(results, 1000)
    assert text.splitlines()[0] == "| nodes | 3 | 10 |"
    assert "| doctor (s) | 0.51 | 1.20 |" in text
    assert "| push chain: busiest node sent (images) | 1.01 | — |" in text


def test_scale_rows_are_asked_for_not_run_by_default(bench: ModuleType) -> None:
    assert "scale" not in bench.parse([]).groups
    assert bench.parse(["--rows", "all"]).groups[-1] == "scale"
    args = bench.parse(["--rows", "scale", "--scale-nodes", "3,6,10", "--scale-only", "10"])
    assert (args.scale_nodes, args.scale_only) == ([3, 6, 10], [10])


def test_a_row_measured_again_replaces_its_older_self_in_the_merged_record() -> None:
    """bench_merge: a later run's row replaces the earlier one of the same id, or (rows
    without one) of the same group and name wherever each run placed it; the run whose
    rows were all replaced leaves the record."""
    sys.path.insert(0, str(SCRIPTS))
    import bench_merge

    def row(group: str, name: str, ours: float, id: str = "") -> dict[str, object]:
        return {"group": group, "benchmark": name, "ours": ours, **({"id": id} if id else {})}

    old = {
        "command": "old",
        "rows": [row("link", "push", 1.0, "push-x"), row("up", "a", 2.0), row("up", "b", 3.0)],
    }
    new = {"command": "new", "rows": [row("up", "b", 30.0), row("up", "a", 20.0)]}
    merged = bench_merge.merge([old, new])
    assert [(r["benchmark"], r["ours"], r["run"]) for r in merged["rows"]] == [
        ("push", 1.0, 0),
        ("a", 20.0, 1),
        ("b", 30.0, 1),
    ]
    assert [r["command"] for r in merged["runs"]] == ["old", "new"]
    again = bench_merge.merge(
        [merged, {"command": "newer", "rows": [row("link", "push", 9.0, "push-x")]}]
    )
    assert [r["command"] for r in again["runs"]] == ["new", "newer"]  # "old" has no row left
