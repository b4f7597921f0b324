"""What a person sees of a job: progress read from Tune's own results (`jobs.tune_watch`,
started by the entrypoint), the script's own lines without Ray's noise (`jobs.noise`),
colours on a terminal only (`console.plain`, `console.sgr_only`).

The golden logs are job.log files of real jobs on the lab: RLlib's
`ray/rllib/examples/envs/custom_gym_env.py` from the Ray wheel (`--num-env-runners 2
--stop-iters 2`) and a Tune function trainable of two trials, submitted with `--verbose`.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli.jobs import make_handlers, progress_text
from provisioner.console import Output, plain, sgr_only
from provisioner.jobs.home import write_log
from provisioner.jobs.noise import NoiseFilter, shown_lines
from provisioner.jobs.place import Sbatch
from provisioner.jobs.spec import make_spec
from provisioner.jobs.stream import progress_of
from provisioner.jobs.tune_watch import figures

GOLDEN = Path(__file__).parent / "golden" / "job_output"
ESC = "\x1b"


def golden(name: str) -> list[str]:
    return (GOLDEN / name).read_text().rstrip("\n").split("\n")


# --- colours and escapes ------------------------------------------------------------------

HOSTILE = [
    ("\x1b]0;pwned\x07title", "title"),  # OSC: the window's title
    ("\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink
    ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home
    ("a\x1b[5Ab\x1b[?25l", "ab"),  # cursor up, cursor hidden
    ("a\x1bPq#0;2;0;0;0\x1b\\b", "ab"),  # DCS (sixel)
    ("a\x1b7b\x1bcc", "abc"),  # save cursor, full reset
    ("\x9b31mred", "31mred"),  # the 8-bit CSI is a control character: dropped
    ("a\rb\x07c\x08d\x00e", "abcde"),  # CR, BEL, backspace, NUL
    ("\u202eevil\u202c", "evil"),  # bidirectional override
    ("half \x1b[31", "half "),  # a sequence cut at the end of the line
    ("trailing \x1b", "trailing "),
    ("tab\tkept", "tab\tkept"),
]


@pytest.mark.parametrize(("line", "text"), HOSTILE)
def test_plain_drops_every_escape_sequence_and_control(line: str, text: str) -> None:
    assert plain(line) == text


@pytest.mark.parametrize(("line", "text"), HOSTILE)
def test_a_terminal_keeps_only_the_colours(line: str, text: str) -> None:
    assert sgr_only(line) == text  # none of these is a colour: all dropped
    assert sgr_only(f"\x1b[1;31m{line}\x1b[0m") == f"\x1b[1;31m{text}\x1b[0m"


def test_rays_colours_survive_on_a_terminal_only() -> None:
    line = "\x1b[36m(PPO pid=268, ip=10.250.77.12)\x1b[0m Install gputil"
    assert sgr_only(line) == line
    assert plain(line) == "(PPO pid=268, ip=10.250.77.12) Install gputil"
    assert sgr_only("\x1b[38;5;196mred\x1b[39m \x1b[2Kx") == "\x1b[38;5;196mred\x1b[39m x"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _handlers(verbose: bool, tty: bool = False, json_: bool = False) -> tuple[Any, Output]:
    out = Output(json_mode=json_, stdout=Tty() if tty else io.StringIO(), stderr=io.StringIO())
    return make_handlers(out, json_, verbose), out


def test_job_lines_keep_colours_on_a_terminal_and_nothing_else_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)
    line = "\x1b]0;pwned\x07\x1b[31mreward is NaN\x1b[0m\x1b[2J"
    h, out = _handlers(verbose=False, tty=True)
    h.on_line(line)
    shown = out.stdout.getvalue()  # type: ignore[attr-defined]
    assert "reward is NaN" in shown and "\x1b[31m" in shown  # the colour, as rich writes it
    assert "pwned" not in shown and "\x1b]" not in shown and "\x1b[2J" not in shown
    for json_ in (False, True):  # a pipe; --json (on stderr)
        h, out = _handlers(verbose=False, json_=json_)
        h.on_line(line)
        shown = out.stdout.getvalue() + out.stderr.getvalue()  # type: ignore[attr-defined]
        assert "reward is NaN" in shown and ESC not in shown and "x1b" not in shown
        assert "pwned" not in shown


def test_job_log_at_home_keeps_every_line_without_escapes(tmp_path: Path) -> None:
    lines = golden("rllib_custom_gym_env.log")
    write_log("\n".join(lines), tmp_path)
    home = (tmp_path / "job.log").read_text().split("\n")
    assert ESC not in "\n".join(home)
    assert home[:-1] == [plain(line) for line in lines]  # every line, noise included
    assert any("DeprecationWarning" in line for line in home)


# --- Ray's noise --------------------------------------------------------------------------


def test_an_rllib_example_shows_its_own_lines_not_rays_noise() -> None:
    lines = golden("rllib_custom_gym_env.log")
    shown = [plain(line) for line in shown_lines(lines)]
    # what is left: gymnasium's warnings about the user's environment (not Ray's), each
    # with its source line
    assert len(shown) == 8, shown
    assert all(
        line.startswith("  ") or ("site-packages/gymnasium/" in line and "UserWarning" in line)
        for line in shown
    ), shown
    hidden = [plain(line) for line in lines if line not in shown_lines(lines)]
    # positive control: the noise is in the log, and the filter hid it
    assert sum("DeprecationWarning" in line for line in hidden) == 2
    assert any(line.startswith("(PPO pid=") for line in hidden)
    assert any("[repeated 2x across cluster]" in line for line in hidden)
    assert any("\tINFO worker.py:" in line for line in hidden)
    assert any(line.startswith("== Status ==") for line in hidden)
    assert any(line.startswith("Running entrypoint for job ") for line in hidden)
    assert not any("DeprecationWarning" in line or "pid=" in line for line in shown)


def test_a_tune_script_shows_its_own_print_not_tunes_tables() -> None:
    lines = golden("tune_function.log")
    shown = [line for line in shown_lines(lines) if line]
    assert shown == ["best 6"]
    assert any(line.startswith("Trial status: ") for line in lines)
    assert any("my own print" in line for line in lines)  # an actor's: under --verbose


BLOCKS = """\
/opt/ray/lib/python3.11/site-packages/ray/tune/impl/tuner.py:12: DeprecationWarning: old
  warnings.warn(
my own print
/home/me/project/train.py:4: RayDeprecationWarning: `foo` is deprecated
  foo()
my second print
/opt/ray/lib/python3.11/site-packages/ray/tune/execution/tune_controller.py:190: UserWarning: x
  warnings.warn(
/home/me/project/env.py:9: UserWarning: my env warns
  warnings.warn("my env warns")
2026-12-06 05:38:52,517\tWARNING algorithm_config.py:5160 -- You are running PPO
  on the new API stack
2026-12-06 05:38:52,518\tERROR tune_controller.py:1331 -- Trial task failed
Traceback (most recent call last):
  File "/opt/ray/lib/python3.11/site-packages/ray/tune/execution/tune_controller.py", line 1
ray.exceptions.RayTaskError(ValueError): boom
\x1b[36m(PPO pid=244, ip=10.250.100.11)\x1b[0m some actor chatter
\x1b[36m(PPO pid=244, ip=10.250.100.11)\x1b[0m Traceback (most recent call last):
\x1b[36m(PPO pid=244, ip=10.250.100.11)\x1b[0m   File "train.py", line 3, in step
\x1b[36m(PPO pid=244, ip=10.250.100.11)\x1b[0m ValueError: reward is NaN
\x1b[36m(PPO pid=244, ip=10.250.100.11)\x1b[0m more chatter
(raylet) [2026-12-06 05:38:55,574 W 12 12] memory_monitor.cc:1: low memory
[2026-12-06 05:38:55,574 E 12 12] gcs_client.cc:1: the driver's own native error
FutureWarning: a bare one
Traceback (most recent call last):
  File "train.py", line 9, in <module>
KeyError: 'x'"""


def test_warning_blocks_ray_lines_and_tracebacks() -> None:
    shown = [plain(line) for line in shown_lines(BLOCKS.split("\n"))]
    assert shown == [
        "my own print",
        "my second print",
        "/home/me/project/env.py:9: UserWarning: my env warns",
        '  warnings.warn("my env warns")',
        "2026-12-06 05:38:52,518\tERROR tune_controller.py:1331 -- Trial task failed",
        "Traceback (most recent call last):",
        '  File "/opt/ray/lib/python3.11/site-packages/ray/tune/execution/'
        'tune_controller.py", line 1',
        "ray.exceptions.RayTaskError(ValueError): boom",
        "(PPO pid=244, ip=10.250.100.11) Traceback (most recent call last):",
        '(PPO pid=244, ip=10.250.100.11)   File "train.py", line 3, in step',
        "(PPO pid=244, ip=10.250.100.11) ValueError: reward is NaN",
        "[2026-12-06 05:38:55,574 E 12 12] gcs_client.cc:1: the driver's own native error",
        "Traceback (most recent call last):",
        '  File "train.py", line 9, in <module>',
        "KeyError: 'x'",
    ]


def test_each_actors_continuation_lines_go_with_its_own_block() -> None:
    judge = NoiseFilter()
    a, b = "(A pid=1) ", "(B pid=2) "
    assert judge.shown(b + "Traceback (most recent call last):")
    assert not judge.shown(a + "x.py:1: DeprecationWarning: old")
    assert judge.shown(b + '  File "b.py", line 1')  # B's traceback, amid A's warning
    assert not judge.shown(a + "  warnings.warn(")
    assert judge.shown(b + "KeyError: 1")


def test_verbose_shows_every_line_and_the_default_hides_the_noise() -> None:
    lines = golden("rllib_custom_gym_env.log")
    h, out = _handlers(verbose=True)
    for line in lines:
        h.on_line(line)
    verbose = out.stdout.getvalue()  # type: ignore[attr-defined]
    h, out = _handlers(verbose=False)
    for line in lines:
        h.on_line(line)
    default = out.stdout.getvalue()  # type: ignore[attr-defined]
    assert "DeprecationWarning" in verbose and "DeprecationWarning" not in default
    assert "Box low's precision" in default
    assert ESC not in verbose + default


# --- progress from Tune's results ---------------------------------------------------------

RLLIB_RESULT = {
    "training_iteration": 2,
    "num_env_steps_sampled_lifetime": 8000,
    "env_runners": {"episode_return_mean": 0.3871955446940962, "episode_len_mean": 64.5},
    "learners": {"default_policy": {"total_loss": 0.1}},
    "time_this_iter_s": 9.2,
    "trial_id": "51ea2_00000",
    "config": {"lr": 0.0003},
}


def test_rllib_new_stack_figures() -> None:
    got = figures(RLLIB_RESULT)
    assert got == {
        "source": "tune",
        "iteration": 2,
        "env_steps": 8000,
        "episode_return_mean": 0.3871955446940962,
    }
    assert progress_text(got) == "iter 2  steps 8000  return 0.39"


def test_a_plain_trainables_scalars_are_its_figures() -> None:
    result = {
        "score": 3,
        "loss": 0.25,
        "name": "text is not a figure",
        "nan": float("nan"),
        "flag": True,
        "bad\x1b[2Jname": 1,
        "training_iteration": 4,
        "time_total_s": 0.0012,
        "trial_id": "6fe15_00000",
        "done": True,
    }
    got = figures(result)
    assert got == {"source": "tune", "iteration": 4, "metrics": {"score": 3, "loss": 0.25}}
    text = progress_text({**got, "trial": 2, "trials": 2})
    assert text == "trial 2/2  iter 4  score 3  loss 0.25"


def test_a_forged_mark_cannot_reach_the_terminal() -> None:
    mark = {"source": "tune", "iteration": "\x1b[2J", "metrics": {"\x1b]0;x\x07": 1, "ok": 2}}
    assert progress_text(mark) == "ok 2"


def _driver(tmp_path: Path) -> Path:
    """A stand-in for Tune's driver: two trials' result.json in Ray's layout, held open
    and written as Tune's JsonLoggerCallback does, a print of its own, exit code 3."""
    book = tmp_path / "book" / "driver.py"
    book.parent.mkdir()
    book.write_text(
        "import json, os, sys, time\n"
        "root = sys.argv[1] + '/artifacts/2026-12-06_05-38-52/PPO/driver_artifacts'\n"
        "files = []\n"
        "for trial in ('PPO_env_00000', 'PPO_env_00001'):\n"
        "    os.makedirs(f'{root}/{trial}')\n"
        "    files.append(open(f'{root}/{trial}/result.json', 'at'))\n"
        "print('my own print', flush=True)\n"
        "for i in (1, 2):\n"
        "    for k, f in enumerate(files):\n"
        "        r = {'training_iteration': i, 'num_env_steps_sampled_lifetime': 4000 * i,\n"
        "             'env_runners': {'episode_return_mean': i + k / 10}}\n"
        "        f.write(json.dumps(r) + '\\n')\n"
        "        f.flush()\n"
        "    time.sleep(1.5)\n"
        "sys.exit(3)\n"
    )
    return book


def test_the_entrypoint_starts_the_watcher_which_ends_with_the_driver(tmp_path: Path) -> None:
    book = _driver(tmp_path)
    spec = make_spec(book, [str(tmp_path / "session")], job_id="j1")
    env = {"PROVISIONER_RESULTS_ROOT": str(tmp_path / "root"), "PATH": "/usr/bin:/bin"}
    python = Path(sys.executable).parent
    env["PATH"] = f"{python}:{env['PATH']}"
    # run() reads the output to its end: it returns once every writer (the watcher too)
    # has closed it, so returning at all says the watcher ended with the driver
    done = subprocess.run(
        ["sh", "-c", spec.entrypoint()],
        cwd=book.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr  # the driver's exit code is the job's
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert "my own print" in lines
    marks = [m for m in map(progress_of, lines) if m is not None]
    seen = {(m["trial"], m["iteration"], m["episode_return_mean"]) for m in marks}
    assert seen == {(1, 1, 1.0), (2, 1, 1.1), (1, 2, 2.0), (2, 2, 2.1)}, marks
    assert all(m["trials"] == 2 and m["env_steps"] == 4000 * m["iteration"] for m in marks)


def test_without_tune_the_watcher_says_nothing(tmp_path: Path) -> None:
    book = tmp_path / "plain.py"
    book.write_text("print('step 1')\n")
    spec = make_spec(book, job_id="j2")
    env = {"PROVISIONER_RESULTS_ROOT": str(tmp_path / "root")}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    done = subprocess.run(
        ["sh", "-c", spec.entrypoint()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "step 1\n", "")


def test_marks_are_json_the_follower_reads() -> None:
    line = "PROVISIONER-PROGRESS " + json.dumps(figures(RLLIB_RESULT))
    assert progress_of(line) == figures(RLLIB_RESULT)


def test_the_sbatch_script_runs_the_same_watcher_beside_its_driver(tmp_path: Path) -> None:
    from tests.unit.test_place import _slurm_inventory

    book = _driver(tmp_path)
    spec = make_spec(book, [str(tmp_path / "session")], job_id="j3")
    script = Sbatch(_slurm_inventory(tmp_path)).script(spec)
    # its driver's part, as the script runs it once Ray is up on the allocation
    part = script.split("set +e\n", 1)[1].split("set -e\n", 1)[0] + 'echo "rc=$rc"\n'
    job_dir = tmp_path / "job"
    (job_dir / "playbook").mkdir(parents=True)
    (job_dir / "playbook" / book.name).write_text(book.read_text())
    env = {"PY": sys.executable, "JOB_DIR": str(job_dir), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        ["bash", "-c", part], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert done.stderr == "" and done.stdout.splitlines()[-1] == "rc=3", done
    marks = [m for m in map(progress_of, done.stdout.splitlines()) if m is not None]
    assert {(m["trial"], m["iteration"]) for m in marks} == {(1, 1), (2, 1), (1, 2), (2, 2)}


def test_a_scripts_own_line_that_looks_like_a_table_is_shown() -> None:
    lines = ["+1 reward this round", "| my table |", "╭ not tune", "+---+", "| tune |"]
    assert shown_lines(lines) == lines[:3]


def test_a_result_line_too_long_to_read_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from provisioner.jobs import tune_watch

    monkeypatch.setattr(tune_watch, "MAX_READ", 64)
    path = tmp_path / "result.json"
    path.write_text('{"x": "' + "y" * 100 + '"}\n{"training_iteration": 7}\n')
    watcher = tune_watch.Watcher(driver=0)
    assert watcher.new_results(str(path)) == []  # the first 64 bytes: no whole line
    rest = [r for _ in range(3) for r in watcher.new_results(str(path))]
    assert rest == [{"training_iteration": 7}]  # the long line's tail is not JSON: skipped
